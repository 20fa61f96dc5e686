"""A short Ray run: 2 FSDP actor workers as Ray actors on this machine (gloo over 127.0.0.1).

Checks that the private local Ray keeps its files in the run directory and writes no auth token
under the home directory, that a Ray step equals the in-process step, and reports start-up cost
and step time against the in-process actor (printed; run with -s to see them, also written to
``ray_timings.json`` in the test's run directory).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch

from dapo.distributed import DistributedActor
from dapo.distributed.fsdp_worker import WorkerSpec, worker_factory
from dapo.distributed.ray_group import RayWorkerGroup, init_local_ray, ray_available, shutdown_local_ray
from dapo.model.loader import load_model

if not ray_available():
    pytest.skip("Ray worker groups need the 'scale' extra (pip install ray)", allow_module_level=True)

from fixtures.actor_helpers import TOL, actor_settings, max_diff, one_rank, rl_batch  # noqa: E402


@pytest.mark.slow
def test_ray_two_workers_step(tiny_random_model_dir, tmp_path):
    torch.set_num_threads(1)
    home_ray = Path.home() / ".ray"
    had_home_ray = home_ray.exists()
    s = actor_settings(ppo_epochs=1)
    batch = rl_batch(load_model(tiny_random_model_dir).config.vocab_size, rows=8, seed=0)

    t0 = time.perf_counter()
    local = one_rank(tiny_random_model_dir, s)
    local_start = time.perf_counter() - t0
    t0 = time.perf_counter()
    m1 = local.update_policy(batch)
    local_step = time.perf_counter() - t0

    run_dir = tmp_path / "run"
    started = init_local_ray(run_dir, num_cpus=2, object_store_mb=100)
    import ray  # after init_local_ray, which sets Ray's environment first

    try:
        assert [n["NodeManagerAddress"] for n in ray.nodes()] == ["127.0.0.1"]
        # Ray's files live under <run_dir>/ray (a link to a short directory when the path is long)
        assert (run_dir / "ray").exists() and any((run_dir / "ray").glob("session_*"))
        spec = WorkerSpec(model_path=str(tiny_random_model_dir), settings=s, lr=1e-3, weight_decay=0.01)
        group = RayWorkerGroup(worker_factory(spec), 2, num_cpus_per_worker=1)
        actor = DistributedActor(group, s, rollout_model=load_model(tiny_random_model_dir), balance=True)
        try:
            pids = {i["pid"] for i in actor.info()}
            assert len(pids) == 2 and os.getpid() not in pids
            t0 = time.perf_counter()
            m2 = actor.update_policy(batch)
            ray_step = time.perf_counter() - t0
            synced = max_diff(local.model, actor.rollout_model)
            t0 = time.perf_counter()
            actor.update_policy(batch)
            ray_step2 = time.perf_counter() - t0
        finally:
            actor.shutdown()
    finally:
        shutdown_local_ray(started)
    assert abs(m1["actor/pg_loss"] - m2["actor/pg_loss"]) < TOL
    assert synced < TOL
    if not had_home_ray:
        assert not home_ray.exists(), "local Ray wrote under ~/.ray"
    timings = {
        "ray_init_s": round(started["startup_s"], 2),
        "ray_workers_ready_s": round(group.startup_s, 2),
        "ray_first_step_s": round(ray_step, 3),
        "ray_second_step_s": round(ray_step2, 3),
        "ray_weight_sync_s": round(m2["perf/weight_sync_s"], 3),
        "inprocess_start_s": round(local_start, 2),
        "inprocess_step_s": round(local_step, 3),
    }
    (tmp_path / "ray_timings.json").write_text(json.dumps(timings))
    print("\nray timings:", json.dumps(timings))
