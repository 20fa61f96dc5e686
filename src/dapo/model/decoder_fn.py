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
# rotary types whose frequencies depend on the longest position in the call
LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")


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
    # decode-time copies (see ``DecoderFn.decode``): transposed, the RMSNorm weight (times
    # sqrt(hidden)) folded into the matmul that follows the norm, and the q rows of qkv
    # pre-multiplied by the attention scale (rotary embedding is linear, so they commute)
    qkv_t: torch.Tensor
    qkv_bs: torch.Tensor | None
    ln1_c: torch.Tensor  # sqrt(hidden * eps), 0-dim
    o_t: torch.Tensor
    gu_t: torch.Tensor
    ln2_c: torch.Tensor
    down_t: torch.Tensor


class RotaryTable(NamedTuple):
    """cos and sign-folded sin per position, [positions, head_dim]: ``rope(x) = x * cos +
    roll(x, head_dim/2) * sin`` (``rotate_half(x)`` is ``roll`` with the first half negated)."""

    cos: torch.Tensor
    sin: torch.Tensor


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
        q_rows = self.n_heads * self.head_dim
        with torch.no_grad():
            for layer in self.layers:
                a, m = layer.self_attn, layer.mlp
                qkv_w = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])
                qkv_b = _cat_bias(a.q_proj, a.k_proj, a.v_proj)
                root_h = float(qkv_w.shape[1]) ** 0.5
                ln1 = layer.input_layernorm.weight
                ln2 = layer.post_attention_layernorm.weight
                qkv_ws = qkv_w * (ln1 * root_h)
                qkv_ws[:q_rows] *= self.scale
                qkv_bs = None
                if qkv_b is not None:
                    qkv_bs = qkv_b.clone()
                    qkv_bs[:q_rows] *= self.scale
                gu_w = torch.cat([m.gate_proj.weight, m.up_proj.weight])
                out.append(
                    _Fused(
                        ln1=layer.input_layernorm.weight,
                        ln1_eps=_eps(layer.input_layernorm),
                        qkv_w=qkv_w,
                        qkv_b=qkv_b,
                        o_w=a.o_proj.weight,
                        o_b=a.o_proj.bias,
                        ln2=layer.post_attention_layernorm.weight,
                        ln2_eps=_eps(layer.post_attention_layernorm),
                        gu_w=gu_w,
                        gu_b=_cat_bias(m.gate_proj, m.up_proj),
                        down_w=m.down_proj.weight,
                        down_b=m.down_proj.bias,
                        act=m.act_fn,
                        qkv_t=qkv_ws.t(),
                        qkv_bs=qkv_bs,
                        ln1_c=self._norm_const(layer.input_layernorm, qkv_w.shape[1]),
                        o_t=a.o_proj.weight.t(),
                        gu_t=(gu_w * (ln2 * root_h)).t(),
                        ln2_c=self._norm_const(layer.post_attention_layernorm, qkv_w.shape[1]),
                        down_t=m.down_proj.weight.t(),
                    )
                )
        return out

    def _norm_const(self, norm: torch.nn.Module, hidden: int) -> torch.Tensor:
        return torch.tensor(
            (hidden * _eps(norm)) ** 0.5, dtype=torch.float32, device=self.embed.weight.device
        )

    def head(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The final norm folded into the LM head, for ``decode``: (weight^T, norm constant, bias).
        A vocabulary x hidden copy, made once per rollout."""
        with torch.no_grad():
            hidden = self.lm_head.weight.shape[1]
            w = self.lm_head.weight * (self.norm.weight * float(hidden) ** 0.5)
        return w.t(), self._norm_const(self.norm, hidden), self.lm_head.bias

    def rotary_table(self, length: int, device: torch.device) -> RotaryTable | None:
        """The model's own rotary embedding evaluated at positions 0..length-1, once per rollout;
        None for rotary types whose frequencies depend on the longest position seen (dynamic
        NTK, longrope): ``decode`` then evaluates the module per step, as transformers does."""
        if getattr(self.rotary, "rope_type", "default") in LENGTH_DEPENDENT_ROPE:
            return None
        with torch.no_grad():
            probe = self.embed.weight.new_zeros((1, 1, 1))
            cos, sin = self.rotary(probe, torch.arange(length, device=device).unsqueeze(0))
        return RotaryTable(cos[0].contiguous(), self._fold_sign(sin[0]).contiguous())

    def _fold_sign(self, sin: torch.Tensor) -> torch.Tensor:
        half = self.head_dim // 2
        return torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)

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

    def new_cache(self, rows: int, width: int, device: torch.device) -> torch.Tensor:
        """Keys and values of every layer in one tensor [layers, 2, rows, kv_heads, width, head_dim]
        (one copy compacts all of it)."""
        shape = (len(self.layers), 2, rows, self.n_kv, width, self.head_dim)
        return torch.empty(shape, dtype=self.dtype, device=device)

    @staticmethod
    def compact_cache(cache: torch.Tensor, keep: torch.Tensor, used: int) -> torch.Tensor:
        """The cache of rows ``keep`` only; columns past ``used`` (not yet written) are not copied."""
        out = cache.new_empty(cache.shape[:2] + (keep.numel(),) + cache.shape[3:])
        out[..., :used, :] = cache[..., :used, :].index_select(2, keep)
        return out

    def prefill(
        self,
        fused: list[_Fused],
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        cache: torch.Tensor,
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
        for i, f in enumerate(fused):

            def attend(q, k, v, i=i):
                cache[i, 0, :, :, :p] = k.repeat_interleave(repeat, dim=0) if repeat > 1 else k
                cache[i, 1, :, :, :p] = v.repeat_interleave(repeat, dim=0) if repeat > 1 else v
                return self._sdpa(q, k, v, mask)

            h = self._fused_layer(f, h, cos, sin, attend)
        return self.logits(h[:, -1])

    def decode(
        self,
        fused: list[_Fused],
        head: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None],
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: torch.Tensor,
        column: int,
        key_bias: torch.Tensor,
        rope: RotaryTable | None,
    ) -> torch.Tensor:
        """One token per row: tokens/positions [b]; write cache column ``column``; attend over
        columns 0..column with additive ``key_bias`` [b, column+1] (0 or -inf). Returns logits [b, V].

        At rollout batch sizes a step costs more in op count than in arithmetic, so activations
        stay two-dimensional and ops are merged: RMSNorm(x) @ W^T is computed as
        (x @ (W * w * sqrt(H))^T) / hypot(|x|, sqrt(H * eps)) (the same value: RMSNorm is
        x * w / sqrt(mean(x^2) + eps)), residual adds ride on ``addmm``, the attention scale on
        the q weights."""
        b = tokens.shape[0]
        nq, nk, d = self.n_heads, self.n_kv, self.head_dim
        g, half, qk_cols = nq // nk, d // 2, (nq + nk) * d
        h = F.embedding(tokens, self.embed.weight)
        if rope is not None:
            cos, sin = rope.cos[positions], rope.sin[positions]
        else:
            cos, sin = self.rotary(h.unsqueeze(1), positions.unsqueeze(-1))
            cos, sin = cos[:, 0], self._fold_sign(sin[:, 0])
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        bias = key_bias[:, None, None, :]
        for i, f in enumerate(fused):
            qkv = self._normed_mm(h, f.qkv_t, f.ln1_c, f.qkv_bs)
            qk = qkv[:, :qk_cols].view(b, nq + nk, d)
            qk = torch.addcmul(qk * cos, torch.roll(qk, half, dims=-1), sin)
            kc, vc = cache[i, 0], cache[i, 1]
            kc[:, :, column] = qk[:, nq:]
            vc[:, :, column] = qkv[:, qk_cols:].view(b, nk, d)
            scores = torch.matmul(qk[:, :nq].reshape(b, nk, g, d), kc[:, :, : column + 1].transpose(-1, -2))
            scores.add_(bias)
            if scores.dtype == torch.float32:
                probs = torch.softmax(scores, dim=-1)
            else:
                probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(scores.dtype)
            o = torch.matmul(probs, vc[:, :, : column + 1]).view(b, nq * d)
            h = torch.addmm(h, o, f.o_t) if f.o_b is None else torch.addmm(h + f.o_b, o, f.o_t)
            gu = self._normed_mm(h, f.gu_t, f.ln2_c, f.gu_b)
            inter = gu.shape[-1] // 2
            act = f.act(gu[:, :inter]).mul_(gu[:, inter:])
            h = (
                torch.addmm(h, act, f.down_t)
                if f.down_b is None
                else torch.addmm(h + f.down_b, act, f.down_t)
            )
        return self._normed_mm(h, *head)

    @staticmethod
    def _normed_mm(
        h: torch.Tensor, w_t: torch.Tensor, c: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        """RMSNorm(h) @ W^T (+ bias) with the norm weight and sqrt(H) folded into ``w_t``:
        (h @ w_t) / sqrt(sum(h^2) + H * eps). float16 divides first: its range would not hold
        h @ w_t, which is |h| times larger than the normalised product."""
        den = torch.hypot(torch.linalg.vector_norm(h, dim=-1, keepdim=True, dtype=torch.float32), c)
        if h.dtype == torch.float16:
            out = torch.mm((h / den).to(h.dtype), w_t)
            return out if bias is None else out.add_(bias)
        den = den.to(h.dtype)
        if bias is None:
            return torch.mm(h, w_t).div_(den)
        return torch.addcdiv(bias, torch.mm(h, w_t), den)

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
