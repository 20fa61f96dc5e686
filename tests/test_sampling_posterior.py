"""The solve-rate posterior (Beta-Bernoulli, decayed) and the posterior skip rule."""

from math import comb

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo.sampling import posterior
from dapo.sampling.history import PromptHistory, revisit_bound

pos = st.floats(0.05, 50.0)
# the hand values of the draw tests below: Jeffreys' prior, threshold 0.2, no minimum evidence
JEFFREYS_02 = {"prior": [0.5, 0.5], "threshold": 0.2, "min_evidence": 0.0}


def test_zero_spread_prob_hand_values():
    # uniform prior, n=8: E[p^8] = 1/9 each side
    assert posterior.zero_spread_prob(1.0, 1.0, 8) == pytest.approx(2 / 9)
    # Beta(9, 1) (one all-right group on a uniform prior): E[p^8] = 9/17, E[(1-p)^8] = 8! 9! / 17!
    ref = 9 / 17 + 1 / comb(17, 8)
    assert posterior.zero_spread_prob(9.0, 1.0, 8) == pytest.approx(ref)
    assert posterior.zero_spread_prob(3.0, 4.0, 1) == 1.0  # one sample never has spread


@settings(max_examples=30, deadline=None)
@given(st.floats(0.3, 30.0), st.floats(0.3, 30.0), st.integers(2, 16))
def test_zero_spread_prob_matches_monte_carlo(a, b, n):
    p = np.random.default_rng(0).beta(a, b, 50_000)
    mc = float(np.mean(p**n + (1 - p) ** n))
    assert posterior.zero_spread_prob(a, b, n) == pytest.approx(mc, abs=0.015)


@given(pos, pos, st.integers(1, 16), st.data())
def test_posterior_is_monotone_in_evidence(a, b, n, data):
    k1 = data.draw(st.integers(0, n))
    k2 = data.draw(st.integers(k1, n))
    # more right answers in a group: a higher posterior mean and a higher E[p^n]
    lo, hi = posterior.observe(a, b, k1, n), posterior.observe(a, b, k2, n)
    assert posterior.mean(*hi) >= posterior.mean(*lo)
    assert posterior._moment(*hi, n) >= posterior._moment(*lo, n) - 1e-12
    # an all-right group on a prompt already mostly solved makes no spread more likely
    if a >= b:
        assert posterior.zero_spread_prob(*posterior.observe(a, b, n, n), n) >= (
            posterior.zero_spread_prob(a, b, n) - 1e-12
        )


@given(pos, pos, st.floats(0.5, 1.0), st.integers(0, 50))
def test_decay_moves_toward_the_prior(a, b, decay, updates):
    prior = (0.5, 0.5)
    da, db = posterior.decayed(a, b, updates, decay, prior)
    # between the prior and the evidence, coordinate-wise
    assert min(a, prior[0]) - 1e-9 <= da <= max(a, prior[0]) + 1e-9
    assert min(b, prior[1]) - 1e-9 <= db <= max(b, prior[1]) + 1e-9
    more = posterior.decayed(a, b, updates + 1, decay, prior)
    assert abs(more[0] - prior[0]) <= abs(da - prior[0]) + 1e-9
    assert posterior.decayed(a, b, updates, 1.0, prior) == (a, b)


