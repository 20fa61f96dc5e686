"""A lean forward pass over a Hugging Face Llama-family decoder, reusing the model's own modules.

``transformers``' forward builds attention masks, cache objects and output records on every
call; for small models on CPU that bookkeeping costs more than the arithmetic. This module runs
the same arithmetic (the model's own embedding, norms, projections, rotary embedding, MLP and
head, called directly, so weights, dtypes and gradients are the model's) with three attention
layouts:

* ``prefill``: left-padded prompts, writing keys/values into a preallocated cache whose rows
  may repeat each prompt ``n`` times (the prompt is computed once, its cache shared by copy);
* ``decode``: one new token per row against the cache;
* ``packed``: sequences concatenated into one row with positions restarting per sequence and
  attention confined to each sequence (``cu_seqlens``), for training without padding.

Supported: ``qwen2``, ``llama`` and ``mistral`` without sliding windows (``supports``). Anything
else goes through the model's own forward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

SUPPORTED_MODEL_TYPES = ("qwen2", "llama", "mistral")


def supports(model: torch.nn.Module) -> bool:
    """True when ``model`` has the Llama-family layout this module computes exactly."""
    cfg = getattr(model, "config", None)
    inner = getattr(model, "model", None)
    if cfg is None or inner is None or getattr(cfg, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return False
    if getattr(cfg, "use_sliding_window", False) or "sliding_attention" in (
        getattr(cfg, "layer_types", None) or []
    ):
        return False
    if cfg.model_type == "mistral" and getattr(cfg, "sliding_window", None) is not None:
        return False
    if not all(hasattr(inner, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return False
    if not hasattr(model, "lm_head"):
        return False
    for layer in inner.layers:
        attn = getattr(layer, "self_attn", None)
        if attn is None or any(hasattr(attn, a) for a in ("q_norm", "k_norm")):
            return False
        if not all(hasattr(attn, a) for a in ("q_proj", "k_proj", "v_proj", "o_proj", "scaling")):
            return False
        if not all(hasattr(layer, a) for a in ("input_layernorm", "post_attention_layernorm", "mlp")):
            return False
    return True


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + _rotate_half(x) * sin


def _checkpointing(model: torch.nn.Module) -> bool:
    """Whether ``gradient_checkpointing_enable()`` was called (the attribute was renamed in v5)."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), name):
            return bool(getattr(model, name))
    return False


class _Fused(NamedTuple):
    ln1: torch.Tensor
    ln1_eps: float
    qkv_w: torch.Tensor
    qkv_b: torch.Tensor | None
    o_w: torch.Tensor
    o_b: torch.Tensor | None
    ln2: torch.Tensor
    ln2_eps: float
    gu_w: torch.Tensor
    gu_b: torch.Tensor | None
    down_w: torch.Tensor
    down_b: torch.Tensor | None
    act: Callable[[torch.Tensor], torch.Tensor]


def _eps(norm: torch.nn.Module) -> float:
    return float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))


def _cat_bias(*linears: torch.nn.Linear) -> torch.Tensor | None:
    if all(lin.bias is None for lin in linears):
        return None
    return torch.cat(
        [lin.bias if lin.bias is not None else lin.weight.new_zeros(lin.out_features) for lin in linears]
    )


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNorm: normalise in float32, cast back, then scale."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return weight * F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype)


