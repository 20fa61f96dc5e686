"""The headline on the real loop: `strategy=verl` against ours on the long-reasoning task.

For each seed, runs `dapo train --config-name reasoning` once in verl mode (the recipe's
accumulator, old log-probs recomputed every step as verl does) and once with ours (the default
sampler: carry-over, adaptive rounds, solve-rate skipping; the on-policy fast path), interleaved,
and reports:

* wall (training) time for ours to reach verl mode's final accuracy, where the final accuracy
  is the mean of verl mode's last ``--smooth`` validations and ours' accuracy is smoothed the
  same way (one noisy validation does not decide it), over verl mode's training time; ours runs
  ``--ours-steps`` (1.5x verl mode's by default), as it may need more steps than verl mode to
  get there;
* held-out accuracy of both at equal steps (at verl mode's last step, smoothed);
* generated response tokens per trained response token;
* the mean time of a step split by phase (generation, reward, old log-probs, update, other);
  these two and generation's share are over verl mode's steps for both (ours' longer run is in
  ``headline.json`` as ``*_all_steps``).

Training time is the sum of ``timing_s/step`` (validation excluded: the same work for both).
Writes ``headline.json`` and ``headline_acc_vs_time.png`` (held-out accuracy against training
time, every seed) into ``--out``. A run already finished in ``--out`` with the same configuration
is read, not run again.

    .venv/bin/python benchmarks/headline_real_loop.py --seeds 1 2 3 [--steps 60] [--json] [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from reasoning_runs import train_reasoning

PHASES = ("gen", "reward", "old_log_prob", "update_actor")
STRATEGIES = {
    "verl": ["algorithm.filter_groups.strategy=verl", "actor_rollout_ref.actor.on_policy_fast_path=false"],
    "ours": ["algorithm.filter_groups.strategy=default"],
}


def run(name: str, seed: int, steps: int, test_freq: int, out: Path, extra: list[str]) -> dict:
    rows = train_reasoning(out / f"{name}-seed{seed}", seed, steps, test_freq, STRATEGIES[name], extra)
    curve, elapsed, elapsed_at = [], 0.0, {}
    nsteps = 0
    for r in rows:
        if "timing_s/step" in r:
            nsteps += 1
            elapsed += r["timing_s/step"]
            elapsed_at[int(r["step"])] = elapsed
        if "val/acc" in r:
            curve.append((r.get("step", 0), elapsed, r["val/acc"]))
    return {
        "name": name,
        "seed": seed,
        "train_s": elapsed,
        "train_s_at_step": elapsed_at,
        "steps": nsteps,
        "curve": curve,
        "rows": rows,
        **cost(rows, nsteps),
    }


def cost(rows: list[dict], upto: int) -> dict:
    """Generated response tokens per trained one, the mean step time by phase and generation's
    share of the step time, over steps 1..``upto``."""
    steps = [r for r in rows if "timing_s/step" in r and r["step"] <= upto]
    total = sum(r["timing_s/step"] for r in steps)
    phase = {p: sum(r.get(f"timing_s/{p}", 0.0) for r in steps) for p in PHASES}
    per_step = {p: phase[p] / max(1, len(steps)) for p in PHASES}
    per_step["other"] = total / max(1, len(steps)) - sum(per_step.values())
    gen_tok = sum(r.get("dynamic_sampling/generated_response_tokens", 0.0) for r in steps)
    train_tok = sum(r.get("dynamic_sampling/trained_response_tokens", 0.0) for r in steps)
    return {
        "gen_tokens_per_train_token": gen_tok / max(1.0, train_tok),
        "step_s_by_phase": per_step,
        "gen_share": phase["gen"] / max(1e-9, total),
    }


def smoothed(curve: list[tuple[int, float, float]], k: int) -> list[tuple[int, float, float]]:
    """Each validation's accuracy replaced by the mean of it and up to ``k - 1`` before it."""
    out = []
    for i, (step, t, _) in enumerate(curve):
        window = [a for _, _, a in curve[max(0, i - k + 1) : i + 1]]
        out.append((step, t, sum(window) / len(window)))
    return out