def test_revisit_bound_is_staggered_by_the_golden_ratio():
    # frac(i * 0.618...) for i = 0..3: 0, 0.618, 0.236, 0.854; the bound is K - floor(frac * K / 2)
    assert [revisit_bound(i, 10) for i in range(4)] == [10, 7, 9, 6]
    assert revisit_bound(5, 0) == 0 and revisit_bound(5, 1) == 1


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 4), st.integers(0, 5), st.integers(1, 6)), min_size=1, max_size=20),
    st.integers(0, 12),
    st.integers(0, 200),
    st.floats(0.01, 0.9),
    st.floats(0.0, 0.999),
    st.integers(0, 2**31 - 1),
)
def test_posterior_rule_never_skips_past_the_revisit_bound(
    groups, max_updates, index, threshold, max_prob, seed
):
    # a prompt solved k of 4 times, then drawn `draws` times per update for a while until it is
    # rolled out again: never skipped once its last rollout is max_updates or more updates old
    h = PromptHistory(prior=(0.5, 0.5), decay=0.97)
    rng = np.random.default_rng(seed)
    version = 0
    own = revisit_bound(index, max_updates)
    assert max_updates / 2 < own <= max_updates or own == max_updates == 0
    for k, wait, draws in groups:
        h.record(index, filtered=k in (0, 4), mean=k / 4, correct=k, n=4, version=version)
        rolled = version
        for version in range(rolled, rolled + wait + max_updates + 1):
            kw = dict(
                prob=threshold, max_prob=max_prob, max_updates=max_updates, version=version, n=4, rng=rng
            )
            if any(not h.should_skip_posterior(index, **kw) for _ in range(draws)):
                break  # rolled out: a new group follows
            assert version - rolled < own <= max_updates
        else:
            pytest.fail("never rolled out")
    assert not h.should_skip_posterior(
        index + 1, prob=threshold, max_prob=max_prob, max_updates=5, version=version, n=4, rng=rng
    )  # never a prompt without history


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 30),
    st.integers(1, 40),
    st.booleans(),
    st.sets(st.integers(0, 29), max_size=4),
    st.integers(0, 2**31 - 1),
)
def test_draw_terminates_when_every_prompt_is_skipped(num, k, unindexed, useful, seed):
    # every prompt solved (P(no spread) near 1, far above the threshold) but for a few (4/8
    # once: rolled out), no exploration and a revisit bound far away: the pass skips nearly
    # everything, yet draw returns k rows; a pass fills the round from its own prompts, so rows
    # taken stay within a small multiple of pool + round (walking on would take a pass per
    # useful prompt rolled out: about k / len(useful) passes)
    from dapo.config.sampling import FilterGroupsConfig, SkipConfig
    from dapo.sampling import DynamicBatcher
    from dapo.sampling.fakes import ListSource, prompt_rows

    c = FilterGroupsConfig(
        enable=True, skip=SkipConfig(rule="posterior", max_prob=0.999, max_explore=0.0, revisit_epochs=1000)
    )
    b = DynamicBatcher(c, 1, k, 8, seed)
    for i in range(num):
        if i in useful:
            b.history.record(i, filtered=False, mean=0.5, correct=4, n=8, version=0)
        else:
            b.history.record(i, filtered=True, mean=1.0, correct=8, n=8, version=0)
    rows = prompt_rows(num)
    if unindexed:
        rows[0]["index"] = None
    src = ListSource(rows, seed=seed)
    chosen, skipped = b.skip.draw(src, k, b.version)
    assert len(chosen) == k
    assert src.taken <= 2 * (num + k)  # reshuffled epochs may cut a pass short
    rolled_twice = len(chosen) - len({id(r) for r in chosen})
    assert src.taken == len(chosen) - rolled_twice + skipped


def _draw_with_budget(max_explore: float) -> list[int]:
    # prompts 0..89 solved (8/8 once: Beta(8.5, 0.5), P(no spread in 8) = prod (8.5 + j) / (9 + j)
    # + prod (0.5 + j) / (9 + j) over j < 8 = 0.7127 >= 0.2), 90..99 useful (4/8: 0.045): unshuffled,
    # one draw of 10 meets the 90 solved ones first. With max_prob=0 each explores with probability
    # (1 - 0.7127) / 0.8 = 0.36, so ~32 would without a cap.
    from dapo.config.sampling import FilterGroupsConfig, SkipConfig
    from dapo.sampling import DynamicBatcher
    from dapo.sampling.fakes import ListSource, prompt_rows

    c = FilterGroupsConfig(
        enable=True,
        skip=SkipConfig(
            rule="posterior", max_prob=0.0, init_prob=0.0, max_explore=max_explore, **JEFFREYS_02
        ),
    )
    b = DynamicBatcher(c, 1, 10, 8, 0)
    for i in range(100):
        b.history.record(i, filtered=i < 90, mean=1.0 if i < 90 else 0.5, correct=8 if i < 90 else 4, n=8)
    assert b.history.zero_spread_prob(0, 0, 8) == pytest.approx(0.71266, abs=1e-5)
    chosen, _ = b.skip.draw(ListSource(prompt_rows(100), shuffle=False), 10, b.version)
    return [r["index"] for r in chosen]


