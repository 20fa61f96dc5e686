"""Token log-probabilities and entropies from logits, at the sampling temperature.

With z = logits / temperature (as in verl: the ratio and the entropy see the distribution
the sampler drew from):

    log p(y) = z_y - logsumexp(z)
    H        = -sum_v p_v log p_v   (= logsumexp(z) - sum_v p_v z_v, verl's form)

Both are computed on z - max(z): the shift is exact for the tokens that carry the
probability mass, so log p and H do not inherit the rounding of logits of magnitude 30 or
100 (verl's form subtracts two numbers of that size). benchmarks/entropy_precision.py
measures the error against float64 and the cost of the shift.

Memory: a vocabulary-sized row is never held more than a chunk at a time. The forward pass
works over chunks of rows and keeps for backward only the input logits (a reference, not a
copy) and one float per row; the backward pass allocates the gradient (the one extra
logits-sized tensor, unavoidable) and fills it chunk by chunk, recomputing softmax. Half or
bfloat16 logits are upcast per chunk, so results are float32 (float64 inputs stay float64).

Gradients: d log p(y)/dz = onehot(y) - p;  dH/dz = -p * (z - E_p[z]) = -p * (log p + H).
"""

from __future__ import annotations

import torch

__all__ = ["logprobs_from_logits", "entropy_from_logits", "logprobs_and_entropy"]

_CHUNK_ELEMENTS = 1 << 24  # about 64 MiB of float32 per temporary


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _row_blocks(x: torch.Tensor) -> list[torch.Tensor]:
    """2-D views [n_i, V] covering x's rows in C order, without copying when x is a slice."""
    if x.dim() == 2:
        return [x]
    try:
        return [x.view(-1, x.shape[-1])]
    except RuntimeError:  # e.g. logits[:, -R-1:-1] of a [B, L, V] tensor: view each batch row
        return [blk for sub in x.unbind(0) for blk in _row_blocks(sub)]


def _chunks(logits: torch.Tensor, chunk_rows: int | None):
    """Yield (row_offset, 2-D chunk) over all rows of `logits`."""
    vocab = logits.shape[-1]
    step = chunk_rows or max(1, _CHUNK_ELEMENTS // max(vocab, 1))
    offset = 0
    for block in _row_blocks(logits):
        for start in range(0, block.shape[0], step):
            chunk = block[start : start + step]
            yield offset + start, chunk
        offset += block.shape[0]


class _LogProbEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, labels, temperature, want_logp, want_entropy, chunk_rows):
        vocab = logits.shape[-1]
        n_rows = logits.numel() // vocab if vocab else 0
        dtype = _compute_dtype(logits.dtype)
        flat_labels = labels.reshape(-1) if want_logp else None
        logp = torch.empty(n_rows, dtype=dtype, device=logits.device)
        ent = torch.empty(n_rows, dtype=dtype, device=logits.device)
        lse = torch.empty(n_rows, dtype=dtype, device=logits.device)
        with torch.no_grad():
            for off, chunk in _chunks(logits, chunk_rows):
                rows = slice(off, off + chunk.shape[0])
                z = chunk.to(dtype) / temperature
                shift = z.amax(dim=-1, keepdim=True)
                z.sub_(shift)  # the largest logit becomes 0; what is left has no large magnitude
                lse_shifted = torch.logsumexp(z, dim=-1)
                lse[rows] = lse_shifted + shift.squeeze(-1)
                if want_logp:
                    logp[rows] = z.gather(-1, flat_labels[rows].unsqueeze(-1)).squeeze(-1) - lse_shifted
                if want_entropy:
                    log_p = z.sub_(lse_shifted.unsqueeze(-1))  # in place: z becomes log softmax
                    # H = -sum p log p: every term >= 0, so no cancellation (lse - E[z] has some)
                    ent[rows] = -(torch.exp(log_p) * log_p).sum(dim=-1)
        ctx.save_for_backward(logits, flat_labels if want_logp else None, lse, ent)
        ctx.temperature, ctx.chunk_rows = temperature, chunk_rows
        ctx.want_logp, ctx.want_entropy = want_logp, want_entropy
        lead = logits.shape[:-1]
        return logp.view(lead), ent.view(lead)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_logp, grad_ent):
        logits, flat_labels, lse, ent = ctx.saved_tensors
        temperature = ctx.temperature
        dtype = lse.dtype
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        grad_flat = grad.view(-1, logits.shape[-1])
        g_lp = grad_logp.reshape(-1).to(dtype) if (ctx.want_logp and grad_logp is not None) else None
        g_h = grad_ent.reshape(-1).to(dtype) if (ctx.want_entropy and grad_ent is not None) else None
        for off, chunk in _chunks(logits, ctx.chunk_rows):
            rows = slice(off, off + chunk.shape[0])
            log_p = chunk.to(dtype).div(temperature).sub_(lse[rows].unsqueeze(-1))
            p = torch.exp(log_p)
            # dz = g_lp * (onehot(y) - p) - g_h * p * (z - E_p[z]),  z - E_p[z] = log_p + H
            coef = torch.zeros_like(lse[rows]) if g_lp is None else g_lp[rows]
            if g_h is not None:
                centred = log_p.add_(ent[rows].unsqueeze(-1))
                dz = centred.mul_(g_h[rows].unsqueeze(-1)).add_(coef.unsqueeze(-1))
                dz = dz.mul_(p).neg_()
            else:
                dz = p.mul_(-coef.unsqueeze(-1))
            if g_lp is not None:
                dz.scatter_add_(-1, flat_labels[rows].unsqueeze(-1), g_lp[rows].unsqueeze(-1))
            grad_flat[rows] = (dz / temperature).to(grad.dtype)
        return grad, None, None, None, None, None


def logprobs_and_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    temperature: float = 1.0,
    calculate_entropy: bool = False,
    chunk_rows: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log p(labels), entropy or None) from [..., V] logits at `temperature`, in one pass."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    logp, ent = _LogProbEntropy.apply(logits, labels, float(temperature), True, calculate_entropy, chunk_rows)
    return logp, (ent if calculate_entropy else None)


def logprobs_from_logits(
    logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0, chunk_rows: int | None = None
) -> torch.Tensor:
    """log softmax(logits / temperature) gathered at `labels`; shape logits.shape[:-1]."""
    return logprobs_and_entropy(logits, labels, temperature, False, chunk_rows)[0]


def entropy_from_logits(
    logits: torch.Tensor, temperature: float = 1.0, chunk_rows: int | None = None
) -> torch.Tensor:
    """Entropy of softmax(logits / temperature) per row; shape logits.shape[:-1]."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    dummy = torch.zeros((), dtype=torch.long, device=logits.device)
    return _LogProbEntropy.apply(logits, dummy, float(temperature), False, True, chunk_rows)[1]
