"""Shared pieces of the benchmarks: models, a matmul peak, interleaved timing, FLOP counts."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from dapo.batch import Batch


def set_threads(threads: int) -> None:
    torch.set_num_threads(max(1, threads))


def interleaved(
    ours: Callable[[], float],
    baseline: Callable[[], float],
    repeats: int,
    probe: Callable[[], float] | None = None,
) -> dict[str, Any]:
    """Run ``ours`` and ``baseline`` alternately (order flipped each round); each returns the
    work it did (tokens). Returns median tokens/s of each and the median of per-round ratios.
    ``probe`` (a short matmul-peak measurement) runs before every round; the best value is
    returned as ``peak``, so the peak is measured under the same load as the runs."""
    ours_tps, base_tps, ratios, peaks = [], [], [], []
    for i in range(repeats):
        if probe is not None:
            peaks.append(probe())
        pair = []
        for which in (0, 1) if i % 2 == 0 else (1, 0):
            fn = ours if which == 0 else baseline
            t = time.perf_counter()
            work = fn()
            pair.append((which, work / (time.perf_counter() - t)))
        d = dict(pair)
        ours_tps.append(d[0])
        base_tps.append(d[1])
        ratios.append(d[0] / d[1])
    return {
        "ours_tokens_per_s": statistics.median(ours_tps),
        "baseline_tokens_per_s": statistics.median(base_tps),
        "speedup": statistics.median(ratios),
        "ratios": ratios,
        "peak": max(peaks) if peaks else None,
    }


def qwen2_100m_config(vocab_size: int = 32000, pad_id: int = 0, eos_id: int = 2):
    """A ~100M-parameter Qwen2 shape (12 layers, hidden 768, GQA 12/4 heads, tied 32k vocab)."""
    from dapo.model.tiny import tiny_config

    return tiny_config(
        vocab_size,
        pad_id,
        eos_id,
        hidden_size=768,
        num_hidden_layers=12,
        intermediate_size=2048,
        num_attention_heads=12,
        num_key_value_heads=4,
        max_position_embeddings=1024,
    )


def build_100m(seed: int = 0, dtype: torch.dtype = torch.float32):
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(qwen2_100m_config()).to(dtype)
    model.generation_config.eos_token_id = 2
    model.generation_config.pad_token_id = 0
    return model.eval()


def load_default(dtype: torch.dtype = torch.float32):
    """The built-in tiny model (warm-started, cached) and its tokenizer."""
    from dapo.model.loader import load_model, load_tokenizer
    from dapo.tasks import builtin_model

    path = builtin_model(log=lambda s: None)
    return load_model(path, dtype=dtype).eval(), load_tokenizer(path)


def param_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def forward_flops_per_token(model: torch.nn.Module, context: float) -> float:
    """Dense forward FLOPs for one token: 2 x (every matmul weight, the head included) plus
    attention's 4 x layers x hidden x context (QK^T and PV over ``context`` keys)."""
    cfg = model.config
    inner = model.model
    matmul_params = sum(p.numel() for n, p in inner.layers.named_parameters() if p.dim() == 2)
    matmul_params += model.lm_head.weight.numel()
    heads_dim = cfg.num_attention_heads * (
        getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    )
    return 2.0 * matmul_params + 4.0 * cfg.num_hidden_layers * heads_dim * context


def fmt_table(rows: list[dict[str, Any]], cols: list[str]) -> str:
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
        return str(v)

    body = [[cell(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(b[i]) for b in body)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(b, widths)) for b in body]
    return "\n".join(lines)


def padded_rl_batch(
    prompt_lens: Any,
    response_lens: Any,
    p_max: int,
    r_max: int,
    vocab: int,
    generator: torch.Generator,
    token_low: int = 3,
    group_size: int = 8,
) -> Batch:
    """A synthetic actor batch: random tokens in left-padded prompts and right-padded responses of
    the given lengths, random old log-probs and one random advantage per row; uids group
    ``group_size`` consecutive rows. Used by the update bench and the actor/distributed tests."""
    rows = len(prompt_lens)
    prompts = torch.zeros((rows, p_max), dtype=torch.long)
    responses = torch.zeros((rows, r_max), dtype=torch.long)
    pmask = torch.zeros((rows, p_max), dtype=torch.long)
    rmask = torch.zeros((rows, r_max), dtype=torch.long)
    for i in range(rows):
        pl, rl = int(prompt_lens[i]), int(response_lens[i])
        prompts[i, p_max - pl :] = torch.randint(token_low, vocab, (pl,), generator=generator)
        pmask[i, p_max - pl :] = 1
        responses[i, :rl] = torch.randint(token_low, vocab, (rl,), generator=generator)
        rmask[i, :rl] = 1
    return Batch(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], 1),
            "attention_mask": torch.cat([pmask, rmask], 1),
            "response_mask": rmask,
            "old_log_probs": -torch.rand((rows, r_max), generator=generator) * 3 * rmask,
            "advantages": torch.randn((rows, 1), generator=generator).expand(rows, r_max) * rmask,
        },
        non_tensors={"uid": [str(i // group_size) for i in range(rows)]},
    )