def test_exploring_rollouts_are_capped_per_round():
    # max_explore * k = 0.1 * 10 = 1 exploring rollout at most (floor(1 + u), u < 1); 0: none
    capped = _draw_with_budget(0.1)
    assert sum(i < 90 for i in capped) == 1 and capped[1:] == list(range(90, 99))
    assert _draw_with_budget(0.0) == list(range(90, 100))
    assert sum(i < 90 for i in _draw_with_budget(1.0)) == 10


def test_solved_prompt_is_skipped_and_a_useful_one_is_not():
    h = PromptHistory(prior=(0.5, 0.5), decay=0.97)
    h.record(0, filtered=False, mean=7 / 8, correct=7, n=8, version=0)
    h.record(0, filtered=True, mean=1.0, correct=8, n=8, version=1)  # solved since its last kept group
    h.record(1, filtered=False, mean=0.5, correct=4, n=8, version=1)
    rng = np.random.default_rng(0)
    kw = dict(prob=0.1, max_prob=0.998, max_updates=64, version=2, n=8, rng=rng)
    assert sum(h.should_skip_posterior(0, **kw) for _ in range(50)) >= 45
    assert not any(h.should_skip_posterior(1, **kw) for _ in range(50))


def test_state_round_trip_and_old_records():
    h = PromptHistory(prior=(0.5, 0.5), decay=0.9)
    h.record(3, filtered=True, mean=1.0, correct=8, n=8, version=4)
    h.record(3, filtered=False, mean=0.5, correct=4, n=8, version=7)
    h.records[3].skips = 2
    back = PromptHistory.from_state_dict(h.state_dict(), (0.5, 0.5), 0.9)
    assert back.records == h.records and back.records[3].seen == 7
    # a record saved before `seen` existed takes its newest evidence's version as its last rollout
    row = h.state_dict()["3"][:8]
    assert PromptHistory.from_state_dict({"3": row}, (0.5, 0.5), 0.9).records[3].seen == 7
    # a record saved before the posterior existed starts at the prior
    old = PromptHistory.from_state_dict({"3": [2, 0, 5, 1, 1.0]}, (0.5, 0.5), 0.9)
    assert (old.records[3].alpha, old.records[3].beta, old.records[3].streak) == (0.5, 0.5, 2)


def _recheck_run(recheck: float):
    from dapo.config.sampling import FilterGroupsConfig, SkipConfig
    from dapo.sampling import DynamicBatcher
    from dapo.sampling.fakes import FakeRollout, ListSource, prompt_rows, scripted

    # prompt 2 spreads once, then is all right: its carried group is stale evidence by step 2
    table = {0: [[0, 1]], 1: [[0, 1]], 2: [[0, 1], [1, 1]]}
    c = FilterGroupsConfig(
        enable=True, adaptive_rounds=False, skip=SkipConfig(rule="posterior", threshold=1.0, recheck=recheck)
    )
    b = DynamicBatcher(c, 2, 3, 2, 0)
    src, gen = ListSource(prompt_rows(3), shuffle=False), FakeRollout(2, scripted(table))
    s1 = b.next_batch(src, gen)
    assert s1.metrics["dynamic_sampling/surplus_carried"] == 1  # prompt 2's group
    s2 = b.next_batch(src, gen)
    return s2.batch.non_tensors["index"].tolist(), s2.metrics


def test_carried_group_of_a_prompt_solved_since_is_dropped_before_training():
    # prompt 2's posterior after [0, 1] then [1, 1]: Beta(3.5, 1.5), P(no spread in 2) = 0.65
    idx, m = _recheck_run(recheck=0.6)
    assert idx == [0, 0, 1, 1] and m["dynamic_sampling/recheck_dropped"] == 1
    idx, m = _recheck_run(recheck=0.7)
    assert idx == [2, 2, 0, 0] and m["dynamic_sampling/recheck_dropped"] == 0


