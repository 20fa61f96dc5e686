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
