"""Splitting batches across ranks, without processes: balanced equal-size partitions,
divisibility after dynamic-sampling filtering (zero-weight padding or trimming whole groups),
mini-batch plans equal to the single-process actor's, metric combination, and a 1-rank FSDP
worker in this process equal to the plain actor."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo.actor.dp_actor import Actor
from dapo.actor.seqlen_balancing import workload
from dapo.batch import Batch
from dapo.distributed import (
    DistributedActor,
    InProcessWorkerGroup,
    LocalActor,
    balance_metrics,
    combine_metrics,
    make_divisible,
    minibatch_plan,
    pad_to_multiple,
    rank_partitions,
    trim_to_multiple,
)
from dapo.distributed.partition import PAD_KEY
from fixtures.actor_helpers import TOL, actor_settings, max_diff, one_rank, rl_batch


def test_balanced_partition_hand_example():
    # lengths 10, 1, 9, 2, 8, 3 into 2 ranks of 3 rows: contiguous halves hold 20 vs 13 tokens;
    # the best 3+3 split is 15 vs 18 ({10, 2, 3} and {1, 9, 8}; a spread of 3 is the minimum)
    lengths = [10, 1, 9, 2, 8, 3]
    parts = rank_partitions(lengths, 2, balance=True)
    assert sorted(i for p in parts for i in p) == list(range(6))
    assert [len(p) for p in parts] == [3, 3]
    sums = sorted(sum(lengths[i] for i in p) for p in parts)
    assert sums == [15, 18]
    contiguous = rank_partitions(lengths, 2, balance=False)
    assert contiguous == [[0, 1, 2], [3, 4, 5]]
    m = balance_metrics(lengths, contiguous, parts)
    assert m["global_seqlen/minmax_diff"] == 7 and m["global_seqlen/balanced_max"] == 18
    assert m["global_seqlen/mean"] == 16.5
    # small rows at both ends of each part (verl's arrangement)
    for p in parts:
        w = [lengths[i] for i in p]
        assert w[0] < max(w) and w[-1] < max(w)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 4000), min_size=2, max_size=48), st.integers(2, 8))
def test_balanced_partitions_are_equal_size_and_no_worse_than_chunks(lengths, k):
    lengths = lengths[: len(lengths) - len(lengths) % k] or lengths[:k]
    if len(lengths) < k:
        return
    parts = rank_partitions(lengths, k, balance=True)
    assert sorted(i for p in parts for i in p) == list(range(len(lengths)))
    assert {len(p) for p in parts} == {len(lengths) // k}
    w = [workload(x) for x in lengths]

    def spread(ps):
        s = [sum(w[i] for i in p) for p in ps]
        return max(s) - min(s)

    # KK's spread is at most the heaviest row's workload (and no worse than contiguous chunks in practice)
    assert spread(parts) <= max(w)


def test_rank_partitions_need_divisible_rows():
    with pytest.raises(ValueError, match="do not split evenly"):
        rank_partitions([1, 2, 3], 2, balance=False)


def _filtered_batch(vocab: int = 40) -> Batch:
    """What the dynamic sampler hands over after filtering: 3 groups of n=3 (9 rows)."""
    b = rl_batch(vocab, rows=9, seed=5)
    b["uid"] = [f"g{i // 3}" for i in range(9)]
    return b


def test_divisible_after_filtering_pad_and_trim():
    b = _filtered_batch()
    logs: list[str] = []
    padded = make_divisible(b, 4, "pad", log=logs.append)
    assert len(padded) == 12 and "3 zero-weight" in logs[-1]
    pad = np.asarray(padded[PAD_KEY], dtype=bool)
    assert pad.sum() == 3 and not pad[:9].any()
    assert float(padded.tensors["response_mask"][pad].sum()) == 0.0
    assert float(padded.tensors["advantages"][pad].abs().sum()) == 0.0
    # real rows untouched, in place
    assert torch.equal(padded.tensors["input_ids"][:9], b.tensors["input_ids"])
    trimmed = make_divisible(b, 2, "trim", log=logs.append)
    # 9 rows of groups of 3: dropping one whole group leaves 6
    assert len(trimmed) == 6 and set(trimmed["uid"]) == {"g0", "g1"} and "1 whole group" in logs[-1]
    assert make_divisible(b, 3, "pad", log=logs.append) is b
    with pytest.raises(ValueError, match="no set of whole groups"):
        trim_to_multiple(_filtered_batch().select([0, 1, 2]), 2)


def test_zero_weight_rows_do_not_change_the_update(tiny_random_model_dir):
    """1 rank: the padded batch gives the same loss and weights as the filtered batch itself."""
    torch.set_num_threads(1)
    s = actor_settings(ppo_mini_batch_size=16, ppo_epochs=1, shuffle=False)
    b = _filtered_batch(vocab=40)
    padded, added = pad_to_multiple(b, 4)
    assert added == 3
    a = one_rank(tiny_random_model_dir, s)
    c = one_rank(tiny_random_model_dir, s)
    ma, mc = a.update_policy(b), c.update_policy(padded)
    assert abs(ma["actor/pg_loss"] - mc["actor/pg_loss"]) < TOL
    assert max_diff(a.model, c.model) < TOL


def test_minibatch_plan_matches_the_actor():
    plan = minibatch_plan(10, 4, ppo_epochs=2, shuffle=True, seed=7)
    rng = np.random.default_rng(7)
    expect = []
    for _ in range(2):
        order = rng.permutation(10)
        expect += [order[0:4], order[4:8], order[8:10]]
    assert [p.tolist() for p in plan] == [e.tolist() for e in expect]
    assert [p.tolist() for p in minibatch_plan(5, 2, 1, False, 0)] == [[0, 1], [2, 3], [4]]


def test_combine_metrics_hand_computed():
    r0 = [
        {
            "actor/pg_loss": 1.0,
            "actor/pg_clipfrac": 0.5,
            "actor/grad_norm": 3.0,
            "_w_loss": 0.25,
            "_w_tok": 0.25,
        }
    ]
    r1 = [
        {
            "actor/pg_loss": 2.0,
            "actor/pg_clipfrac": 0.1,
            "actor/grad_norm": 3.0,
            "_w_loss": 0.75,
            "_w_tok": 0.75,
        }
    ]
    m = combine_metrics([r0, r1])
    assert m == pytest.approx({"actor/pg_loss": 1.75, "actor/pg_clipfrac": 0.2, "actor/grad_norm": 3.0})


def test_in_process_fsdp_worker_equals_plain_actor(tiny_random_model_dir):
    """World size 1 in this process: FSDP2 (gloo, 1 rank) through the worker group and the
    plain actor behind LocalActor agree on log-probs and on the update."""
    from dapo.distributed.fsdp_worker import WorkerSpec, worker_factory

    torch.set_num_threads(1)
    s = actor_settings(ppo_epochs=1)
    b = rl_batch(40, rows=6, seed=3)
    local = LocalActor(one_rank(tiny_random_model_dir, s))
    spec = WorkerSpec(model_path=str(tiny_random_model_dir), settings=s, lr=1e-3, weight_decay=0.01)
    group = InProcessWorkerGroup(worker_factory(spec))
    try:
        dist_actor = DistributedActor(group, s, rollout_model=one_rank(tiny_random_model_dir, s).model)
        lp_a, _ = local.compute_log_prob(b, 0.7, 4)
        lp_b, _ = dist_actor.compute_log_prob(b, 0.7, 4)
        mask = b.tensors["response_mask"].bool()
        assert float((lp_a - lp_b)[mask].abs().max()) < TOL
        ma, mb = local.update_policy(b), dist_actor.update_policy(b)
        assert abs(ma["actor/pg_loss"] - mb["actor/pg_loss"]) < TOL
        assert max_diff(local.actor.model, dist_actor.rollout_model) < TOL
        assert dist_actor.nonfinite_steps == 0 and local.nonfinite_steps == 0
    finally:
        group.shutdown()


def test_in_process_worker_leaves_a_borrowed_process_group_to_its_owner(tiny_random_model_dir):
    """A process group already in this process (an in-process vLLM engine makes one) is used by a
    1-rank worker and still there after the worker closes; one the worker made itself is gone.
    Destroying the borrowed group broke every vLLM engine started later in the process."""
    import torch.distributed as dist

    from dapo.distributed.fsdp_worker import WorkerSpec, worker_factory
    from dapo.distributed.worker_group import free_port

    torch.set_num_threads(1)
    spec = WorkerSpec(
        model_path=str(tiny_random_model_dir),
        settings=actor_settings(ppo_epochs=1),
        lr=1e-3,
        weight_decay=0.01,
    )
    # in the whole suite an earlier test's vLLM engine has left its group here: that one is borrowed
    made = not dist.is_initialized()
    if made:
        own = InProcessWorkerGroup(worker_factory(spec))
        assert dist.is_initialized()
        own.shutdown()
        assert not dist.is_initialized()
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        owner = dist.group.WORLD
        borrowed = InProcessWorkerGroup(worker_factory(spec))
        borrowed.shutdown()
        assert dist.is_initialized() and dist.group.WORLD is owner
        dist.barrier()  # still usable
    finally:
        if made:
            dist.destroy_process_group()


def test_local_actor_is_the_plain_actor(tiny_random_model_dir):
    s = actor_settings(ppo_epochs=1)
    a = one_rank(tiny_random_model_dir, s)
    la = LocalActor(a)
    assert isinstance(la.actor, Actor) and la.world_size == 1
    la.nonfinite_steps = 2
    assert a.nonfinite_steps == 2
    with pytest.raises(ValueError, match="no reference model"):
        la.compute_ref_log_prob(rl_batch(40, rows=2, seed=0), 1.0, 2)


def test_builder_world_one_is_the_local_actor_and_sizes_per_rank(tiny_random_model_dir):
    from dapo.actor.dp_actor import actor_settings_from_config
    from dapo.distributed.builder import build_actor, warn_uneven_mini_batch
    from fixtures.config_helpers import run_config

    deprecated = (
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size=12",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size=6",
        "actor_rollout_ref.rollout.n=3",
    )
    cfg = run_config(*deprecated)
    s = actor_settings_from_config(cfg)
    assert (s.ppo_mini_batch_size, s.ppo_micro_batch_size, s.log_prob_micro_batch_size) == (12, 12, 6)
    a = one_rank(tiny_random_model_dir, s)
    built = build_actor(cfg, model_path=str(tiny_random_model_dir), settings=s, actor=a)
    assert isinstance(built, LocalActor) and built.actor is a
    # verl: the global micro sizes over the DP size, per rank (the config resolves them)
    s2 = actor_settings_from_config(run_config(*deprecated, "trainer.n_gpus_per_node=2"))
    assert (s2.ppo_micro_batch_size, s2.log_prob_micro_batch_size) == (6, 3)
    logs: list[str] = []
    warn_uneven_mini_batch(s, 5, log=logs.append)
    warn_uneven_mini_batch(s, 2, log=logs.append)
    assert len(logs) == 1 and "12 trajectories does not divide by 5" in logs[0]
    with pytest.raises(ValueError, match="worker_backend"):
        build_actor(cfg, model_path="x", settings=s, actor=a, backend="mpi")


def test_batch_to_moves_tensors_and_keeps_rows():
    b = Batch({"x": torch.arange(6.0).view(3, 2)}, {"uid": ["a", "b", "c"]}, {"k": 1})
    assert b.to("cpu") is b  # already there: no copy
    m = b.to("meta")
    assert m.tensors["x"].device.type == "meta" and m.tensors["x"].shape == (3, 2)
    assert list(m.non_tensors["uid"]) == ["a", "b", "c"] and m.meta == {"k": 1} and m.meta is not b.meta
    assert b.tensors["x"].device.type == "cpu"  # the original is unchanged
    picked = m.select([2, 0])
    assert picked.tensors["x"].device.type == "meta" and list(picked.non_tensors["uid"]) == ["c", "a"]
