"""Dynamic-sampling strategies on the real loop: the demo's task and model, same seeds.

For each seed, runs `dapo train` (the default preset) once with `strategy=verl` (the recipe's
semantics: regenerate whole `gen_batch_size` rounds until full, drop the surplus) and once with
`strategy=default` (ours), interleaved, and reports held-out accuracy and training time
(the sum of `timing_s/step`; validation is excluded, it is the same work for both).

By default both runs use the DAPO recipe's batch settings on top of the demo preset:
`gen_batch_size` = 3 x `train_batch_size` (run_dapo_qwen2.5_32b.sh: 1536 / 512),
`use_remove_padding` and `use_dynamic_bsz`; `--demo-config` runs the preset unchanged.

Columns:
* `ours s to verl acc` / `ratio`: the training time at which ours first reaches, at a
  validation, the accuracy verl mode has at its last one, over verl mode's training time;
* `same-step ratio`: ours' training time over verl mode's for the same number of steps (the
  sampler's cost alone, free of accuracy noise);
* `floor`: the smallest same-step ratio any sampler could reach if it learned as much per step:
  ours' time outside generation plus one generated group per trained group at verl mode's
  measured cost per group, over verl mode's time;
* `gen share`: generation and reward time as a fraction of verl mode's training time.

    .venv/bin/python benchmarks/sampling_real_loop.py --seeds 1 2 3 [--steps 80] [--json] [key=value ...]
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

RECIPE = [
    "data.gen_batch_size=48",
    "actor_rollout_ref.model.use_remove_padding=true",
    "actor_rollout_ref.actor.use_dynamic_bsz=true",
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true",
]


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
    curve, elapsed, gen_s = [], 0.0, 0.0
    gen_groups = trained_groups = 0.0
    for r in rows:
        elapsed += r.get("timing_s/step", 0.0)
        gen_s += r.get("timing_s/gen", 0.0) + r.get("timing_s/reward", 0.0)
        gen_groups += r.get("dynamic_sampling/generated_groups", 0.0)
        trained_groups += r.get("dynamic_sampling/trained_groups", 0.0)
        if "val/acc" in r:
            curve.append((elapsed, r["val/acc"]))
    return {
        "strategy": strategy,
        "seed": seed,
        "wall_s": wall,
        "train_s": elapsed,
        "gen_s": gen_s,
        "generated_groups": gen_groups,
        "trained_groups": trained_groups,
        "curve": curve,
        "final_acc": curve[-1][1],
        "generated_groups_per_trained_group": gen_groups / max(1.0, trained_groups),
    }


def time_to_reach(curve: list[tuple[float, float]], target: float) -> float | None:
    for t, acc in curve:
        if acc >= target - 1e-9:
            return t
    return None


def compare(v: dict, d: dict) -> dict:
    t_d = time_to_reach(d["curve"], v["final_acc"])
    cost_per_group = v["gen_s"] / max(1.0, v["generated_groups"])
    floor = (d["train_s"] - d["gen_s"] + cost_per_group * d["trained_groups"]) / v["train_s"]
    return {
        "seed": v["seed"],
        "verl_acc": v["final_acc"],
        "default_acc": d["final_acc"],
        "verl_train_s": v["train_s"],
        "default_train_s": d["train_s"],
        "default_time_to_verl_acc_s": t_d,
        "time_ratio": (t_d / v["train_s"]) if t_d is not None else None,
        "same_step_ratio": d["train_s"] / v["train_s"],
        "floor_ratio": floor,
        "verl_gen_share": v["gen_s"] / v["train_s"],
        "verl_gen_per_trained": v["generated_groups_per_trained_group"],
        "default_gen_per_trained": d["generated_groups_per_trained_group"],
        "verl_curve": v["curve"],
        "default_curve": d["curve"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument(
        "--demo-config", action="store_true", help="the demo preset as is (no recipe batch settings)"
    )
    ap.add_argument("--out", type=Path, default=None, help="run directory (default: a new temporary one)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("overrides", nargs="*", help="extra key=value overrides for both strategies")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="dapo-sampling-bench-"))
    extra = ([] if args.demo_config else RECIPE) + list(args.overrides)
    results = []
    for seed in args.seeds:
        for strategy in ("verl", "default"):  # interleaved
            results.append(run(strategy, seed, args.steps, out, extra))
            print(f"seed {seed} {strategy}: {results[-1]['train_s']:.0f} s", file=sys.stderr, flush=True)
    table = []
    for seed in args.seeds:
        v = next(r for r in results if r["seed"] == seed and r["strategy"] == "verl")
        d = next(r for r in results if r["seed"] == seed and r["strategy"] == "default")
        table.append(compare(v, d))
    ratios = [r["time_ratio"] if r["time_ratio"] is not None else float("inf") for r in table]
    summary = {
        "steps": args.steps,
        "overrides": extra,
        "runs": table,
        "median_time_ratio": statistics.median(ratios),
        "median_same_step_ratio": statistics.median(r["same_step_ratio"] for r in table),
        "median_floor_ratio": statistics.median(r["floor_ratio"] for r in table),
        "out_dir": str(out),
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(f"{args.steps} steps; overrides: {' '.join(extra) or '(none)'}")
    print(
        f"{'seed':>4} {'verl acc':>8} {'ours acc':>8} {'verl s':>6} {'ours s to verl acc':>18} {'ratio':>5}"
        f" {'same-step ratio':>15} {'floor':>5} {'gen share':>9} {'gen/trained verl':>16} {'ours':>4}"
    )
    for r in table:
        ratio = f"{r['time_ratio']:.2f}" if r["time_ratio"] is not None else "n/a"
        t = (
            f"{r['default_time_to_verl_acc_s']:.0f}"
            if r["default_time_to_verl_acc_s"] is not None
            else "never"
        )
        print(
            f"{r['seed']:>4} {r['verl_acc']:>8.3f} {r['default_acc']:>8.3f} {r['verl_train_s']:>6.0f} {t:>18}"
            f" {ratio:>5} {r['same_step_ratio']:>15.2f} {r['floor_ratio']:>5.2f} {r['verl_gen_share']:>9.2f}"
            f" {r['verl_gen_per_trained']:>16.2f} {r['default_gen_per_trained']:>4.2f}"
        )
    print(
        f"median: time ratio {summary['median_time_ratio']:.2f} (never = inf), same-step ratio "
        f"{summary['median_same_step_ratio']:.2f}, floor {summary['median_floor_ratio']:.2f}"
    )
    for r in table:
        fmt = lambda c: " ".join(f"{t:.0f}s:{a:.3f}" for t, a in c)  # noqa: E731
        print(
            f"seed {r['seed']} curves (train s: held-out acc)\n  verl    {fmt(r['verl_curve'])}\n  default {fmt(r['default_curve'])}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
