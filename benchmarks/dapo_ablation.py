"""The DAPO ablation at small scale, on the long-reasoning task (the reasoning preset).

Each configuration adds one DAPO component to the previous one, as in the paper's table:

  grpo            symmetric clip 0.2, no overlong shaping, sequence-level loss, no filtering
  +clip_higher    clip_ratio_high 0.28
  +overlong       overlong reward shaping (buffer 40 of 256 tokens)
  +token_loss     token-level loss aggregation (token-mean)
  +dyn_verl       dynamic sampling, verl's accumulator (old log-probs recomputed, as verl)
  +dyn_ours       dynamic sampling, ours (default sampler and the on-policy fast path)

Without dynamic sampling a step trains on ``data.train_batch_size`` prompts (``gen_batch_size``
is set equal, so verl's untrimmed-batch quirk does not hand it 3x the data). For every
configuration and seed it records held-out accuracy at every validation against steps and
against cumulative generated response tokens, then writes ``ablation.json`` and two PNG plots
(mean and standard deviation over seeds) into ``--out``. A run already finished in ``--out``
with the same resolved configuration is read instead of run again, so an interrupted ablation
resumes, and the two dynamic-sampling runs can be the headline benchmark's own runs
(``benchmarks/headline_real_loop.py`` runs the same configurations: link its ``verl-seedN`` as
``dyn_verl-seedN``, and its ``ours-seedN`` as ``dyn_ours-seedN`` when it ran with
``--ours-steps`` equal to ``--steps``; a run of other steps is run again).

    .venv/bin/python benchmarks/dapo_ablation.py --seeds 1 2 3 [--steps 60] [--out DIR] [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
from reasoning_runs import train_reasoning

GRPO = [
    "actor_rollout_ref.actor.clip_ratio_high=0.2",
    "reward_model.overlong_buffer.enable=false",
    "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
    "algorithm.filter_groups.enable=false",
    "data.gen_batch_size=${data.train_batch_size}",
]
STEPS = {
    "grpo": GRPO,
    "+clip_higher": ["actor_rollout_ref.actor.clip_ratio_high=0.28"],
    "+overlong": ["reward_model.overlong_buffer.enable=true"],
    "+token_loss": ["actor_rollout_ref.actor.loss_agg_mode=token-mean"],
}
DYNAMIC = {
    "+dyn_verl": [
        "algorithm.filter_groups.enable=true",
        "data.gen_batch_size=24",
        "algorithm.filter_groups.strategy=verl",
        "actor_rollout_ref.actor.on_policy_fast_path=false",
    ],
    "+dyn_ours": [
        "algorithm.filter_groups.enable=true",
        "data.gen_batch_size=24",
        "algorithm.filter_groups.strategy=default",
    ],
}


def configurations() -> dict[str, list[str]]:
    """Each configuration's overrides: cumulative for the first four, then both dynamic modes."""
    out, acc = {}, []
    for name, extra in STEPS.items():
        acc = acc + extra
        out[name] = list(acc)
    for name, extra in DYNAMIC.items():
        out[name] = acc + extra
    return out


def run(name: str, overrides: list[str], seed: int, steps: int, test_freq: int, out: Path) -> dict:
    run_dir = out / f"{name.strip('+')}-seed{seed}"
    rows = train_reasoning(run_dir, seed, steps, test_freq, overrides)
    tokens, curve = 0.0, []
    for r in rows:
        tokens += r.get("dynamic_sampling/generated_response_tokens", 0.0)
        if "val/acc" in r:
            curve.append({"step": int(r.get("step", 0)), "gen_tokens": tokens, "acc": float(r["val/acc"])})
    return {"config": name, "seed": seed, "curve": curve}


def plot(results: list[dict], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for x_key, label in (("step", "training step"), ("gen_tokens", "generated response tokens")):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for name in dict.fromkeys(r["config"] for r in results):
            runs = [r["curve"] for r in results if r["config"] == name]
            k = min(len(c) for c in runs)
            acc = np.array([[p["acc"] for p in c[:k]] for c in runs])
            x = np.array([[p[x_key] for p in c[:k]] for c in runs]).mean(0)
            m, s = acc.mean(0), acc.std(0)
            ax.errorbar(x, m, yerr=s, label=name, capsize=3, marker="o", markersize=3)
        ax.set_xlabel(label)
        ax.set_ylabel("held-out accuracy (mean ± sd over seeds)")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        p = out / f"ablation_vs_{x_key}.png"
        fig.tight_layout()
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    return paths


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--test-freq", type=int, default=10)
    ap.add_argument("--configs", nargs="+", default=None, help="a subset of the configurations, by name")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("overrides", nargs="*", help="extra key=value overrides for every run")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="dapo-ablation-"))
    out.mkdir(parents=True, exist_ok=True)
    configs = configurations()
    names = args.configs or list(configs)
    unknown = [n for n in names if n not in configs]
    if unknown:
        ap.error(f"unknown configuration(s) {unknown}; choose from {list(configs)}")
    results = []
    for seed in args.seeds:
        for name in names:  # interleaved: every configuration once per seed
            results.append(run(name, configs[name] + args.overrides, seed, args.steps, args.test_freq, out))
            last = results[-1]["curve"][-1]
            print(f"seed {seed} {name}: acc {last['acc']:.3f} at step {last['step']}", file=sys.stderr)
    (out / "ablation.json").write_text(json.dumps({"configs": configs, "results": results}, indent=2))
    print(f"{'config':14s} " + " ".join(f"{'seed ' + str(s):>8s}" for s in args.seeds) + "     mean   sd")
    for name in names:
        finals = [r["curve"][-1]["acc"] for r in results if r["config"] == name]
        cells = " ".join(f"{a:8.3f}" for a in finals)
        print(f"{name:14s} {cells} {np.mean(finals):8.3f} {np.std(finals):5.3f}")
    for p in plot(results, out):
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
