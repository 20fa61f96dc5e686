"""Streaming dynamic sampling against the round-based strategies, on vLLM, in the real loop.

For each seed, runs `dapo train` (the default preset: the built-in arithmetic task, dynamic
sampling on) with `actor_rollout_ref.rollout.name=vllm` on the built-in tiny arithmetic model's
head-size-32 variant (warm-started like the demo's model; built and cached on first use), once
per strategy, interleaved: `stream`, `default`, `verl` (with `on_exhausted=train`, as the preset
already bounds rounds). Validation runs only after the last step, on 16 problems, and is not
counted.

Per strategy, summed over the seeds' steps:
* `gen tok / trained tok`: generated response tokens (aborted streamed groups' partial tokens
  included) over the response tokens trained on;
* `gen groups / trained`: groups started (for `stream`, aborted ones included) over groups
  trained on;
* `wall/step` and `gen/step`: mean `timing_s/step` and `timing_s/gen` (generation only; the
  reward is timed apart) over steps 2 and later (step 1 also pays vLLM's warm-up), and wall
  over all steps; speed is only comparable within one run of this script.

    .venv/bin/python benchmarks/streaming_vllm.py --seeds 1 2 3 [--steps 8] [--json] [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

STRATEGIES = ("stream", "default", "verl")


def run(strategy: str, seed: int, steps: int, model: Path, out: Path, extra: list[str]) -> dict:
    run_dir = out / f"{strategy}-seed{seed}"
    cmd = [
        sys.executable,
        "-m",
        "dapo.cli",
        "train",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.rollout.name=vllm",
        f"algorithm.filter_groups.strategy={strategy}",
        "algorithm.filter_groups.on_exhausted=train",
        f"trainer.seed={seed}",
        f"trainer.total_training_steps={steps}",
        f"trainer.default_local_dir={run_dir}",
        "trainer.logger=[jsonl]",
        "trainer.val_before_train=false",
        "trainer.test_freq=0",
        "trainer.report_freq=0",
        "trainer.rollout_data_dir=null",
        "trainer.save_final_model=false",
        "data.val_max_samples=16",  # the validation after the last step is not what is measured
        *extra,
    ]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "timing_s/step" in r]

    def total(key: str) -> float:
        return float(sum(r.get(key, 0.0) for r in rows))

    p = "dynamic_sampling/"
    return {
        "strategy": strategy,
        "seed": seed,
        "steps": len(rows),
        "generated_tokens": total(p + "generated_response_tokens"),
        "aborted_tokens": total(p + "aborted_response_tokens"),
        "trained_tokens": total(p + "trained_response_tokens"),
        "generated_groups": total(p + "generated_groups"),
        "aborted_groups": total(p + "aborted_groups"),
        "trained_groups": total(p + "trained_groups"),
        "step_s": total("timing_s/step") / max(1, len(rows)),
        "gen_s": total("timing_s/gen") / max(1, len(rows)),
        # step 1 also pays vLLM's first forward passes (seconds of warm-up on a CPU)
        "step_s_warm": statistics.fmean(r["timing_s/step"] for r in rows[1:]) if len(rows) > 1 else 0.0,
        "gen_s_warm": statistics.fmean(r.get("timing_s/gen", 0.0) for r in rows[1:])
        if len(rows) > 1
        else 0.0,
        "acc_generated": statistics.fmean(r.get("train/acc_generated", 0.0) for r in rows),
    }


def summarize(results: list[dict]) -> list[dict]:
    table = []
    for s in STRATEGIES:
        rs = [r for r in results if r["strategy"] == s]
        if not rs:
            continue

        def tot(k: str, rs=rs) -> float:
            return sum(r[k] for r in rs)

        table.append(
            {
                "strategy": s,
                "runs": len(rs),
                "gen_tokens_per_trained_token": tot("generated_tokens") / max(1.0, tot("trained_tokens")),
                "aborted_token_share": tot("aborted_tokens") / max(1.0, tot("generated_tokens")),
                "gen_groups_per_trained_group": tot("generated_groups") / max(1.0, tot("trained_groups")),
                "aborted_groups": tot("aborted_groups"),
                "step_s": statistics.fmean(r["step_s"] for r in rs),
                "gen_s": statistics.fmean(r["gen_s"] for r in rs),
                "step_s_warm": statistics.fmean(r["step_s_warm"] for r in rs),
                "gen_s_warm": statistics.fmean(r["gen_s_warm"] for r in rs),
                "per_seed_gen_tokens_per_trained_token": [
                    round(r["generated_tokens"] / max(1.0, r["trained_tokens"]), 3) for r in rs
                ],
                "per_seed_step_s_warm": [round(r["step_s_warm"], 2) for r in rs],
            }
        )
    return table


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument(
        "--model",
        type=Path,
        default=None,
        help="another head-size-32 model (default: the tiny arithmetic one)",
    )
    ap.add_argument("--out", type=Path, default=None, help="run directory (default: a new temporary one)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("overrides", nargs="*", help="extra key=value overrides for every run")
    args = ap.parse_args()
    from dapo.tasks.tiny_model import ensure_tiny_model_hd32

    model = args.model or ensure_tiny_model_hd32(log=lambda s: print(s, file=sys.stderr, flush=True))
    out = args.out or Path(tempfile.mkdtemp(prefix="dapo-streaming-bench-"))
    results = []
    for seed in args.seeds:
        for strategy in STRATEGIES:  # interleaved
            results.append(run(strategy, seed, args.steps, model, out, list(args.overrides)))
            r = results[-1]
            print(
                f"seed {seed} {strategy}: {r['step_s']:.2f} s/step, "
                f"{r['generated_tokens'] / max(1.0, r['trained_tokens']):.2f} gen tok/trained tok",
                file=sys.stderr,
                flush=True,
            )
    table = summarize(results)
    summary = {
        "steps": args.steps,
        "seeds": args.seeds,
        "overrides": args.overrides,
        "load_avg": os.getloadavg(),
        "table": table,
        "runs": results,
        "out_dir": str(out),
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(f"{args.steps} steps x seeds {args.seeds}; overrides: {' '.join(args.overrides) or '(none)'}")
    print(
        "| strategy | gen tok / trained tok | aborted tok share | gen groups / trained | "
        "wall/step s (steps 2+) | gen/step s (steps 2+) | wall/step s (all) | per seed: gen tok / trained tok |"
        " per seed: wall/step s (steps 2+) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in table:
        print(
            f"| {r['strategy']} | {r['gen_tokens_per_trained_token']:.2f} | {r['aborted_token_share']:.2f} | "
            f"{r['gen_groups_per_trained_group']:.2f} | {r['step_s_warm']:.2f} | {r['gen_s_warm']:.2f} | "
            f"{r['step_s']:.2f} | {' '.join(map(str, r['per_seed_gen_tokens_per_trained_token']))} | "
            f"{' '.join(map(str, r['per_seed_step_s_warm']))} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
