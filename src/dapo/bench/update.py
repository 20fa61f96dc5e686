"""``dapo bench update``: log-prob and PPO-update tokens/s with and without packing / dynamic bsz.

The batch has RL-like lengths: prompts of varying length, responses mostly short with a long
tail and a share truncated at the maximum. The baseline is the padded path with fixed
micro-batches of ``--micro`` rows; ``dyn`` uses token-budget micro-batches with a budget of
``micro x (prompt width + response width)`` tokens (the padded micro-batch's footprint), and
``packed`` is ``use_remove_padding``. Runs interleave; speedup is the median per-round ratio.
Tokens are real (non-pad) tokens processed.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np
import torch

from dapo.actor.dp_actor import Actor, ActorSettings, actor_settings, compute_log_prob
from dapo.batch import Batch
from dapo.bench.common import (
    build_100m,
    fmt_table,
    forward_flops_per_token,
    interleaved,
    load_default,
    padded_rl_batch,
    param_count,
    set_threads,
)
from dapo.outputs.profiling import matmul_peak_flops

VARIANTS = ("packed+dyn", "packed", "dyn")
# rows, max prompt, max response, fixed micro-batch rows
SHAPES = {"tiny": (64, 24, 96, 8), "qwen2-100m": (16, 64, 192, 4)}


def rl_batch(rows: int, p_max: int, r_max: int, vocab: int, seed: int = 0) -> Batch:
    """Left-padded prompts (50-100% of p_max) and right-padded responses whose lengths follow a
    Beta(1.2, 2.5) share of r_max with 12% truncated at r_max, as in a typical RL batch."""
    rng = np.random.default_rng(seed)
    p_len = rng.integers(p_max // 2, p_max + 1, rows)
    r_len = np.maximum(1, (rng.beta(1.2, 2.5, rows) * r_max).astype(int))
    r_len[rng.random(rows) < 0.12] = r_max
    g = torch.Generator().manual_seed(seed)
    return padded_rl_batch(p_len, r_len, p_max, r_max, vocab, g, token_low=3, group_size=8)


def _settings(rows: int, micro: int, budget: int, variant: str) -> ActorSettings:
    return actor_settings(
        ppo_mini_batch_size=rows,
        ppo_micro_batch_size_per_gpu=micro,
        data_loader_seed=0,
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        clip_ratio_c=10.0,
        kl_loss_coef=0.0,
        use_dynamic_bsz="dyn" in variant,
        ppo_max_token_len_per_gpu=budget,
        rollout=dict(
            log_prob_micro_batch_size_per_gpu=micro,
            log_prob_use_dynamic_bsz="dyn" in variant,
            log_prob_max_token_len_per_gpu=budget,
        ),
        model=dict(use_remove_padding="packed" in variant),
    )


def bench_model(name: str, variants: list[str], repeats: int, seed: int, peak: float) -> list[dict[str, Any]]:
    model = build_100m(seed) if name == "qwen2-100m" else load_default()[0]
    rows, p_max, r_max, micro = SHAPES[name]
    batch = rl_batch(rows, p_max, r_max, model.config.vocab_size, seed)
    tokens = float(batch.tensors["attention_mask"].sum())
    padded_tokens = float(batch.tensors["attention_mask"].numel())
    budget = micro * (p_max + r_max)
    opt = torch.optim.AdamW(model.parameters(), lr=0.0)
    mean_len = tokens / rows
    fwd = forward_flops_per_token(model, mean_len / 2)
    out = []
    base = _settings(rows, micro, budget, "padded")

    def runner(settings: ActorSettings, phase: str):
        actor = Actor(model, opt, settings)

        def run() -> float:
            if phase == "update":
                actor.update_policy(batch)
            else:
                compute_log_prob(
                    model, batch, 1.0, settings.log_prob_micro_batch_size, **settings.log_prob_kwargs()
                )
            return tokens

        return run

    for phase in ("log_prob", "update"):
        baseline = runner(base, phase)
        baseline()
        for variant in variants:
            ours = runner(_settings(rows, micro, budget, variant), phase)
            ours()
            res = interleaved(ours, baseline, repeats, probe=lambda: matmul_peak_flops(seconds=0.3))
            peak = max(peak, res["peak"])
            flops_per_token = fwd * (3 if phase == "update" else 1)
            out.append(
                {
                    "model": name,
                    "params_m": round(param_count(model) / 1e6, 1),
                    "phase": phase,
                    "variant": variant,
                    "batch": f"{rows}x({p_max}+{r_max})",
                    "pad_fraction": round(1 - tokens / padded_tokens, 3),
                    "ours_tokens_per_s": res["ours_tokens_per_s"],
                    "baseline_tokens_per_s": res["baseline_tokens_per_s"],
                    "speedup": res["speedup"],
                    "flops_fraction_of_peak": res["ours_tokens_per_s"] * flops_per_token / peak,
                    "baseline_flops_fraction_of_peak": res["baseline_tokens_per_s"] * flops_per_token / peak,
                    "ratios": [round(r, 3) for r in res["ratios"]],
                    "matmul_peak_gflops": peak / 1e9,
                }
            )
    return out


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    set_threads(args.threads)
    peak = matmul_peak_flops()
    rows = []
    for name in args.models:
        variants = args.variants or (list(VARIANTS) if name == "tiny" else ["packed+dyn"])
        for row in bench_model(name, variants, args.repeats, args.seed, peak):
            row["threads"] = args.threads
            rows.append(row)
    return rows


def _add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print a JSON list of rows instead of the table")
    p.add_argument("--models", nargs="+", choices=tuple(SHAPES), default=list(SHAPES))
    p.add_argument(
        "--variants",
        nargs="+",
        choices=VARIANTS,
        default=None,
        help="default: all on tiny, packed+dyn on the 100M model",
    )
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds per comparison (default 3)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--seed", type=int, default=0)


def _main(args: argparse.Namespace) -> int:
    rows = run(args)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        cols = [
            "model",
            "params_m",
            "phase",
            "variant",
            "batch",
            "pad_fraction",
            "ours_tokens_per_s",
            "baseline_tokens_per_s",
            "speedup",
            "flops_fraction_of_peak",
            "baseline_flops_fraction_of_peak",
        ]
        print(fmt_table(rows, cols))
        print(
            f"baseline: padded, fixed micro-batches; matmul peak {rows[0]['matmul_peak_gflops']:.1f} GFLOP/s "
            f"({rows[0]['threads']} threads)"
        )
    return 0


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``update`` to a ``dapo bench`` subparsers object; dispatch with ``args.func(args)``."""
    p = subparsers.add_parser(
        "update",
        help="log-prob / update tokens/s: packed and dynamic bsz vs padded",
        description=__doc__.split("\n\n")[0],
    )
    _add_args(p)
    p.set_defaults(func=_main)
    return p
