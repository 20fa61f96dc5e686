"""The batcher's parts on their own, against hand-computed values: strategy default's round size,
strategy stream's planning rate, the skip policy's streak controller and carried-group re-check,
the step metrics."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dapo.batch import Batch
from dapo.config.sampling import FilterGroupsConfig, SkipConfig
from dapo.sampling.skip import SkipPolicy
from dapo.sampling.step_stats import P, StepStats, step_metrics
from dapo.sampling.strategies.default import round_size
from dapo.sampling.strategies.stream import planning_rate


@pytest.mark.parametrize(
    "need, kept_rate, kw, want",
    [
        (4, 0.5, {}, 9),  # ceil(4 * 1.1 / 0.5) = ceil(8.8)
        (8, 0.5, {}, 16),  # ceil(17.6) = 18, capped at gen_batch_size 16
        (1, 1.0, {"min_round_size": 3}, 3),  # ceil(1.1) = 2, raised to min_round_size
        (2, 0.001, {}, 16),  # the rate floored at 0.02: ceil(110), capped
        (2, None, {}, 16),  # no estimate yet: a full round
        (2, 0.5, {"adaptive_rounds": False}, 16),
        (3, 0.25, {"round_margin": 0.0}, 12),
    ],
)
def test_round_size(need, kept_rate, kw, want):
    cfg = FilterGroupsConfig(enable=True, **kw)
    assert round_size(cfg, need, 16, kept_rate) == want


def test_planning_rate():
    assert planning_rate(False, 0.3, 5, 1) == 0.0  # adaptive_rounds off: keep the engine full
    assert planning_rate(True, 0.3, 5, 1) == 0.3  # the estimate from earlier steps
    assert planning_rate(True, None, 0, 0) is None  # nothing yet: stream_refill's optimistic start
    assert planning_rate(True, None, 3, 1) == (1 + 1) / (3 + 1)


def _policy(**kw) -> SkipPolicy:
    strategy = kw.pop("strategy", "default")
    cfg = FilterGroupsConfig(enable=True, strategy=strategy, skip=SkipConfig(**kw))
    return SkipPolicy(cfg, train_batch_size=4, n=2, rng=np.random.default_rng(0))


def test_streak_controller_moves_toward_the_target_within_bounds():
    p = _policy(rule="streak", init_prob=0.5, prob_step=0.2, target=0.1, max_prob=0.8)
    p.adapt(0.5)  # filtered 0.5 > target 0.1: skip more
    assert p.prob == pytest.approx(0.7)
    p.adapt(0.5)
    assert p.prob == pytest.approx(0.8)  # max_prob
    for _ in range(6):
        p.adapt(0.95)  # filtered 0.05 <= target: skip less
    assert p.prob == 0.0 and p.metric_prob() == 0.0
    off = _policy(strategy="verl", init_prob=0.5)
    off.adapt(0.0)
    assert off.prob == 0.5 and off.metric_prob() == 0.0  # verl never skips


def test_solved_since_needs_newer_evidence_above_the_recheck():
    # prompt 2: 1 of 2 right at version 0, then 2 of 2 at version 1, no decay: Beta(3.5, 1.5);
    # P(no spread in 2) = (3.5 * 4.5 + 1.5 * 2.5) / (5 * 6) = 0.65
    def policy(**kw):
        p = _policy(decay=1.0, prior=[0.5, 0.5], **kw)
        p.observe(2, filtered=False, mean=0.5, correct=1, n=2, version=0)
        p.observe(2, filtered=True, mean=1.0, correct=2, n=2, version=1)
        return p

    assert policy().history.zero_spread_prob(2, 1, 2) == pytest.approx(0.65)
    assert policy(recheck=0.6).solved_since(2, gen_version=0, version=1)
    assert not policy(recheck=0.6).solved_since(2, gen_version=1, version=1)  # nothing newer
    assert not policy(recheck=0.7).solved_since(2, gen_version=0, version=1)
    assert not policy(recheck=0.6).solved_since(None, gen_version=0, version=1)
    assert not policy(recheck=0.6, rule="streak").solved_since(2, gen_version=0, version=1)
    assert not policy(recheck=0.6, enable=False).solved_since(2, gen_version=0, version=1)


def test_step_metrics_from_hand_built_counts():
    st = StepStats(gen_version=3, rounds=2, generated_groups=10, generated_tokens=60.0, kept=4)
    st.all_correct, st.all_wrong, st.surplus_dropped, st.stale_dropped = 5, 1, 1, 2
    st.round_sizes = [6, 4]
    st.groups = [
        {"mean": 0.5, "n": 2, "response_lengths": [3, 5]},
        {"mean": 1.0, "n": 2, "response_lengths": [2, 2]},
        {"mean": None, "n": 2},
    ]
    batch = Batch(
        tensors={"response_mask": torch.ones(6, 5)},
        non_tensors={"uid": ["a", "a", "b", "b", "c", "c"], "staleness": [0, 0, 1, 1, 0, 0]},
    )
    kw = dict(pooled=2, skip_prob=0.25, kept_rate=None, version=3, stream=False, band=None, epoch=None)
    m = step_metrics(st, batch, "train", target=4, **kw)
    assert m["train/num_gen_batches"] == 2 and m[P + "filtered_groups"] == 6
    assert m[P + "qualified_ratio"] == 0.4 and m[P + "trained_groups"] == 3
    assert m[P + "partial_step"] == 1.0  # 3 of 4
    assert m[P + "surplus_dropped"] == 3 and m[P + "surplus_carried"] == 2
    assert m[P + "gen_tokens_per_train_token"] == 60.0 / 30.0
    assert m[P + "round_prompts_mean"] == 5.0 and m[P + "kept_rate_estimate"] == 0.0
    assert m["train/acc_generated"] == 0.75  # (0.5 * 2 + 1.0 * 2) / 4, the ungraded group left out
    assert m[P + "staleness_mean"] == pytest.approx(1 / 3) and m[P + "staleness_max"] == 1.0
    # trained: six rows of 5 tokens; finished: (3 + 5 + 2 + 2) / 4, the group without lengths left out
    assert m[P + "trained_response_length_mean"] == 5.0 and m[P + "finished_response_length_mean"] == 3.0
    assert not any(k.startswith((P + "band", P + "aborted", P + "epoch")) for k in m)
    # filtering off: never a partial step; stream, band and an int epoch add their keys
    m = step_metrics(
        st, batch, "train", target=None, **{**kw, "stream": True, "band": (0.2, 0.7), "epoch": 1}
    )
    assert m[P + "partial_step"] == 0.0
    assert (m[P + "band_low"], m[P + "band_high"], m[P + "epoch"]) == (0.2, 0.7, 1)
    assert m[P + "aborted_groups"] == 0 and m[P + "stream_refills"] == 0 and m[P + "drained_groups"] == 0
    skipped = step_metrics(st, None, "skip", target=4, **kw)
    assert skipped[P + "skipped_step"] == 1.0 and skipped[P + "trained_groups"] == 0
    assert skipped[P + "partial_step"] == 0.0 and skipped[P + "staleness_max"] == 0.0
    assert skipped[P + "trained_response_length_mean"] == 0.0
