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


def pack_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, torch.Tensor | list[int]]:
    """The real tokens of every row, concatenated: ids [N], positions restarting at 0 per row,
    ``cu_seqlens`` (row j is ``cu[j]:cu[j+1]``) and each token's packed index ``where`` [b, T]
    (-1 on padding). Positions follow the padded path (cumsum of the mask - 1)."""
    mask = attention_mask.bool()
    lengths = mask.sum(-1)
    where = mask.flatten().long().cumsum(0).view_as(mask) - 1
    where = where.masked_fill(~mask, -1)
    positions = attention_mask.long().cumsum(-1) - 1
    cu = [0, *lengths.cumsum(0).tolist()]
    return {"ids": input_ids[mask], "positions": positions[mask], "cu_seqlens": cu, "where": where}


def packed_response_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_width: int,
    temperature: float,
    calculate_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``response_logprobs`` without padding (``use_remove_padding``): the rows' real tokens run
    as one packed sequence, positions restarting per row and attention confined to each row, and
    the head runs only on the positions that predict response tokens. Same values as the padded
    computation (float tolerance). Models the lean decoder does not cover use the padded path."""
    from dapo.model.decoder_fn import DecoderFn, supports

    if not supports(model) or _dropout_active(model):
        return response_logprobs(
            model, input_ids, attention_mask, response_width, temperature, calculate_entropy
        )
    packed, resp_mask, target = pack_responses(input_ids, attention_mask, response_width)
    fn = DecoderFn(model)
    hidden = fn.packed_hidden(packed["ids"], packed["positions"], packed["cu_seqlens"])
    logits = fn.logits(hidden[target - 1])
    logp, ent = logprobs_and_entropy(logits, packed["ids"][target], temperature, calculate_entropy)
    return unpack_responses(logp, resp_mask), unpack_responses(ent, resp_mask)


def pack_responses(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, response_width: int
) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """``pack_rows`` plus the response mask [b, R] and the packed index of every response token."""
    prompt_width = input_ids.shape[1] - response_width
    packed = pack_rows(input_ids, attention_mask)
    resp_mask = attention_mask[:, prompt_width:].bool()
    target = packed["where"][:, prompt_width:][resp_mask]
    if bool((attention_mask[:, :prompt_width].sum(-1) == 0)[resp_mask.any(-1)].any()):
        raise ValueError("a row with response tokens has an empty prompt: nothing predicts its first token")
    return packed, resp_mask, target


def unpack_responses(values: torch.Tensor | None, resp_mask: torch.Tensor) -> torch.Tensor | None:
    """Per-response-token values back to [b, R] (zeros on padding)."""
    if values is None:
        return None
    b, width = resp_mask.shape
    flat = resp_mask.flatten().nonzero().squeeze(-1)
    return values.new_zeros(b * width).index_put((flat,), values).view(b, width)


def _dropout_active(model: torch.nn.Module) -> bool:
    """The lean forward has no dropout: in training mode with dropout > 0 use the model's own."""
    if not model.training:
        return False
    cfg = model.config
    return any(
        float(getattr(cfg, k, 0.0) or 0.0) > 0 for k in ("attention_dropout", "hidden_dropout", "dropout")
    )
