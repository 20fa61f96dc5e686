"""Ulysses sequence parallelism for the packed (remove-padding) forward.

The rows of a micro-batch are packed into one sequence of N real tokens, padded to a multiple of
the SP size and cut into equal slices, one per rank of the SP group. Everything outside attention
(embedding, projections, MLP, head) runs on the rank's slice. Around attention an all-to-all turns
sequence-sharded q/k/v [1, heads, N/sp, d] into head-sharded ones [1, heads/sp, N, d], so each
rank attends over the whole sequence for its share of the heads, and the inverse all-to-all turns
the output back. The log-probs of the slices are gathered at the end; every rank of the group then
holds the same values and computes the same loss.

Gradients: the all-to-all's backward is the inverse all-to-all, and the gather's backward keeps the
rank's own slice of the gradient, so each rank's parameter gradients are the contributions of the
computations it ran, and their sum over the SP group is the gradient of the unsplit forward (the
FSDP worker scales its loss so that FSDP's average over all ranks gives that sum).

Rules (as verl): ``num_attention_heads % sp == 0``; ``num_key_value_heads % sp == 0`` or
``sp % num_key_value_heads == 0`` (then every kv head is repeated ``sp / kv_heads`` times before the
all-to-all). NCCL runs ``all_to_all_single``; backends without all-to-all (gloo) use an all-gather
and keep their own chunk, which gives the same values.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dapo.algo.entropy import logprobs_and_entropy

ATTN_NAME = "dapo_packed_varlen"


def sp_problem(num_attention_heads: int, num_key_value_heads: int, sp: int) -> str | None:
    """Why ``sp`` cannot split these heads (None when it can)."""
    if sp < 1:
        return f"must be >= 1, got {sp}"
    if num_attention_heads % sp:
        return f"{sp} does not divide the model's num_attention_heads={num_attention_heads}"
    if num_key_value_heads % sp and sp % num_key_value_heads:
        return (
            f"{sp} and the model's num_key_value_heads={num_key_value_heads}: one must divide the other "
            "(kv heads are repeated when there are fewer than the SP size)"
        )
    return None


def model_heads(model_path: str | None) -> tuple[int, int] | None:
    """(num_attention_heads, num_key_value_heads) from a model directory's config.json (the
    built-in tiny model's when ``model_path`` is None); None when it cannot be read."""
    import inspect
    import json
    from pathlib import Path

    if model_path is None:
        from dapo.model.tiny import tiny_config

        params = inspect.signature(tiny_config).parameters
        return int(params["num_attention_heads"].default), int(params["num_key_value_heads"].default)
    f = Path(str(model_path)).expanduser() / "config.json"
    try:
        c = json.loads(f.read_text())
    except (OSError, ValueError):
        return None
    c = c.get("text_config", c) if isinstance(c, dict) else {}
    heads = c.get("num_attention_heads")
    if not isinstance(heads, int):
        return None
    kv = c.get("num_key_value_heads") or heads
    return heads, int(kv)


def config_problems(cfg: Any) -> list[str]:
    """``actor.ulysses_sequence_parallel_size`` must split the model's attention heads (read from
    its config.json, before any process starts; ``dapo.run_config`` hands this to the pipeline)."""
    key = "actor_rollout_ref.actor.ulysses_sequence_parallel_size"
    sp = int(cfg.actor_rollout_ref.actor.ulysses_sequence_parallel_size)
    if sp <= 1:
        return []
    heads = model_heads(cfg.actor_rollout_ref.model.path)
    why = sp_problem(heads[0], heads[1], sp) if heads is not None else None
    return [f"{key}={sp}: {why}; choose an SP size that divides the attention heads"] if why else []


def _group_size(group: Any) -> int:
    return 1 if group is None else dist.get_world_size(group)


def all_to_all(x: torch.Tensor, scatter_dim: int, gather_dim: int, group: Any) -> torch.Tensor:
    """Split ``x`` in ``sp`` chunks along ``scatter_dim``, send chunk j to rank j of ``group``, and
    concatenate the chunks received, in rank order, along ``gather_dim``."""
    sp = _group_size(group)
    if sp == 1:
        return x
    chunks = [c.contiguous() for c in x.chunk(sp, dim=scatter_dim)]
    if dist.get_backend(group) == "nccl":
        send = torch.stack(chunks)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=group)
        return torch.cat(list(recv.unbind(0)), dim=gather_dim)
    # gloo has no all-to-all: gather every rank's input and keep this rank's chunk of each
    rank = dist.get_rank(group)
    full = [torch.empty_like(x.contiguous()) for _ in range(sp)]
    dist.all_gather(full, x.contiguous(), group=group)
    return torch.cat([f.chunk(sp, dim=scatter_dim)[rank] for f in full], dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scatter_dim: int, gather_dim: int, group: Any) -> torch.Tensor:
        ctx.dims, ctx.group = (scatter_dim, gather_dim), group
        return all_to_all(x, scatter_dim, gather_dim, group)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor):
        scatter_dim, gather_dim = ctx.dims
        return all_to_all(g.contiguous(), gather_dim, scatter_dim, ctx.group), None, None, None


