"""Skip rules side by side on ``dapo bench sampling``'s simulator (``dapo.sampling.simulate``).

For each rule and seed: verl mode and ``default`` with that rule on the same population, and
the figures the sampler's goals are stated in: generated groups per trained group against verl
mode's, the qualified ratio after the warm-up, ``learnable_coverage`` (its own and against verl
mode's) and the distinct prompts trained after the warm-up. Prints a markdown table; ``--json``
writes every figure.

    PYTHONPATH=src python benchmarks/skip_rules.py --seeds 0 1 2 3 4 [--num-prompts 4096 --steps 200 --n 8]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from dapo.sampling.simulate import FIRST_RULE, default_strategies, run_all

RULES: dict[str, dict[str, Any]] = {
    # the default: every group through a shared model of the policy's improvement, the pool's
    # prior over difficulty, two thresholds and a confirming second group
    "trend (default)": {},
    # the rule before it: Beta posterior, uniform prior, slow decay, skip only on at least half a
    # group's evidence
    "posterior": {"rule": "posterior"},
    # the same posterior, a prompt skipped when one draw from it predicts no spread
    "thompson": {"rule": "thompson"},
    # decay toward maximal uncertainty (uniform prior) but no minimum evidence weight
    "uniform, no min evidence": {"rule": "posterior", "min_evidence": 0.0},
    # the rule this project shipped first: Jeffreys' prior, fast decay, no evidence bounds
    "old (Jeffreys, decay 0.85, 0.2)": FIRST_RULE,
}


def row(rule: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    s = default_strategies(RULES[rule])
    r = run_all(
        steps=args.steps,
        num_prompts=args.num_prompts,
        n=args.n,
        seed=seed,
        strategies={"verl": s["verl"], "default": s["default"]},
    )
    verl, ours = r["strategies"]["verl"], r["strategies"]["default"]
    return {
        "rule": rule,
        "seed": seed,
        "gen_vs_verl": ours["generated_groups_per_trained_group"]
        / verl["generated_groups_per_trained_group"],
        "qualified_after_warmup": ours["qualified_ratio"],
        "learnable_coverage": ours["learnable_coverage"],
        "coverage_vs_verl": ours["learnable_coverage"] / verl["learnable_coverage"],
        "trained_prompts": ours["trained_prompts"],
        "verl_trained_prompts": verl["trained_prompts"],
        "stalled_at_step": ours["stalled_at_step"],
    }


def table(rows: list[dict[str, Any]]) -> str:
    def span(vals: list[float], fmt: str) -> str:
        lo, hi = min(vals), max(vals)
        return f"{lo:{fmt}}" if lo == hi else f"{lo:{fmt}}-{hi:{fmt}}"

    out = [
        "| rule | gen groups vs verl | qualified after warm-up | learnable coverage | vs verl's | "
        "trained prompts (verl) | stalled |",
        "|---|---|---|---|---|---|---|",
    ]
    for rule in dict.fromkeys(r["rule"] for r in rows):
        rs = [r for r in rows if r["rule"] == rule]
        stalled = [r["stalled_at_step"] for r in rs if r["stalled_at_step"]]
        out.append(
            f"| {rule} | {span([r['gen_vs_verl'] for r in rs], '.2f')}x "
            f"| {span([r['qualified_after_warmup'] for r in rs], '.3f')} "
            f"| {span([r['learnable_coverage'] for r in rs], '.3f')} "
            f"| {span([r['coverage_vs_verl'] for r in rs], '.3f')} "
            f"| {span([r['trained_prompts'] for r in rs], 'd')} "
            f"({span([r['verl_trained_prompts'] for r in rs], 'd')}) "
            f"| {', '.join(map(str, stalled)) or 'no'} |"
        )
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--num-prompts", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--rules", nargs="+", choices=list(RULES), default=list(RULES))
    ap.add_argument("--json", type=Path, help="also write every row here")
    args = ap.parse_args()
    rows = []
    for seed in args.seeds:
        for rule in args.rules:
            rows.append(row(rule, seed, args))
            if args.json:
                args.json.write_text(json.dumps(rows, indent=1))
    print(f"{args.num_prompts} prompts, {args.steps} steps, n={args.n}, seeds {args.seeds}")
    print(table(rows))


if __name__ == "__main__":
    main()