def compare(v: dict, o: dict, k: int) -> dict:
    """Ours against verl mode: the time ours takes to reach verl mode's final (smoothed) accuracy,
    which may need more steps than verl mode ran, and both at verl mode's last step."""
    sv, so = smoothed(v["curve"], k), smoothed(o["curve"], k)
    o_equal = cost(o["rows"], v["steps"])  # ours over verl mode's steps: like for like
    target = sv[-1][2]
    t_o = next((t for _, t, a in so if a >= target - 1e-9), None)
    at_verl_end = [a for step, _, a in so if step <= v["steps"]][-1]
    return {
        "seed": v["seed"],
        "verl_final_acc": target,
        "ours_acc_at_verl_steps": at_verl_end,
        "ours_final_acc": so[-1][2],
        "verl_train_s": v["train_s"],
        "ours_train_s": o["train_s"],
        "ours_time_to_verl_acc_s": t_o,
        "ours_steps_to_verl_acc": next((step for step, _, a in so if a >= target - 1e-9), None),
        "time_ratio": t_o / v["train_s"] if t_o is not None else None,
        "same_step_ratio": o["train_s_at_step"][v["steps"]] / v["train_s"],
        "verl_gen_tokens_per_train_token": v["gen_tokens_per_train_token"],
        "ours_gen_tokens_per_train_token": o_equal["gen_tokens_per_train_token"],
        "ours_gen_tokens_per_train_token_all_steps": o["gen_tokens_per_train_token"],
        "verl_gen_share": v["gen_share"],
        "verl_step_s": v["step_s_by_phase"],
        "ours_step_s": o_equal["step_s_by_phase"],
        "ours_step_s_all_steps": o["step_s_by_phase"],
        "verl_curve": v["curve"],
        "ours_curve": o["curve"],
    }


def plot(table: list[dict], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for who, color in (("verl", "tab:red"), ("ours", "tab:blue")):
        for i, r in enumerate(table):
            curve = r[f"{who}_curve"]
            label = f"{who} (strategy={'verl' if who == 'verl' else 'default'})" if i == 0 else None
            ax.plot(
                [t for _, t, _ in curve], [a for _, _, a in curve], "o-", color=color, alpha=0.7, label=label
            )
    ax.set_xlabel("training time, s (validation excluded)")
    ax.set_ylabel("held-out accuracy")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    path = out / "headline_acc_vs_time.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--test-freq", type=int, default=10)
    ap.add_argument(
        "--ours-steps",
        type=int,
        default=None,
        help="steps for ours (default 1.5x --steps: time to verl mode's accuracy may need more steps)",
    )
    ap.add_argument("--smooth", type=int, default=3, help="validations averaged for the final accuracy")
    ap.add_argument("--out", type=Path, default=None, help="run directory (default: a new temporary one)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("overrides", nargs="*", help="extra key=value overrides for both runs")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="dapo-headline-"))
    results = {}
    ours_steps = args.ours_steps or round(1.5 * args.steps)
    if ours_steps < args.steps or args.steps % args.test_freq:
        ap.error("--ours-steps must be at least --steps, and --steps a multiple of --test-freq")
    for seed in args.seeds:
        for name in STRATEGIES:  # interleaved
            steps = args.steps if name == "verl" else ours_steps
            results[name, seed] = run(name, seed, steps, args.test_freq, out, list(args.overrides))
            print(f"seed {seed} {name}: {results[name, seed]['train_s']:.0f} s", file=sys.stderr, flush=True)
    table = [compare(results["verl", s], results["ours", s], args.smooth) for s in args.seeds]
    ratios = [r["time_ratio"] if r["time_ratio"] is not None else float("inf") for r in table]
    summary = {
        "steps": args.steps,
        "ours_steps": ours_steps,
        "overrides": args.overrides,
        "runs": table,
        "median_time_ratio": statistics.median(ratios),
        "median_same_step_ratio": statistics.median(r["same_step_ratio"] for r in table),
        "out_dir": str(out),
    }
    (out / "headline.json").write_text(json.dumps(summary, indent=2))
    plot(table, out)
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(
        f"verl mode {args.steps} steps, ours {ours_steps}, reasoning preset; "
        f"overrides: {' '.join(args.overrides) or '(none)'}"
    )
    print(
        f"{'seed':>4} {'verl acc':>8} {'ours acc':>8} {'verl s':>6} {'ours s to verl acc':>18} {'ratio':>5}"
        f" {'same-step':>9} {'gen share verl':>14} {'gen tok/train tok verl':>22} {'ours':>5}"
    )
    for r in table:
        t = r["ours_time_to_verl_acc_s"]
        reach = "never" if t is None else f"{t:.0f}"
        ratio = "n/a" if t is None else f"{r['time_ratio']:.2f}"
        print(
            f"{r['seed']:>4} {r['verl_final_acc']:>8.3f} {r['ours_acc_at_verl_steps']:>8.3f}"
            f" {r['verl_train_s']:>6.0f}"
            f" {reach:>18} {ratio:>5}"
            f" {r['same_step_ratio']:>9.2f} {r['verl_gen_share']:>14.2f}"
            f" {r['verl_gen_tokens_per_train_token']:>22.2f} {r['ours_gen_tokens_per_train_token']:>5.2f}"
        )
    print("mean step seconds by phase:")
    for r in table:
        for who in ("verl", "ours"):
            ph = r[f"{who}_step_s"]
            print(f"  seed {r['seed']} {who:4s} " + " ".join(f"{p} {ph[p]:.2f}" for p in (*PHASES, "other")))
    print(
        f"median: time ratio {summary['median_time_ratio']:.2f} (never = inf), "
        f"same-step ratio {summary['median_same_step_ratio']:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
