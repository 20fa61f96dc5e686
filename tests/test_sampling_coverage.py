"""Coverage figures against hand counts."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dapo.sampling.coverage import C, coverage_metrics, top_share


def test_top_share_hand_values():
    # pool 20: the top ceil(0.1 * 20) = 2 prompts took 9 + 5 of 20 trained groups
    assert top_share([9, 5, 3, 2, 1, 0, 0], 20) == pytest.approx(14 / 20)
    # pool 100, ten prompts trained twice each: the top 10 are all of them
    assert top_share([2] * 10, 100) == 1.0
    # even training over the whole pool: a tenth of the groups
    assert top_share([1] * 50, 50) == pytest.approx(5 / 50)
    assert top_share([], 10) == 0.0 and top_share([0, 0], 10) == 0.0
    assert top_share([3, 1], 1) == pytest.approx(3 / 4)  # at least one prompt


@given(st.lists(st.integers(0, 50), max_size=60), st.integers(1, 200))
def test_top_share_is_a_share_that_grows_with_concentration(counts, pool):
    s = top_share(counts, pool)
    assert 0.0 <= s <= 1.0
    if sum(counts):
        k = -(-pool // 10)
        assert s >= min(1.0, k / max(1, sum(1 for c in counts if c))) - 1e-12  # never below even


def test_coverage_metrics_hand_counted():
    m = coverage_metrics(rolled_out=7, trained_counts=[4, 0, 1, 1, 0, 2], skipped_with_spread=3, pool_size=30)
    assert m == {
        C + "rolled_out_prompts": 7.0,
        C + "trained_prompts": 4.0,
        C + "skipped_with_spread": 3.0,
        C + "top10_trained_share": pytest.approx((4 + 2 + 1) / 8),  # ceil(3) prompts of 30
        C + "never_rolled_out": 23.0,
    }
    # without the pool's size: the tenth is of the prompts rolled out, no never_rolled_out
    m = coverage_metrics(rolled_out=7, trained_counts=[4, 1, 1], skipped_with_spread=0, pool_size=None)
    assert C + "never_rolled_out" not in m
    assert m[C + "top10_trained_share"] == pytest.approx(4 / 6)


def _scripted_batcher():
    from dapo.config.sampling import FilterGroupsConfig, SkipConfig
    from dapo.sampling import DynamicBatcher
    from dapo.sampling.fakes import FakeRollout, ListSource, prompt_rows, scripted

    # spread always: 0, 4, 6; solved: 1, 5; hopeless: 2; 3 spreads once (3 of 4 right), then solved
    table = {
        0: [[0, 1, 0, 1]],
        1: [[1, 1, 1, 1]],
        2: [[0, 0, 0, 0]],
        3: [[0, 1, 1, 1], [1, 1, 1, 1]],
        4: [[1, 0, 0, 1]],
        5: [[1, 1, 1, 1]],
        6: [[0, 1, 0, 1]],
    }
    c = FilterGroupsConfig(
        enable=True,
        adaptive_rounds=False,
        skip=SkipConfig(rule="posterior", threshold=0.3, max_explore=0.0, decay=1.0),
    )
    b = DynamicBatcher(c, 2, 3, 4, 0)
    return b, ListSource(prompt_rows(7), shuffle=False), FakeRollout(4, scripted(table))


def test_batcher_coverage_hand_counted():
    # P(no spread in 4) under Jeffreys: 2 of 4 right once, Beta(2.5, 2.5): 0.258 (rolled out);
    # 3 of 4 once, Beta(3.5, 1.5): 0.370 (>= 0.3: skipped although its group had spread);
    # 4 of 4 or 0 of 4 once: 0.722 (skipped)
    b, src, gen = _scripted_batcher()
    s1 = b.next_batch(src, gen)
    # rounds 0,1,2 (only 0 kept) and 3,4,5 (3, 4 kept): trains 0 and 3, carries 4; 6 never drawn
    assert s1.batch.non_tensors["index"].tolist()[::4] == [0, 3]
    assert {k.removeprefix(C): v for k, v in s1.metrics.items() if k.startswith(C)} == {
        "rolled_out_prompts": 6.0,
        "trained_prompts": 2.0,
        "skipped_with_spread": 0.0,
        "top10_trained_share": 0.5,  # ceil(0.7) = 1 prompt of the 7 took 1 of the 2 groups
        "never_rolled_out": 1.0,
    }
    s2 = b.next_batch(src, gen)
    # one round: 6 (new) and 0 rolled out, 1 and 2 skipped (solved, hopeless), 3 skipped against
    # its spread, 4 rolled out; the batch is the carried 4 and the fresh 6
    assert s2.batch.non_tensors["index"].tolist()[::4] == [4, 6]
    assert s2.metrics["dynamic_sampling/skipped_prompts"] == 3
    assert {k.removeprefix(C): v for k, v in s2.metrics.items() if k.startswith(C)} == {
        "rolled_out_prompts": 7.0,
        "trained_prompts": 4.0,
        "skipped_with_spread": 1.0,
        "top10_trained_share": 0.25,  # 0, 3, 4 and 6 once each
        "never_rolled_out": 0.0,
    }
    assert b.trained_counts == {0: 1, 3: 1, 4: 1, 6: 1}


def test_coverage_state_resumes_exactly():
    import json

    from dapo.checkpoint import store as checkpoint
    from dapo.config.sampling import FilterGroupsConfig
    from dapo.sampling import DynamicBatcher
    from dapo.sampling.fakes import FakeRollout, ListSource, bernoulli, prompt_rows

    probs = [0.0, 1.0, 0.5, 0.9, 0.3, 0.97, 0.6, 0.05] * 4

    def make():
        b = DynamicBatcher(FilterGroupsConfig(enable=True), 3, 8, 4, 1)
        return b, ListSource(prompt_rows(32), seed=2), FakeRollout(4, bernoulli(lambda r: probs[r["index"]]))

    b, src, gen = make()
    for _ in range(6):
        b.next_batch(src, gen)
    tensors: dict = {}
    plain = checkpoint._extract(b.state_dict(), {}, tensors, "")
    state = checkpoint._insert(json.loads(json.dumps(plain)), {}, tensors)
    src_state, rng_state = src.state_dict(), gen.rng.bit_generator.state
    ref = [b.next_batch(src, gen).metrics for _ in range(6)]
    assert ref[-1][C + "skipped_with_spread"] >= 0 and ref[-1][C + "trained_prompts"] > 3

    b2, src2, gen2 = make()
    b2.load_state_dict(state)
    src2.load_state_dict(src_state)
    gen2.rng.bit_generator.state = rng_state
    assert b2.trained_counts == {int(k): v for k, v in plain["trained_counts"].items()} != {}
    assert [b2.next_batch(src2, gen2).metrics for _ in range(6)] == ref
    # a checkpoint from before the coverage figures: the counts start again, nothing breaks
    state.pop("trained_counts")
    b2.load_state_dict(state)
    assert b2.trained_counts == {}
