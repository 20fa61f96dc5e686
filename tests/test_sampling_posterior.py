"""The solve-rate posterior (Beta-Bernoulli, decayed) and the posterior skip rule."""

from math import comb

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo.sampling import posterior
from dapo.sampling.history import PromptHistory

pos = st.floats(0.05, 50.0)


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


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 4), min_size=1, max_size=30),
    st.integers(0, 6),
    st.floats(0.01, 0.9),
    st.floats(0.0, 0.999),
    st.integers(0, 2**31 - 1),
)
def test_posterior_rule_never_skips_past_the_revisit_bound(
    groups, max_consecutive, threshold, max_prob, seed
):
    h = PromptHistory(prior=(0.5, 0.5), decay=0.97)
    rng = np.random.default_rng(seed)
    version = 0
    for k in groups:  # a prompt solved k of 4 times, then drawn until it is rolled out again
        h.record(0, filtered=k in (0, 4), mean=k / 4, correct=k, n=4, version=version)
        in_a_row = 0
        while h.should_skip_posterior(
            0,
            prob=threshold,
            max_prob=max_prob,
            max_consecutive=max_consecutive,
            version=version,
            n=4,
            rng=rng,
        ):
            in_a_row += 1
            assert in_a_row <= max_consecutive
        version += 1
    assert not h.should_skip_posterior(
        1, prob=threshold, max_prob=max_prob, max_consecutive=5, version=version, n=4, rng=rng
    )  # never a prompt without history


def test_solved_prompt_is_skipped_and_a_useful_one_is_not():
    h = PromptHistory(prior=(0.5, 0.5), decay=0.97)
    h.record(0, filtered=False, mean=7 / 8, correct=7, n=8, version=0)
    h.record(0, filtered=True, mean=1.0, correct=8, n=8, version=1)  # solved since its last kept group
    h.record(1, filtered=False, mean=0.5, correct=4, n=8, version=1)
    rng = np.random.default_rng(0)
    kw = dict(prob=0.1, max_prob=0.998, max_consecutive=64, version=2, n=8, rng=rng)
    assert sum(h.should_skip_posterior(0, **kw) for _ in range(50)) >= 45
    assert not any(h.should_skip_posterior(1, **kw) for _ in range(50))


def test_state_round_trip_and_old_records():
    h = PromptHistory(prior=(0.5, 0.5), decay=0.9)
    h.record(3, filtered=True, mean=1.0, correct=8, n=8, version=4)
    back = PromptHistory.from_state_dict(h.state_dict(), (0.5, 0.5), 0.9)
    assert back.records == h.records
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
        enable=True, adaptive_rounds=False, skip=SkipConfig(threshold=1.0, recheck=recheck)
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
