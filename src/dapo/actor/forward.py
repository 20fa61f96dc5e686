"""Response log-probs (and entropy) of a causal LM over a padded batch."""

from __future__ import annotations

import torch

from dapo.algo.entropy import logprobs_and_entropy


def response_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_width: int,
    temperature: float,
    calculate_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(response token) [b, R] (and entropy [b, R]) from temperature-scaled logits.

    ``input_ids`` is a left-padded prompt of width P followed by a right-padded response of
    width R = ``response_width``. Columns that are padding in every row are cut before the
    forward pass, so pad tokens shared by the whole micro-batch cost nothing; the result is
    scattered back to width R (zeros beyond the longest response).
    """
    b, total = input_ids.shape
    prompt_width = total - response_width
    live = attention_mask.bool().any(dim=0)
    first = int(live.nonzero()[0]) if live.any() else 0
    last = int(live.nonzero()[-1]) if live.any() else total - 1
    last = max(last, prompt_width)  # keep at least the first response column
    ids = input_ids[:, first : last + 1]
    attn = attention_mask[:, first : last + 1]
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False).logits
    resp_cols = last + 1 - prompt_width  # response columns present in the cut
    # logits at column c predict token c+1: responses start at prompt_width - first in the cut
    start = prompt_width - first - 1
    resp_logits = logits[:, start : start + resp_cols]
    labels = ids[:, start + 1 : start + 1 + resp_cols]
    logp, ent = logprobs_and_entropy(resp_logits, labels, temperature, calculate_entropy)
    out_lp = logp.new_zeros((b, response_width))
    out_lp[:, :resp_cols] = logp
    out_ent = None
    if ent is not None:
        out_ent = ent.new_zeros((b, response_width))
        out_ent[:, :resp_cols] = ent
    return out_lp, out_ent