@pytest.mark.parametrize("rule, skips", [("posterior", True), ("streak", False)])
def test_posterior_rule_skips_whatever_the_streak_controller_says(rule, skips):
    # skip_prob (the streak rule's controller) falls to 0 once the filtered fraction is below
    # skip.target: with init_prob=0 it is 0 from the start. The streak rule then skips nothing;
    # the posterior rule still skips prompt 0, which is always solved (Beta(4.5, 0.5) after one
    # group: P(no spread in 4) = E[p^4] + E[(1-p)^4] = 0.722 >= threshold 0.5), and rolls
    # out prompts 1-3 (after one group 0.26, 0.37, 0.37 < 0.5).
    from dapo.config.sampling import FilterGroupsConfig, SkipConfig
    from dapo.sampling import DynamicBatcher
    from dapo.sampling.fakes import FakeRollout, ListSource, prompt_rows, scripted

    table = {0: [[1, 1, 1, 1]], 1: [[0, 1, 0, 1]], 2: [[1, 0, 0, 0]], 3: [[0, 1, 1, 1]]}
    drawn: list[int] = []
    acc = scripted(table)

    def fn(row, n, rng):
        drawn.append(row["index"])
        return acc(row, n, rng)

    c = FilterGroupsConfig(
        enable=True,
        adaptive_rounds=False,
        skip=SkipConfig(rule=rule, threshold=0.5, init_prob=0.0, prob_step=0.0),
    )
    b = DynamicBatcher(c, 3, 4, 4, 0)
    src, gen = ListSource(prompt_rows(4), shuffle=False), FakeRollout(4, fn)
    skipped = sum(b.next_batch(src, gen).metrics["dynamic_sampling/skipped_prompts"] for _ in range(4))
    assert b.skip_prob == 0.0
    assert (drawn.count(0) == 1 and skipped >= 3) if skips else (drawn.count(0) == 4 and skipped == 0)


def test_a_skipped_pass_rolls_out_the_prompt_likeliest_to_spread():
    # P(no spread in 8): prompt 0 (8/8 twice, Beta(16.5, 0.5)) 0.82, prompt 1 (0/8, Beta(0.5, 8.5))
    # 0.71, prompt 2 (7/8, Beta(7.5, 1.5)) prod (7.5 + j) / (9 + j) + prod (1.5 + j) / (9 + j) = 0.345:
    # all above the threshold 0.2 and no exploring; a pass skips 0, 1, 2, meets 0 again and rolls
    # out prompt 2
    from dapo.config.sampling import FilterGroupsConfig, SkipConfig
    from dapo.sampling import DynamicBatcher
    from dapo.sampling.fakes import ListSource, prompt_rows

    b = DynamicBatcher(
        FilterGroupsConfig(enable=True, skip=SkipConfig(rule="posterior", max_explore=0.0, **JEFFREYS_02)),
        1,
        1,
        8,
        0,
    )
    for i, k in ((0, 8), (0, 8), (1, 0), (2, 7)):
        b.history.record(i, filtered=k in (0, 8), mean=k / 8, correct=k, n=8)
    assert b.history.zero_spread_prob(2, 0, 8) == pytest.approx(0.34509, abs=1e-5)
    src = ListSource(prompt_rows(3), shuffle=False)
    chosen, skipped = b.skip.draw(src, 1, b.version)
    assert [r["index"] for r in chosen] == [2] and skipped == 3 and src.taken == 4


def test_later_draws_of_a_step_fill_from_a_skipped_pass_without_walking_the_pool():
    # ten solved prompts, prompt i seen i+1 times at 8/8 (the fewer groups, the likelier to
    # spread): the first draw of 2 takes rows two at a time, walks the whole pass (10 skipped),
    # meets prompt 0 again in the sixth pair and fills with the two likeliest (0, 1); that pair's
    # second row is not rolled out either (12 taken = 2 rolled out + 10); the next draws of the same step and version take
    # 2, 3 and then 4, 5 from what is left of that pass without taking a row; a new step walks again
    from dapo.config.sampling import FilterGroupsConfig, SkipConfig
    from dapo.sampling import DynamicBatcher
    from dapo.sampling.fakes import ListSource, prompt_rows

    b = DynamicBatcher(
        FilterGroupsConfig(enable=True, skip=SkipConfig(rule="posterior", max_explore=0.0)), 1, 2, 8, 0
    )
    for i in range(10):
        for _ in range(i + 1):
            b.history.record(i, filtered=True, mean=1.0, correct=8, n=8)
    q = [b.history.zero_spread_prob(i, 0, 8) for i in range(10)]
    assert q == sorted(q) and q[0] >= 0.35  # every prompt a skip candidate, 0 the likeliest to spread
    src = ListSource(prompt_rows(10), shuffle=False)
    b.skip.new_step()
    chosen, skipped = b.skip.draw(src, 2, b.version)
    assert [r["index"] for r in chosen] == [0, 1] and src.taken == 12 and skipped == 10
    for want in ([2, 3], [4, 5]):
        chosen, skipped = b.skip.draw(src, 2, b.version)
        assert [r["index"] for r in chosen] == want and src.taken == 12 and skipped == 0
    b.skip.new_step()
    chosen, skipped = b.skip.draw(src, 2, b.version)
    assert [r["index"] for r in chosen] == [0, 1] and src.taken == 24


