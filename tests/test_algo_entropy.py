"""Log-probs and entropy from temperature-scaled logits: values, gradients, chunking, memory."""

import pytest
import torch

from dapo.algo.entropy import entropy_from_logits, logprobs_and_entropy, logprobs_from_logits

torch.set_num_threads(1)


def _naive(logits, labels, temperature):
    z = logits.double() / temperature
    logp = torch.log_softmax(z, dim=-1)
    return logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1), -(logp.exp() * logp).sum(-1)


def test_hand_values():
    # uniform over 4 tokens: log p = -log 4, entropy = log 4, at any temperature
    logits = torch.zeros(1, 4)
    assert logprobs_from_logits(logits, torch.tensor([2]), 0.7).item() == pytest.approx(-1.386294, abs=1e-6)
    assert entropy_from_logits(logits, 1.3).item() == pytest.approx(1.386294, abs=1e-6)
    # two tokens, logits [0, ln 3] at T=1: p = [1/4, 3/4]
    logits = torch.tensor([[0.0, 1.0986123]])
    assert logprobs_from_logits(logits, torch.tensor([1])).item() == pytest.approx(-0.287682, abs=1e-6)
    h = -(0.25 * torch.log(torch.tensor(0.25)) + 0.75 * torch.log(torch.tensor(0.75)))
    assert entropy_from_logits(logits).item() == pytest.approx(h.item(), abs=1e-6)
    # temperature 0.5 doubles the logits: p = [1/10, 9/10]
    assert logprobs_from_logits(logits, torch.tensor([1]), 0.5).item() == pytest.approx(-0.1053605, abs=1e-6)


@pytest.mark.parametrize("temperature", [1.0, 0.6, 1.7])
@pytest.mark.parametrize("chunk_rows", [None, 1, 3])
def test_matches_naive_values_and_gradients(temperature, chunk_rows):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 17, generator=g) * 4
    labels = torch.randint(0, 17, (3, 5), generator=g)
    x = logits.clone().requires_grad_(True)
    logp, ent = logprobs_and_entropy(x, labels, temperature, calculate_entropy=True, chunk_rows=chunk_rows)
    ref_lp, ref_h = _naive(logits, labels, temperature)
    assert logp.shape == ent.shape == (3, 5)
    assert torch.allclose(logp.double(), ref_lp, atol=1e-5)
    assert torch.allclose(ent.double(), ref_h, atol=1e-5)
    w1, w2 = torch.randn(3, 5, generator=g), torch.randn(3, 5, generator=g)
    (logp * w1 + ent * w2).sum().backward()
    y = logits.double().requires_grad_(True)
    lp2, h2 = _naive(y, labels, temperature)
    (lp2 * w1 + h2 * w2).sum().backward()
    assert torch.allclose(x.grad.double(), y.grad, atol=1e-5)


def test_gradcheck_float64():
    logits = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 6, (4,))

    def both(x):
        lp, h = logprobs_and_entropy(x, labels, 0.8, calculate_entropy=True, chunk_rows=3)
        return lp, h

    assert torch.autograd.gradcheck(both, (logits,))
    assert torch.autograd.gradcheck(lambda x: logprobs_from_logits(x, labels, 1.3), (logits,))
    assert torch.autograd.gradcheck(lambda x: entropy_from_logits(x, 0.5, chunk_rows=1), (logits,))


def test_non_contiguous_response_slice_and_bf16():
    g = torch.Generator().manual_seed(1)
    full = torch.randn(2, 9, 11, generator=g)
    sliced = full[:, 3:-1]  # [B, R, V] slice of the model's logits, as the actor takes it
    assert not sliced.is_contiguous()
    labels = torch.randint(0, 11, (2, 5), generator=g)
    lp, h = logprobs_and_entropy(sliced, labels, 0.9, True, chunk_rows=2)
    ref_lp, ref_h = _naive(sliced, labels, 0.9)
    assert torch.allclose(lp.double(), ref_lp, atol=1e-5) and torch.allclose(h.double(), ref_h, atol=1e-5)
    bf = sliced.to(torch.bfloat16)
    lp16 = logprobs_from_logits(bf, labels, 0.9)
    assert lp16.dtype == torch.float32  # upcast per chunk
    assert torch.allclose(lp16.double(), _naive(bf.float(), labels, 0.9)[0], atol=1e-5)
    x = full.clone().requires_grad_(True)
    logprobs_from_logits(x[:, 3:-1], labels, 0.9).sum().backward()
    assert torch.all(x.grad[:, :3] == 0) and torch.all(x.grad[:, -1] == 0)


def test_backward_saves_no_extra_logits_sized_tensor():
    """Only the input logits (a reference) and per-row vectors are kept for backward."""
    logits = torch.randn(8, 64, 100, requires_grad=True)
    labels = torch.randint(0, 100, (8, 64))
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logp, ent = logprobs_and_entropy(logits, labels, 0.7, calculate_entropy=True, chunk_rows=16)
    big = [t for t in saved if t.numel() >= logits.numel()]
    assert len(big) == 1 and big[0].data_ptr() == logits.data_ptr()
    assert sum(t.numel() for t in saved if t.data_ptr() != logits.data_ptr()) <= 4 * 8 * 64


def test_bad_temperature():
    with pytest.raises(ValueError, match="temperature"):
        logprobs_from_logits(torch.zeros(1, 3), torch.tensor([0]), 0.0)
    with pytest.raises(ValueError, match="temperature"):
        entropy_from_logits(torch.zeros(1, 3), -1.0)


def test_large_logits_lose_no_precision_in_float32():
    """The max shift: float32 entropies of logits of magnitude 100 stay near float64.

    Without it (``-sum p log p`` on ``z - logsumexp z``) these errors are about 1e-5 and
    2.7e-5 (benchmarks/entropy_precision.py); verl's ``lse - sum p z`` is further still.
    """
    g = torch.Generator().manual_seed(0)
    peaked = torch.randn(16, 32768, generator=g) * 100
    offset = torch.randn(16, 32768, generator=g) * 2 + 100
    for z, bound in ((peaked, 1e-6), (offset, 1e-5)):
        ref = entropy_from_logits(z.double())
        assert (entropy_from_logits(z).double() - ref).abs().max() < bound