class _GatherSeq(torch.autograd.Function):
    """All-gather along dim 0; backward keeps this rank's slice (every rank computes the same loss
    from the gathered tensor, so the slice's gradient is already complete)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group, ctx.n = group, x.shape[0]
        parts = [torch.empty_like(x) for _ in range(_group_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor):
        r = dist.get_rank(ctx.group)
        return g[r * ctx.n : (r + 1) * ctx.n].contiguous(), None


def seq_to_heads(x: torch.Tensor, group: Any) -> torch.Tensor:
    """[b, heads, n/sp, d] on each rank -> [b, heads/sp, n, d]."""
    return x if _group_size(group) == 1 else _AllToAll.apply(x, 1, 2, group)


def heads_to_seq(x: torch.Tensor, group: Any) -> torch.Tensor:
    """[b, heads/sp, n, d] -> [b, heads, n/sp, d]."""
    return x if _group_size(group) == 1 else _AllToAll.apply(x, 2, 1, group)


def gather_seq(x: torch.Tensor, group: Any) -> torch.Tensor:
    return x if _group_size(group) == 1 else _GatherSeq.apply(x, group)


def _packed_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    dapo_packed: tuple[list[tuple[int, int]], Any] | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """A transformers attention function. With ``dapo_packed`` = (sequence bounds of the whole
    packed row, SP group or None): causal attention within each packed sequence, with the
    all-to-all around it for an SP group. Without it: the model's previous attention function,
    unchanged (padded forwards keep working on a model that was switched)."""
    if dapo_packed is None:
        base = _BASE_ATTENTION[module.config._attn_implementation]
        return base(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    bounds, group = dapo_packed
    sp = _group_size(group)
    if sp > 1 and key.shape[1] < sp:  # fewer kv heads than ranks: repeat each
        rep = sp // key.shape[1]
        key, value = key.repeat_interleave(rep, dim=1), value.repeat_interleave(rep, dim=1)
    q, k, v = seq_to_heads(query, group), seq_to_heads(key, group), seq_to_heads(value, group)
    gqa = q.shape[1] != k.shape[1]
    outs = [
        F.scaled_dot_product_attention(
            q[:, :, s:e],
            k[:, :, s:e],
            v[:, :, s:e],
            dropout_p=dropout,
            is_causal=True,
            scale=scaling,
            enable_gqa=gqa,
        )
        for s, e in bounds
    ]
    o = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
    return heads_to_seq(o, group).transpose(1, 2).contiguous(), None


_BASE_ATTENTION: dict[str, Any] = {}


def use_packed_attention(model: torch.nn.Module) -> None:
    """Switch ``model`` to ``_packed_attention`` (idempotent). The switch is permanent rather than
    scoped to a call so that activation checkpointing, which re-runs the forward during backward,
    sees the same function; the packed layout itself travels in the forward's keyword arguments."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    cfg = model.config
    before = cfg._attn_implementation
    if before.startswith(ATTN_NAME):
        return
    name = f"{ATTN_NAME}_{before}"
    if name not in _BASE_ATTENTION:
        # eager lives in each model's module, not in the registry: sdpa computes the same
        base = (
            ALL_ATTENTION_FUNCTIONS[before] if before in ALL_ATTENTION_FUNCTIONS else sdpa_attention_forward
        )
        _BASE_ATTENTION[name] = base
        AttentionInterface.register(name, _packed_attention)
        mask = ALL_MASK_ATTENTION_FUNCTIONS._global_mapping.get(before)
        if mask is not None:
            AttentionMaskInterface.register(name, mask)
    cfg._attn_implementation = name


def ulysses_response_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_width: int,
    temperature: float,
    calculate_entropy: bool = False,
    group: Any = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``dapo.actor.forward.response_logprobs`` through the model's own forward (so FSDP's hooks
    run), packed without padding and split over the SP ``group`` (None: one rank). Every rank of
    the group must call it with the same rows."""
    from dapo.actor.forward import pack_responses, unpack_responses

    sp, rank = _group_size(group), (0 if group is None else dist.get_rank(group))
    packed, resp_mask, target = pack_responses(input_ids, attention_mask, response_width)
    cu = packed["cu_seqlens"]
    n = cu[-1]
    pad = (-n) % sp
    ids = F.pad(packed["ids"], (0, pad))
    pos = F.pad(packed["positions"], (0, pad))
    labels = torch.roll(ids, -1)  # token i predicts i + 1
    bounds = list(zip(cu[:-1], cu[1:])) + ([(n, n + pad)] if pad else [])
    width = (n + pad) // sp
    sl = slice(rank * width, (rank + 1) * width)
    use_packed_attention(model)
    # a 4-D mask is passed through untouched: transformers builds none (the packed attention
    # ignores it), where position_ids alone would make it build a block mask over the slice
    no_mask = torch.ones((1, 1, 1, 1), dtype=torch.bool, device=ids.device)
    logits = model(
        input_ids=ids[sl][None],
        position_ids=pos[sl][None],
        attention_mask=no_mask,
        use_cache=False,
        dapo_packed=(bounds, group),
    ).logits[0]
    logp, ent = logprobs_and_entropy(logits, labels[sl], temperature, calculate_entropy)
    logp = gather_seq(logp, group)[target - 1]
    ent = gather_seq(ent, group)[target - 1] if ent is not None else None
    return unpack_responses(logp, resp_mask), unpack_responses(ent, resp_mask)


def sp_groups(world: int, sp: int) -> tuple[Any, list[int]]:
    """Create the SP groups of consecutive ranks (every rank must call this, in the same order);
    returns this rank's group and its members."""
    rank = dist.get_rank()
    mine, members = None, []
    for start in range(0, world, sp):
        ranks = list(range(start, start + sp))
        g = dist.new_group(ranks)
        if rank in ranks:
            mine, members = g, ranks
    return mine, members
