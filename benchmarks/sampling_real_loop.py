"""Dynamic-sampling strategies on the real loop: the demo's task and model, same seeds.

For each seed, runs `dapo train` (the default preset) once with `strategy=verl` (the recipe's
semantics: regenerate until full, drop surplus) and once with `strategy=default` (ours), and
reports held-out accuracy and wall time. Our strategy should reach the accuracy verl mode
reaches in at most 0.7x its wall time. Interleaved runs; medians over seeds.

    .venv/bin/python benchmarks/sampling_real_loop.py --seeds 1 2 3 [--steps 40] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run(strategy: str, seed: int, steps: int, out: Path, extra: list[str]) -> dict:
    run_dir = out / f"{strategy}-seed{seed}"
    cmd = [
        sys.executable,
        "-m",
        "dapo.cli",
        "train",
        f"algorithm.filter_groups.strategy={strategy}",
        f"trainer.seed={seed}",
        f"trainer.total_training_steps={steps}",
        f"trainer.default_local_dir={run_dir}",
        "trainer.logger=[jsonl]",
        "trainer.test_freq=10",
        "trainer.report_freq=0",
        "trainer.save_final_model=false",
        *extra,
    ]
    if strategy == "verl":
        cmd.append("algorithm.filter_groups.on_exhausted=train")
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # (cumulative training seconds, held-out accuracy) at every validation
    curve, elapsed = [], 0.0
    gen_groups = trained_groups = 0.0
    for r in rows:
        elapsed += r.get("timing_s/step", 0.0)
        gen_groups += r.get("dynamic_sampling/generated_groups", 0.0)
        trained_groups += r.get("dynamic_sampling/trained_groups", 0.0)
        if "val/acc" in r:
            curve.append((elapsed, r["val/acc"]))
    return {
        "strategy": strategy,
        "seed": seed,
        "wall_s": wall,
        "train_s": elapsed,
        "curve": curve,
        "final_acc": curve[-1][1],
        "generated_groups_per_trained_group": gen_groups / max(1.0, trained_groups),
    }


def time_to_reach(curve: list[tuple[float, float]], target: float) -> float | None:
    for t, acc in curve:
        if acc >= target - 1e-9:
            return t
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    out = Path(tempfile.mkdtemp(prefix="dapo-sampling-bench-"))
    results = []
    for seed in args.seeds:
        for strategy in ("verl", "default"):  # interleaved
            results.append(run(strategy, seed, args.steps, out, args.overrides))
    table = []
    for seed in args.seeds:
        v = next(r for r in results if r["seed"] == seed and r["strategy"] == "verl")
        d = next(r for r in results if r["seed"] == seed and r["strategy"] == "default")
        t_d = time_to_reach(d["curve"], v["final_acc"])
        table.append(
            {
                "seed": seed,
                "verl_acc": v["final_acc"],
                "default_acc": d["final_acc"],
                "verl_train_s": v["train_s"],
                "default_time_to_verl_acc_s": t_d,
                "time_ratio": (t_d / v["train_s"]) if t_d is not None else None,
                "verl_gen_per_trained": v["generated_groups_per_trained_group"],
                "default_gen_per_trained": d["generated_groups_per_trained_group"],
            }
        )
    ratios = [r["time_ratio"] for r in table if r["time_ratio"] is not None]
    summary = {
        "runs": table,
        "median_time_ratio": statistics.median(ratios) if len(ratios) == len(table) else None,
        "reached_in_all_seeds": len(ratios) == len(table),
        "out_dir": str(out),
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(
            f"{'seed':>4} {'verl acc':>8} {'ours acc':>8} {'verl s':>7} {'ours s to verl acc':>18} {'ratio':>6}"
            f" {'gen/trained verl':>16} {'ours':>5}"
        )
        for r in table:
            ratio = f"{r['time_ratio']:.2f}" if r["time_ratio"] is not None else "n/a"
            t = (
                f"{r['default_time_to_verl_acc_s']:.0f}"
                if r["default_time_to_verl_acc_s"] is not None
                else "never"
            )
            print(
                f"{r['seed']:>4} {r['verl_acc']:>8.3f} {r['default_acc']:>8.3f} {r['verl_train_s']:>7.0f} {t:>18}"
                f" {ratio:>6} {r['verl_gen_per_trained']:>16.2f} {r['default_gen_per_trained']:>5.2f}"
            )
        print(
            f"median time ratio (ours to reach verl's final accuracy / verl's time): {summary['median_time_ratio']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
