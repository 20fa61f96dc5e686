"""Ulysses sequence parallelism on gloo ranks (spawned processes) against one process.

* SP=2 alone: the packed forward split over 2 ranks gives the padded single-process log-probs,
  entropies, loss and (summed over the SP group) gradients, also for a model with fewer kv heads
  than ranks (kv heads repeated);
* dp x sp = 2 x 2 on 4 ranks with FSDP: the same update (loss, weights) and old log-probs as the
  single-process actor on the whole batch.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
import torch.distributed as dist

from dapo.actor.forward import response_logprobs
from dapo.distributed import DistributedActor, ProcessWorkerGroup
from dapo.distributed.fsdp_worker import WorkerSpec, worker_factory
from dapo.distributed.ulysses import sp_problem, ulysses_response_logprobs
from dapo.model.loader import load_model
from fixtures.actor_helpers import TOL, actor_settings, max_diff, one_rank, rl_batch  # noqa: E402

TEMP = 0.7


def _loss(lp: torch.Tensor, ent: torch.Tensor, batch) -> torch.Tensor:
    mask = batch.tensors["response_mask"].float()
    adv = batch.tensors["advantages"]
    return -((lp * adv + 0.01 * ent) * mask).sum() / mask.sum()


def _forward_backward(model, batch, forward, **kw) -> dict:
    model.zero_grad(set_to_none=True)
    t = batch.tensors
    lp, ent = forward(model, t["input_ids"], t["attention_mask"], t["responses"].shape[1], TEMP, True, **kw)
    loss = _loss(lp, ent, batch)
    loss.backward()
    grads = {k: p.grad.detach().clone() for k, p in model.named_parameters()}
    return {"lp": lp.detach(), "ent": ent.detach(), "loss": float(loss.detach()), "grads": grads}


class SPWorker:
    """One rank of a bare SP group (no FSDP): runs the SP forward/backward, sums the gradients."""

    def __init__(self, rank: int, world: int, addr: str, port: int):
        torch.set_num_threads(1)
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world)
        self.group = dist.new_group(list(range(world)))

    def run(self, model_dir: str, batch, checkpointing: bool = False) -> dict:
        model = load_model(model_dir).train()
        if checkpointing:
            model.gradient_checkpointing_enable()
        out = _forward_backward(model, batch, ulysses_response_logprobs, group=self.group)
        for g in out["grads"].values():
            dist.all_reduce(g, group=self.group)
        return out

    def close(self) -> None:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def kv1_model_dir(tmp_path_factory, char_tokenizer):
    """A tiny Qwen2 with 4 query heads and 1 kv head (SP=2 repeats it)."""
    from conftest import save_tiny_random_model

    return save_tiny_random_model(
        tmp_path_factory.mktemp("tiny_kv1"), char_tokenizer, seed=1, num_key_value_heads=1
    )


def test_sp2_equals_one_process(tiny_random_model_dir, kv1_model_dir):
    torch.set_num_threads(1)
    group = ProcessWorkerGroup(SPWorker, 2)
    try:
        # activation checkpointing re-runs the forward during backward: same packed attention
        for model_dir, ckpt in (
            (tiny_random_model_dir, False),
            (kv1_model_dir, False),
            (tiny_random_model_dir, True),
        ):
            model = load_model(model_dir).train()
            # 7 rows: the packed length is odd for some seeds, so the SP padding is exercised
            batch = rl_batch(model.config.vocab_size, rows=7, seed=5)
            ref = _forward_backward(model, batch, response_logprobs)
            if ckpt:
                model.gradient_checkpointing_enable()
            one = _forward_backward(model, batch, ulysses_response_logprobs)  # packed, no group
            # the model was switched to packed attention; its padded forward is unchanged
            again = _forward_backward(model, batch, response_logprobs)
            assert float((again["lp"] - ref["lp"]).abs().max()) < TOL
            a, b = group.call_all("run", str(model_dir), batch, ckpt)
            mask = batch.tensors["response_mask"].bool()
            for got in (one, a, b):
                assert float((got["lp"] - ref["lp"])[mask].abs().max()) < TOL
                assert float((got["ent"] - ref["ent"])[mask].abs().max()) < TOL
                assert abs(got["loss"] - ref["loss"]) < TOL
                for k, g in ref["grads"].items():
                    assert float((got["grads"][k] - g).abs().max()) < TOL, k
            # the gradient is not trivially small: the comparison means something
            assert max(float(g.abs().max()) for g in ref["grads"].values()) > 1e-3
    finally:
        group.shutdown()


def test_dp2_sp2_fsdp_equals_one_rank(tiny_random_model_dir):
    torch.set_num_threads(1)
    s = actor_settings(ppo_epochs=1, use_remove_padding=True, ulysses_sequence_parallel_size=2)
    spec = WorkerSpec(model_path=str(tiny_random_model_dir), settings=s, lr=1e-3, weight_decay=0.01)
    actor = DistributedActor(
        ProcessWorkerGroup(worker_factory(spec), 4), s, rollout_model=load_model(tiny_random_model_dir)
    )
    try:
        info = actor.info()
        assert [i["sp"] for i in info] == [2, 2, 2, 2] and info[0]["mesh"] == (4,)
        assert actor.dp == 2
        batch = rl_batch(actor.rollout_model.config.vocab_size, rows=8, seed=4)
        ref = one_rank(
            tiny_random_model_dir,
            dataclasses.replace(s, model=dataclasses.replace(s.model, use_remove_padding=False)),
        )
        m1, m2 = ref.update_policy(batch), actor.update_policy(batch)
        assert abs(m1["actor/pg_loss"] - m2["actor/pg_loss"]) < TOL
        assert abs(m1["actor/grad_norm"] - m2["actor/grad_norm"]) < TOL
        assert max_diff(ref.model, actor.rollout_model) < TOL
        assert max_diff(load_model(tiny_random_model_dir), actor.rollout_model) > 100 * TOL
        lp1 = response_logprobs(
            ref.model.eval(),
            batch.tensors["input_ids"],
            batch.tensors["attention_mask"],
            batch.tensors["responses"].shape[1],
            TEMP,
        )[0]
        lp2, _ = actor.compute_log_prob(batch, TEMP, 3)
        mask = batch.tensors["response_mask"].bool()
        assert float((lp1.detach() - lp2)[mask].abs().max()) < TOL
    finally:
        actor.shutdown()


def test_sp_rules():
    assert sp_problem(4, 2, 2) is None and sp_problem(4, 1, 2) is None and sp_problem(8, 2, 4) is None
    assert "num_attention_heads=6" in sp_problem(6, 2, 4)
    assert "num_key_value_heads=3" in sp_problem(6, 3, 2)
