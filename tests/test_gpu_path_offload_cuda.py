"""The actor's offload (dapo.actor.offload) on a CUDA device, where it frees real device memory
(skipped without one; benchmarks/gpu_check.sh runs it): after ``release`` the device holds no
gradient and no optimizer state, after ``offload_parameters`` no parameter either, and the update
after ``restore`` the parameters and the optimizer state are bitwise what they were, and the
optimizer steps on from them."""

from __future__ import annotations

import pytest
import torch

from dapo.actor.offload import ACTOR, GRAD, HOST, OPTIM, PARAM, ActorOffload, MemoryLedger

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def _model() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        num_hidden_layers=2,
        hidden_size=256,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=512,
        vocab_size=1024,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).to("cuda")


def _update(model: torch.nn.Module, opt: torch.optim.Optimizer, seed: int) -> None:
    opt.zero_grad(set_to_none=True)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 1024, (2, 16), generator=g).to("cuda")
    logits = model(input_ids=ids).logits
    loss = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)
    )
    loss.backward()
    opt.step()


def test_gpu_path_offload_frees_cuda_memory_and_restores_bitwise():
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    _update(model, opt, seed=1)
    saved_params = [p.detach().clone() for p in model.parameters()]
    saved_state = [{k: v.clone() for k, v in opt.state[p].items()} for p in model.parameters()]
    torch.cuda.synchronize()

    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    n = len(list(model.parameters()))
    adam_bytes = 2 * param_bytes  # exp_avg and exp_avg_sq; AdamW's step counters are on the CPU
    ledger = MemoryLedger()
    off = ActorOffload(model, opt, offload_params=True, ledger=ledger)

    before = torch.cuda.memory_allocated()
    off.release()
    torch.cuda.synchronize()
    freed = before - torch.cuda.memory_allocated()
    ledger.record("released", off.tensors())
    # the gradients (one per parameter) and Adam's two moments left the device
    assert freed >= param_bytes + adam_bytes
    assert ledger.nbytes("released", ACTOR, GRAD) == 0 and ledger.nbytes("released", ACTOR, OPTIM) == 0
    assert ledger.nbytes("released", HOST, OPTIM, "cpu") >= adam_bytes
    assert all(
        v.is_pinned() for s in off._store.values() for v in s.values() if torch.is_tensor(v) and v.dim()
    )
    assert ledger.nbytes("released", ACTOR, PARAM, "cuda") == param_bytes

    before = torch.cuda.memory_allocated()
    off.offload_parameters()
    torch.cuda.synchronize()
    assert before - torch.cuda.memory_allocated() >= param_bytes
    ledger.record("offloaded", off.tensors())
    assert ledger.nbytes("offloaded", device="cuda") == 0
    assert ledger.nbytes("offloaded", ACTOR, PARAM, "cpu") == param_bytes

    off.restore()
    ledger.record("restored", off.tensors())
    assert ledger.nbytes("restored", ACTOR, PARAM, "cuda") == param_bytes
    assert (
        ledger.nbytes("restored", ACTOR, OPTIM, "cuda") >= adam_bytes and ledger.nbytes("restored", HOST) == 0
    )
    assert len(opt.state) == n
    for (name, p), q, state in zip(model.named_parameters(), saved_params, saved_state, strict=True):
        assert p.device.type == "cuda" and torch.equal(p, q), name
        for k, v in state.items():
            assert opt.state[p][k].device == v.device and torch.equal(opt.state[p][k], v), (name, k)
    _update(model, opt, seed=2)
    assert all(float(opt.state[p]["step"]) == 2.0 for p in model.parameters())
    assert not any(torch.equal(p, q) for p, q in zip(model.parameters(), saved_params, strict=True))
