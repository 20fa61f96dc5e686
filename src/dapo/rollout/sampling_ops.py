"""Token sampling from logits: temperature, top-k, top-p (pure functions)."""

from __future__ import annotations

import torch


def filter_logits(logits: torch.Tensor, top_k: int = -1, top_p: float = 1.0) -> torch.Tensor:
    """Mask logits outside top-k / the top-p nucleus with -inf. ``top_k`` <= 0 means no limit.

    The same rules, in the same order, as transformers' ``TopKLogitsWarper`` then
    ``TopPLogitsWarper``: a token is dropped from the nucleus when the probability mass of the
    tokens ranked above it already reaches ``top_p`` (the top token always stays).
    """
    if top_k is not None and 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the mass before it already reaches top_p (the first token always stays)
        drop_sorted = (probs.cumsum(dim=-1) - probs) >= top_p
        drop = drop_sorted.scatter(-1, sorted_idx, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_tokens(
    logits: torch.Tensor,
    temperature: float,
    top_k: int,
    top_p: float,
    do_sample: bool,
    generator: torch.Generator | None = None,
    inplace: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Next tokens and their log-probs under the temperature-scaled distribution.

    The returned log-prob is that of the temperature-scaled logits before top-k/top-p
    filtering, which is what the actor recomputes as the old log-prob. With ``inplace`` a
    float32 ``logits`` is scaled in place (the caller's scratch buffer), saving a copy.

    Sampling is by inverse CDF: one uniform per row against the running sum of
    exp(logit - max), the same law as ``torch.multinomial`` on the softmax (which draws the
    same way) at a fraction of its CPU cost on large vocabularies; the running sum's last
    entry also gives the log-normaliser, so no separate softmax or log-softmax is built.
    """
    if logits.dtype != torch.float32 and logits.dtype != torch.float64:
        logits, inplace = logits.float(), True
    if not do_sample or temperature <= 0:
        tokens = logits.argmax(dim=-1)
        logp = logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
        return tokens, logp
    if temperature != 1.0:
        scaled = logits.div_(temperature) if inplace else logits / temperature
    else:
        scaled = logits
    filtered = filter_logits(scaled, top_k, top_p)
    top = scaled.amax(dim=-1, keepdim=True)  # the top token always survives filtering
    cdf = torch.exp(filtered - top).cumsum_(dim=-1)
    total = cdf[:, -1:]
    u = torch.rand(total.shape, generator=generator, device=total.device, dtype=total.dtype) * total
    tokens = torch.searchsorted(cdf, u, right=True).clamp_(max=cdf.shape[-1] - 1).squeeze(-1)
    if filtered is scaled:
        log_z = top.squeeze(-1) + total.squeeze(-1).log()
    else:
        log_z = torch.logsumexp(scaled, dim=-1)
    logp = scaled.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - log_z
    return tokens, logp
