"""algorithm.filter_groups.prefetch in the real trainer: what runs in the background and when
its failure surfaces. (Exact resume with prefetch: tests/test_resume_exact.py.)"""

from __future__ import annotations

import threading

import pytest
import torch

from dapo.sampling.prefetch import Prefetcher
from dapo.sampling.strategies.base import SampledStep
from dapo.trainer.loop import Trainer
from fixtures.config_helpers import run_config
from runs import metric_rows, record_drift

torch.set_num_threads(1)


def _trainer(run_dir, steps=3, *extra):
    cfg = run_config(
        *[
            "algorithm.filter_groups.prefetch=true",
            "algorithm.filter_groups.max_staleness=2",
            f"trainer.total_training_steps={steps}",
            f"trainer.default_local_dir={run_dir}",
            "trainer.logger=[jsonl]",
            "trainer.val_before_train=false",
            "trainer.test_freq=0",
            "trainer.report_freq=0",
            "trainer.save_freq=1",
            "trainer.save_final_model=false",
            "data.train_batch_size=4",
            "data.gen_batch_size=8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
            *extra,
        ]
    )
    return Trainer(cfg, printer=lambda s: None)


def _steps(run_dir):
    return metric_rows(run_dir)


def test_prefetched_batches_come_from_the_weights_before_the_update(tmp_path):
    t = _trainer(tmp_path / "run", 4, "actor_rollout_ref.actor.optim.lr_warmup_steps=0")
    seen = record_drift(t)
    t.fit()
    # step 1 is generated before any update; later steps by the weights one update back, which
    # the recomputed old log-probs (current weights) no longer match exactly
    assert seen[0][1] == 0 and seen[0][2] < 1e-4
    assert all(stale >= 1 and drift > 1e-4 for _, stale, drift in seen[1:])
    rows = _steps(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(r["dynamic_sampling/staleness_mean"] >= 1 for r in rows[1:])


def test_a_failed_prefetch_stops_before_saving_that_step(tmp_path):
    run = tmp_path / "run"
    t = _trainer(run, 3)
    calls = {"n": 0}
    next_batch = t.batcher.next_batch

    def failing(*a, **k):
        calls["n"] += 1
        if calls["n"] == 3:  # the prefetch for step 3, running during step 2's update
            raise RuntimeError("generation failed")
        return next_batch(*a, **k)

    t.batcher.next_batch = failing
    with pytest.raises(RuntimeError, match="generation failed"):
        t.fit()
    assert [r["step"] for r in _steps(run)] == [1, 2]  # step 2 is logged ...
    assert (run / "global_step_1").exists()
    assert not (run / "global_step_2").exists()  # ... but not saved
    assert (run / "latest_checkpointed_iteration.txt").read_text().strip() == "1"


def test_a_cancelled_prefetch_stops_before_its_next_round():
    # an update that fails (or a second Ctrl-C) cancels the next step's generation: the round on
    # the engine finishes, no further round starts, and nothing of it is kept
    p = Prefetcher(True)
    on_engine, release = threading.Event(), threading.Event()
    rounds = []

    def one_round():
        rounds.append(len(rounds))
        on_engine.set()
        release.wait()

    def generate(ctx):
        guarded = p.guard(one_round)
        for _ in range(50):  # a batch that needs many rounds
            guarded()
        return SampledStep(None, "skip")

    p.start(generate)
    on_engine.wait()
    p.cancel()
    release.set()
    p.shutdown()  # returns once the worker has stopped
    assert rounds == [0]
    p.wait()
    assert p.take() is None and p.error is None


def test_an_interrupted_update_does_not_wait_for_the_prefetch(tmp_path):
    t = _trainer(tmp_path / "run", 3)
    update = t.actor.update_policy

    def interrupting_update(batch):
        if t.global_step == 2:  # Ctrl-C twice while step 3's batch is being generated
            raise KeyboardInterrupt
        return update(batch)

    t.actor.update_policy = interrupting_update
    with pytest.raises(KeyboardInterrupt):
        t.fit()
    t.prefetcher.shutdown()
    # the step gave up its prefetch instead of waiting for it (which would have kept its batch)
    assert t.prefetcher.take() is None and t.prefetcher.error is None
    assert [r["step"] for r in _steps(tmp_path / "run")] == [1]
