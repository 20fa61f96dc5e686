"""A real multi-node Ray cluster on this machine: a head and a worker node (separate raylets,
each with its own resources, ``ray.cluster_utils.Cluster``), two FSDP ranks placed on different
nodes by a STRICT_SPREAD placement group (the worker node has room for both), two update steps equal to the single-process actor's,
and every process of the cluster gone afterwards."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest
import torch

from dapo.distributed import DistributedActor
from dapo.distributed.fsdp_worker import WorkerSpec, worker_factory
from dapo.distributed.ray_group import RayWorkerGroup, local_ray_env, ray_available
from dapo.model.loader import load_model

if not ray_available():
    pytest.skip("Ray worker groups need the 'scale' extra (pip install ray)", allow_module_level=True)

from fixtures.actor_helpers import TOL, actor_settings, max_diff, one_rank, rl_batch  # noqa: E402

OBJECT_STORE = 100 * 2**20


def _cluster_processes(marks: list[str], pids: set[int]) -> list[str]:
    """Live processes whose command line names the cluster (session dir, GCS address) or whose
    pid is a rank's (from /proc: zombies, already exited, have an empty command line)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and (int(d.name) in pids or any(m in cmd for m in marks)):
            out.append(f"{d.name}: {cmd[:120]}")
    return out


def test_two_nodes_two_steps_then_nothing_left(tiny_random_model_dir, monkeypatch):
    for k, v in local_ray_env().items():
        os.environ.setdefault(k, v)
    import ray
    from ray.cluster_utils import Cluster

    torch.set_num_threads(1)
    temp = Path(tempfile.mkdtemp(prefix="dapo-rc-"))  # short: Ray's unix socket paths live under it
    monkeypatch.setenv("RAY_TMPDIR", str(temp))  # the cluster's address file goes there, not /tmp/ray
    (temp / "ray").mkdir()
    node = {"object_store_memory": OBJECT_STORE, "node_ip_address": "127.0.0.1"}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={**node, "num_cpus": 1, "include_dashboard": False, "temp_dir": str(temp / "ray")},
    )
    marks = [str(temp), cluster.address]
    worker_pids: set[int] = set()
    try:
        # a worker node with room for both ranks: only the placement puts one on the head
        worker = cluster.add_node(**node, num_cpus=2)
        ray.init(address=cluster.address, configure_logging=False)
        nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        assert len(nodes) == 2

        s = actor_settings(ppo_epochs=1)
        vocab = load_model(tiny_random_model_dir).config.vocab_size
        batches = [rl_batch(vocab, rows=8, seed=k) for k in (0, 1)]
        local = one_rank(tiny_random_model_dir, s)
        m1 = [local.update_policy(b) for b in batches]

        spec = WorkerSpec(model_path=str(tiny_random_model_dir), settings=s, lr=1e-3, weight_decay=0.01)
        group = RayWorkerGroup(worker_factory(spec), 2, num_cpus_per_worker=1, local=False, nnodes=2)
        actor = DistributedActor(group, s, rollout_model=load_model(tiny_random_model_dir), balance=True)
        try:
            assert set(group.node_ids) == {worker.node_id, cluster.head_node.node_id} == nodes
            worker_pids = {i["pid"] for i in actor.info()}
            m2 = [actor.update_policy(b) for b in batches]
        finally:
            actor.shutdown()
        for a, b in zip(m1, m2):
            assert abs(a["actor/pg_loss"] - b["actor/pg_loss"]) < TOL
            assert abs(a["actor/grad_norm"] - b["actor/grad_norm"]) < TOL
        assert max_diff(local.model, actor.rollout_model) < TOL
    finally:
        ray.shutdown()
        cluster.shutdown()
    left = _cluster_processes(marks, worker_pids)
    for _ in range(60):  # processes may take a moment to exit after their raylet is gone
        if not left:
            break
        time.sleep(0.5)
        left = _cluster_processes(marks, worker_pids)
    shutil.rmtree(temp, ignore_errors=True)
    assert not left, f"Ray processes left: {left}"
