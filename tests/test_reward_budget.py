"""The step's scoring budget and the worker memory cap: slow or greedy reward functions are
scored as failures and counted, and the pool goes on. Counts and scores only, never wall time."""

from __future__ import annotations

import time

import pytest
import torch

from dapo.config.schema import ScoringConfig
from dapo.reward.manager import DAPORewardManager, RewardObjective, step_budget_s
from dapo.reward.pool import ERROR, OK, TIMEOUT, ScoringPool
from fixtures.config_helpers import config_problems
from fixtures.reward_helpers import CharTokenizer, make_batch, scorer_from_source

torch.set_num_threads(1)

SLOW_AND_GREEDY = """
    import resource, time

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        if solution_str == "slow":
            time.sleep(100000)  # far beyond any budget in these tests
        if solution_str == "slowish":
            time.sleep(20)  # beyond the budgets below; without one the call ends, scored 2.0
            return {"score": 2.0, "acc": True}
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
    assert cfg.step_timeout_s == "auto" and cfg.memory_limit_mb == 8192
    assert (cfg.step_timeout_per_sample_s, cfg.step_timeout_min_s) == (0.5, 60.0)
    for bad in ("-1", "soon", "true"):
        (p,) = config_problems(f"reward_model.scoring.step_timeout_s={bad}")
        assert p.startswith("reward_model.scoring.step_timeout_s: must be auto, seconds >= 0, or 0/null")
    with pytest.raises(ValueError, match="reward_model.scoring.step_timeout_s"):
        DAPORewardManager(CharTokenizer(), scoring=ScoringConfig(step_timeout_s=-1))
    (p,) = config_problems("reward_model.scoring.step_timeout_per_sample_s=0")
    assert p.startswith("reward_model.scoring.step_timeout_per_sample_s: must be > 0")
    assert config_problems("reward_model.scoring.step_timeout_s=0") == []
    assert config_problems("reward_model.scoring.step_timeout_s=null") == []
    assert config_problems("reward_model.scoring.step_timeout_s=45") == []
    (p,) = config_problems("reward_model.scoring.memory_limit_mb=-1")
    assert p.startswith("reward_model.scoring.memory_limit_mb: must be >= 0")


def test_auto_budget_is_the_per_sample_allowance_times_the_worker_samples_with_a_floor():
    auto = ScoringConfig()  # 0.5 s a sample, at least 60 s
    assert step_budget_s(auto, 0) == 60.0
    assert step_budget_s(auto, 100) == 60.0  # 50 s is under the floor
    assert step_budget_s(auto, 120) == 60.0
    assert step_budget_s(auto, 512) == 256.0
    assert step_budget_s(auto, 8192) == 4096.0
    custom = ScoringConfig(step_timeout_per_sample_s=0.25, step_timeout_min_s=10)
    assert (step_budget_s(custom, 8), step_budget_s(custom, 64)) == (10.0, 16.0)
    assert step_budget_s(ScoringConfig(step_timeout_s=45), 8192) == 45.0  # a number is the budget
    assert step_budget_s(ScoringConfig(step_timeout_s=0), 8192) is None  # 0 and null: no budget
    assert step_budget_s(ScoringConfig(step_timeout_s=None), 8192) is None


def test_the_budget_counts_only_samples_scored_in_workers_one_per_reward_function(ref, monkeypatch):
    import dapo.reward.manager as manager

    seen = []
    real = manager.step_budget_s
    monkeypatch.setattr(manager, "step_budget_s", lambda sc, k: seen.append(k) or real(sc, k))
    batch = make_batch(["1", "2", "3"], ["1"] * 3, data_source="math_dapo")
    # auto mode scores the built-in math_dapo scorer in the trainer process: nothing for workers
    with DAPORewardManager(CharTokenizer()) as mgr:
        mgr(batch)
    objectives = [RewardObjective("a", ref), RewardObjective("b", ref), RewardObjective("c", None)]
    with DAPORewardManager(CharTokenizer(), objectives=objectives, scoring={"num_workers": 1}) as mgr:
        mgr(batch)
    assert seen == [0, 6]  # two file-based objectives of 3 responses each; the built-in runs inline


def test_a_run_with_slow_scorers_is_bounded_by_the_default_budget(ref):
    # "auto" as by default, sized down so the test is short: max(1, 0.1 x 6) = 1 s; the
    # per-sample timeout is far away, so only the budget can end the call
    texts = ["ok", "slowish", "ok", "slowish", "no", "slowish"]
    scoring = {"mode": "process", "timeout_s": 3600.0, "num_workers": 2}
    scoring.update(step_timeout_per_sample_s=0.1, step_timeout_min_s=1.0)
    with DAPORewardManager(CharTokenizer(), ref, scoring=scoring) as mgr:
        for _ in range(2):  # and the next call is bounded again, by a fresh budget
            out = mgr(make_batch(texts, ["ok"] * len(texts), data_source="anything"))
            info = out.reward_extra_info
            assert {1, 3, 5} <= {i for i, p in enumerate(info["pred"]) if p == "[TIMEOUT]"}
            assert out.metrics["reward/timeouts"] == info["pred"].count("[TIMEOUT]")
            assert [info["score"][i] for i in (1, 3, 5)] == [-1.0] * 3


SLOW_REWARD = """
import time

def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    time.sleep(20)  # without a budget the step still ends, after minutes, scored 1.0
    return 1.0
"""


def test_a_training_run_with_a_slow_scorer_is_bounded_by_the_default_budget(
    tmp_path, tiny_random_model_dir, mod3_task
):
    from dapo.cli import main
    from runs import metric_rows, run_summary, train_args

    train, test, _ = mod3_task
    reward = tmp_path / "slow.py"
    reward.write_text(SLOW_REWARD)
    run_dir = tmp_path / "run"
    argv = train_args(
        run_dir,
        tiny_random_model_dir,
        train,
        test,
        1,
        "trainer.logger=[jsonl]",
        "trainer.val_before_train=false",
        "algorithm.filter_groups.enable=false",
        f"custom_reward_function.path={reward}",
        # step_timeout_s stays auto; its allowance is sized down (max(1, 0.01 x 32) = 1 s) and the
        # per-sample timeout is far away, so only the budget can end a scoring call
        "reward_model.scoring.timeout_s=3600",
        "reward_model.scoring.step_timeout_per_sample_s=0.01",
        "reward_model.scoring.step_timeout_min_s=1",
    )
    assert main(argv) == 0
    (row,) = metric_rows(run_dir)
    # every response of the step: without filtering it is data.gen_batch_size=8 prompts x 4 samples
    assert row["reward/timeouts"] == 8 * 4
    # failure_score -1 for each, less the overlong penalty of those that ran long
    assert row["reward/errors"] == 0 and row["critic/score/max"] <= -1.0
    assert run_summary(run_dir)["steps"] == 1
