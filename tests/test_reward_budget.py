"""The step's scoring budget and the worker memory cap: slow or greedy reward functions are
scored as failures and counted, and the pool goes on. Counts and scores only, never wall time."""

from __future__ import annotations

import time

import pytest
import torch

from dapo.config.schema import ScoringConfig
from dapo.reward.manager import DAPORewardManager
from dapo.reward.pool import ERROR, OK, TIMEOUT, ScoringPool
from fixtures.config_helpers import config_problems
from fixtures.reward_helpers import CharTokenizer, make_batch, scorer_from_source

torch.set_num_threads(1)

SLOW_AND_GREEDY = """
    import resource, time

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        if solution_str == "slow":
            time.sleep(100000)  # far beyond any budget in these tests
        if solution_str == "greedy":
            block = bytearray(1 << 30)  # 1 GiB, zero-filled: fits the machine, not the cap
            return {"score": 5.0, "acc": len(block) > 0}
        if solution_str == "limit":
            return {"score": float(resource.getrlimit(resource.RLIMIT_AS)[0]), "acc": True}
        return {"score": 1.0 if solution_str == ground_truth else 0.0, "acc": solution_str == ground_truth}
"""


@pytest.fixture()
def ref(tmp_path):
    return scorer_from_source(tmp_path, "slow_and_greedy", SLOW_AND_GREEDY)


def _samples(texts):
    return [{"data_source": "x", "solution_str": t, "ground_truth": "ok", "extra_info": {}} for t in texts]


def test_step_budget_scores_unfinished_samples_as_timeouts_and_counts_them(ref):
    texts = ["ok", "slow", "ok", "slow", "no", "ok"]
    mgr = DAPORewardManager(
        CharTokenizer(),
        ref,
        # the per-sample timeout is far away: only the step budget can end this batch
        scoring={"mode": "process", "timeout_s": 3600.0, "step_timeout_s": 2.0, "num_workers": 2},
    )
    try:
        out = mgr(make_batch(texts, ["ok"] * len(texts), data_source="anything"))
        info = out.reward_extra_info
        timed_out = [i for i, p in enumerate(info["pred"]) if p == "[TIMEOUT]"]
        assert {1, 3} <= set(timed_out)  # the slow ones cannot finish
        assert out.metrics["reward/timeouts"] == len(timed_out)
        assert out.metrics["reward/errors"] == 0
        for i, text in enumerate(texts):
            expected = -1.0 if i in timed_out else (1.0 if text == "ok" else 0.0)
            assert info["score"][i] == expected
            assert info["acc"][i] == (expected == 1.0)
        assert out.token_level_scores.sum(-1).tolist() == info["score"]
    finally:
        mgr.close()


def test_pool_deadline_expires_every_unfinished_sample_and_the_pool_goes_on(ref):
    with ScoringPool(num_workers=2, timeout_s=3600.0) as pool:
        # a deadline already past: nothing is scored, every sample is a timeout
        results = pool.map(ref, _samples(["ok", "no", "ok"]), deadline=time.monotonic())
        assert [s for s, _ in results] == [TIMEOUT] * 3
        assert all("step_timeout_s" in v for _, v in results)
        # a budget that the slow samples overrun: they are timeouts, whatever ran in time is scored
        results = pool.map(ref, _samples(["slow", "ok", "slow", "ok"]), deadline=time.monotonic() + 1.0)
        assert results[0][0] == TIMEOUT and results[2][0] == TIMEOUT
        assert all(r == (OK, {"score": 1.0, "acc": True}) or r[0] == TIMEOUT for r in results)
        # no deadline: the same pool scores the next batch in full
        results = pool.map(ref, _samples(["ok", "no", "ok", "no"]))
        assert [v["score"] for _, v in results] == [1.0, 0.0, 1.0, 0.0]


def test_worker_memory_cap_turns_a_huge_allocation_into_a_failure(ref):
    limit_mb = 256
    with ScoringPool(num_workers=1, timeout_s=3600.0, memory_limit_mb=limit_mb) as pool:
        results = pool.map(ref, _samples(["limit", "greedy", "ok", "greedy", "no"]))
        assert results[0] == (OK, {"score": float(limit_mb << 20), "acc": True})
        for status, value in (results[1], results[3]):
            assert status == ERROR and "MemoryError" in value
        assert results[2] == (OK, {"score": 1.0, "acc": True}) and results[4][1]["score"] == 0.0
        assert pool.restarts == 0  # the worker caught its MemoryError and went on


def test_memory_cap_reaches_the_workers_from_the_config_and_scores_failures(ref):
    mgr = DAPORewardManager(
        CharTokenizer(), ref, scoring={"mode": "process", "memory_limit_mb": 256, "failure_score": -2.0}
    )
    try:
        out = mgr(make_batch(["greedy", "ok", "limit"], ["ok"] * 3, data_source="anything"))
        assert out.reward_extra_info["score"][:2] == [-2.0, 1.0]
        assert out.reward_extra_info["score"][2] == float(256 << 20)
        assert out.metrics["reward/errors"] == 1
    finally:
        mgr.close()


def test_scoring_config_defaults_and_bad_values():
    cfg = ScoringConfig()
    assert cfg.step_timeout_s is None and cfg.memory_limit_mb == 8192
    with pytest.raises(ValueError, match="reward_model.scoring.step_timeout_s"):
        DAPORewardManager(CharTokenizer(), scoring=ScoringConfig(step_timeout_s=0))
    (p,) = config_problems("reward_model.scoring.memory_limit_mb=-1")
    assert p.startswith("reward_model.scoring.memory_limit_mb: must be >= 0")