class DecoderFn:
    """Forward passes over ``model``'s modules. Cheap to build; holds no state but references."""

    def __init__(self, model: torch.nn.Module):
        if not supports(model):
            raise ValueError(f"{type(model).__name__} is not a supported Llama-family decoder")
        self.model = model
        cfg = model.config
        inner = model.model
        self.embed = inner.embed_tokens
        self.layers = list(inner.layers)
        self.norm = inner.norm
        self.rotary = inner.rotary_emb
        self.lm_head = model.lm_head
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.scale = float(self.layers[0].self_attn.scaling)
        self.gqa = self.n_heads != self.n_kv

    # ------------------------------------------------------------------ building blocks
    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    def _qkv(self, layer, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        b, t, _ = h.shape
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        q = attn.q_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = attn.k_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        v = attn.v_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return _rope(q, cos, sin), _rope(k, cos, sin), v

    def _finish(self, layer, h: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        b, _, t, _ = o.shape
        h = h + layer.self_attn.o_proj(o.transpose(1, 2).reshape(b, t, -1))
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def _sdpa(self, q, k, v, mask=None, causal=False):
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal, scale=self.scale, enable_gqa=self.gqa
        )

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(hidden))

    # ------------------------------------------------------------------ rollout
    def fuse(self) -> list[_Fused]:
        """Inference weights with q/k/v and gate/up concatenated (fewer, larger matmuls).

        Built from the current parameters (call again after an optimizer step); no gradients."""
        out = []
        with torch.no_grad():
            for layer in self.layers:
                a, m = layer.self_attn, layer.mlp
                out.append(
                    _Fused(
                        ln1=layer.input_layernorm.weight,
                        ln1_eps=_eps(layer.input_layernorm),
                        qkv_w=torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]),
                        qkv_b=_cat_bias(a.q_proj, a.k_proj, a.v_proj),
                        o_w=a.o_proj.weight,
                        o_b=a.o_proj.bias,
                        ln2=layer.post_attention_layernorm.weight,
                        ln2_eps=_eps(layer.post_attention_layernorm),
                        gu_w=torch.cat([m.gate_proj.weight, m.up_proj.weight]),
                        gu_b=_cat_bias(m.gate_proj, m.up_proj),
                        down_w=m.down_proj.weight,
                        down_b=m.down_proj.bias,
                        act=m.act_fn,
                    )
                )
        return out

    def _fused_layer(self, f: _Fused, h: torch.Tensor, cos, sin, attend) -> torch.Tensor:
        b, t, _ = h.shape
        nq, nk = self.n_heads, self.n_kv
        qkv = F.linear(_rms(h, f.ln1, f.ln1_eps), f.qkv_w, f.qkv_b).view(b, t, nq + 2 * nk, self.head_dim)
        qk = _rope(qkv[:, :, : nq + nk].transpose(1, 2), cos.unsqueeze(1), sin.unsqueeze(1))
        q, k = qk[:, :nq], qk[:, nq:]
        v = qkv[:, :, nq + nk :].transpose(1, 2)
        o = attend(q, k, v)
        h = h + F.linear(o.transpose(1, 2).reshape(b, t, -1), f.o_w, f.o_b)
        g, u = F.linear(_rms(h, f.ln2, f.ln2_eps), f.gu_w, f.gu_b).chunk(2, dim=-1)
        return h + F.linear(f.act(g) * u, f.down_w, f.down_b)

    def new_cache(
        self, rows: int, width: int, device: torch.device
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        shape = (rows, self.n_kv, width, self.head_dim)
        keys = [torch.empty(shape, dtype=self.dtype, device=device) for _ in self.layers]
        values = [torch.empty(shape, dtype=self.dtype, device=device) for _ in self.layers]
        return keys, values

    def prefill(
        self,
        fused: list[_Fused],
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        cache: tuple[list[torch.Tensor], list[torch.Tensor]],
        repeat: int = 1,
    ) -> torch.Tensor:
        """Run left-padded prompts [B, P]; write their keys/values, each repeated ``repeat`` times
        (row-major: prompt i fills cache rows i*repeat .. i*repeat+repeat-1), into cache columns
        0..P-1. Returns the last column's logits [B, V]."""
        b, p = input_ids.shape
        valid = attention_mask.bool()
        pos = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        causal = torch.ones(p, p, dtype=torch.bool, device=input_ids.device).tril()
        # a pad query sees itself, so no softmax row is empty (no NaN), and real queries never see pads
        eye = torch.eye(p, dtype=torch.bool, device=input_ids.device)
        mask = (causal & (valid[:, None, :] | eye)).unsqueeze(1)
        h = self.embed(input_ids)
        cos, sin = self.rotary(h, pos)
        keys, values = cache

        for i, f in enumerate(fused):

            def attend(q, k, v, i=i):
                keys[i][:, :, :p] = k.repeat_interleave(repeat, dim=0) if repeat > 1 else k
                values[i][:, :, :p] = v.repeat_interleave(repeat, dim=0) if repeat > 1 else v
                return self._sdpa(q, k, v, mask)

            h = self._fused_layer(f, h, cos, sin, attend)
        return self.logits(h[:, -1])

    def decode(
        self,
        fused: list[_Fused],
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: tuple[list[torch.Tensor], list[torch.Tensor]],
        column: int,
        key_bias: torch.Tensor,
    ) -> torch.Tensor:
        """One token per row: tokens/positions [b]; write cache column ``column``; attend over
        columns 0..column with additive ``key_bias`` [b, column+1] (0 or -inf). Returns logits [b, V]."""
        b = tokens.shape[0]
        h = self.embed(tokens.unsqueeze(-1))
        cos, sin = self.rotary(h, positions.unsqueeze(-1))
        keys, values = cache
        nk, g, d = self.n_kv, self.n_heads // self.n_kv, self.head_dim
        bias = key_bias[:, None, None, :]

        for i, f in enumerate(fused):

            def attend(q, k, v, i=i):
                kc, vc = keys[i], values[i]
                kc[:, :, column] = k[:, :, 0]
                vc[:, :, column] = v[:, :, 0]
                # grouped-query attention for one query: the g query heads of a kv head form the
                # "rows" of one small matmul against that head's keys (no key/value copies)
                qg = q.reshape(b, nk, g, d)
                scores = (
                    torch.matmul(qg, kc[:, :, : column + 1].transpose(-1, -2)).mul_(self.scale).add_(bias)
                )
                probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
                return torch.matmul(probs, vc[:, :, : column + 1]).reshape(b, nk * g, 1, d)

            h = self._fused_layer(f, h, cos, sin, attend)
        return self.logits(h[:, 0])

    # ------------------------------------------------------------------ packed training forward
    def packed_hidden(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, cu_seqlens: list[int]
    ) -> torch.Tensor:
        """Final hidden states [N, H] (before the final norm) of sequences packed in one row.

        ``input_ids``/``position_ids`` are [N]; sequence j occupies ``cu_seqlens[j]:cu_seqlens[j+1]``
        and attends only within itself (causally)."""
        h = self.embed(input_ids.unsqueeze(0))
        cos, sin = self.rotary(h, position_ids.unsqueeze(0))
        bounds = list(zip(cu_seqlens[:-1], cu_seqlens[1:]))
        use_ckpt = _checkpointing(self.model) and torch.is_grad_enabled()
        for layer in self.layers:
            if use_ckpt and self.model.training:
                h = checkpoint(self._packed_layer, layer, h, cos, sin, bounds, use_reentrant=False)
            else:
                h = self._packed_layer(layer, h, cos, sin, bounds)
        return h[0]

    def _packed_layer(self, layer, h, cos, sin, bounds):
        q, k, v = self._qkv(layer, h, cos, sin)
        parts = [self._sdpa(q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], causal=True) for s, e in bounds]
        o = parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)
        return self._finish(layer, h, o)