def test_a_carried_group_dropped_by_the_recheck_is_replaced_in_the_same_step():
    from dapo.config.sampling import FilterGroupsConfig, SkipConfig
    from dapo.sampling import DynamicBatcher
    from dapo.sampling.fakes import FakeRollout, ListSource, prompt_rows, scripted

    # step 1 keeps prompts 0 and 1 and carries prompt 2's group. Step 2, round 1: nothing spreads
    # and prompt 2 comes back all right (P(no spread) 0.65 >= 0.6: its carried group is dropped);
    # round 2 keeps only prompt 0. The batch must still hold 2 groups: a third round keeps prompt 1.
    table = {
        0: [[0, 1], [0, 0], [0, 1], [0, 0]],
        1: [[0, 1], [0, 0], [0, 0], [0, 1]],
        2: [[0, 1], [1, 1], [1, 1], [1, 1]],
    }
    c = FilterGroupsConfig(
        enable=True, adaptive_rounds=False, skip=SkipConfig(rule="posterior", threshold=1.0, recheck=0.6)
    )
    b = DynamicBatcher(c, 2, 3, 2, 0)
    src, gen = ListSource(prompt_rows(3), shuffle=False), FakeRollout(2, scripted(table))
    assert b.next_batch(src, gen).metrics["dynamic_sampling/surplus_carried"] == 1
    s2 = b.next_batch(src, gen)
    assert s2.metrics["dynamic_sampling/recheck_dropped"] == 1
    assert s2.metrics["dynamic_sampling/rounds"] == 3
    assert s2.batch.non_tensors["index"].tolist() == [0, 0, 1, 1]
    assert s2.metrics["dynamic_sampling/partial_step"] == 0.0


def test_a_pass_that_rolls_out_a_few_fills_the_round_from_the_pass_instead_of_walking_on():
    # prompts 0-8 solved (prompt i seen i+1 times at 8/8), prompt 9 half right (4/8 once): a round
    # of 4 takes rows four at a time; the pass skips 0-8 and rolls out 9; prompt 0 comes round in
    # the third batch (10 draws, 10 prompts with a history) and the round is filled from the pass
    # by likeliest to spread: 9 once more, then 0 and 1. Walking on would have rolled out 9 on
    # every further pass and taken 30 rows for this round. The batch's last row (1) is not rolled
    # out: 12 rows taken, 3 of them rolled out, 9 skipped (0-8 and both draws of 0 and 1, less the
    # two filled). The next draw of the step takes 2 and 3 from what is left of the pass.
    from dapo.config.sampling import FilterGroupsConfig, SkipConfig
    from dapo.sampling import DynamicBatcher
    from dapo.sampling.fakes import ListSource, prompt_rows

    b = DynamicBatcher(
        FilterGroupsConfig(enable=True, skip=SkipConfig(rule="posterior", max_explore=0.0)), 1, 4, 8, 0
    )
    for i in range(9):
        for _ in range(i + 1):
            b.history.record(i, filtered=True, mean=1.0, correct=8, n=8)
    b.history.record(9, filtered=False, mean=0.5, correct=4, n=8)
    q = [b.history.zero_spread_prob(i, 0, 8) for i in range(10)]
    assert q[9] < 0.2 <= q[0] and q[:9] == sorted(q[:9])
    src = ListSource(prompt_rows(10), shuffle=False)
    b.skip.new_step()
    chosen, skipped = b.skip.draw(src, 4, b.version)
    assert [r["index"] for r in chosen] == [9, 9, 0, 1] and src.taken == 12 and skipped == 9
    chosen, skipped = b.skip.draw(src, 2, b.version)
    assert [r["index"] for r in chosen] == [2, 3] and src.taken == 12 and skipped == 0
