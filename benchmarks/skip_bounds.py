"""How far the skip rule is from a skipper that knows the truth, on ``dapo bench sampling``'s simulator.

The sampler's simulator goal at ``n`` = 8 (qualified ratio after the warm-up >= 0.9 *and*
``learnable_coverage`` >= 0.9) is not met by the posterior rule. This script separates the
two reasons it could miss: the rule itself (the threshold, the fill order) and what the rule
can know (a few groups of ``n`` responses per prompt). For each seed it runs ``default`` with
the ``trend`` rule (the default, its own thresholds) and, per threshold, three skippers on the
same population:

* ``posterior``: the Beta-posterior rule (``skip.rule: posterior``) at that threshold;
* ``true rate, last rollout``: skips a prompt with history when ``p^n + (1-p)^n`` of its true
  solve rate *at its last rollout* is at least the threshold (what a perfect estimate from its
  own groups could give: no sampling noise, but blind to the change since);
* ``true rate, now``: the same with the true solve rate at the current policy version.

Both true-rate skippers fill a short round from the pass by the same true figure and ignore the
revisit bound and exploring rollouts. Prints a markdown table of ranges over the seeds; ``--json``
writes every figure.

    PYTHONPATH=src python benchmarks/skip_bounds.py --seeds 0 1 2 3 4 --thresholds 0.3 0.35
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

from dapo.config.sampling import FilterGroupsConfig
from dapo.sampling.batcher import DynamicBatcher
from dapo.sampling.posterior import point_zero_spread
from dapo.sampling.simulate import Population, default_strategies, simulate
from dapo.sampling.skip import SkipPolicy


class TrueRateSkip(SkipPolicy):
    """Skips by the true solve rate at the current policy version (``at_last_rollout=False``)
    or at the prompt's last rollout (True)."""

    def __init__(
        self,
        cfg: FilterGroupsConfig,
        train_batch_size: int,
        n: int,
        rng: np.random.Generator,
        seed: int,
        population: Population,
        at_last_rollout: bool,
    ) -> None:
        super().__init__(cfg, train_batch_size, n, rng, seed)
        self.population = population
        self.at_last_rollout = at_last_rollout
        self.last_rate: dict[int, float] = {}

    def true_q(self, idx: int, version: int) -> float:
        p = self.last_rate[idx] if self.at_last_rollout else self.population.prob(idx, version)
        return point_zero_spread(p, self.n)

    def _should_skip(self, idx: int, prob: float, max_updates: int, explore: bool, version: int) -> bool:
        if idx not in self.last_rate:
            return False
        return self.true_q(idx, version) >= self.cfg.skip.threshold

    def _fill(self, passed: dict[int, dict], need: int, version: int) -> list[int]:
        return sorted(passed, key=lambda i: self.true_q(i, version) if i in self.last_rate else 0.0)[:need]

    def observe(
        self, idx: int, *, filtered: bool, mean: float, correct: float | None, n: int, version: int
    ) -> None:
        self.last_rate[int(idx)] = self.population.prob(int(idx), version)
        super().observe(idx, filtered=filtered, mean=mean, correct=correct, n=n, version=version)


def true_rate(at_last_rollout: bool):
    def make(batcher: DynamicBatcher, population: Population) -> SkipPolicy:
        return TrueRateSkip(
            batcher.cfg,
            batcher.train_batch_size,
            batcher.n,
            batcher.rng,
            batcher.seed,
            population,
            at_last_rollout,
        )

    return make


SKIPPERS = {
    "posterior": None,
    "true rate, last rollout": true_rate(True),
    "true rate, now": true_rate(False),
}


def figures(name: str, threshold: float | None, seed: int, f: dict[str, Any]) -> dict[str, Any]:
    row = {
        "skipper": name,
        "threshold": threshold,
        "seed": seed,
        "qualified_after_warmup": f["qualified_ratio"],
        "learnable_coverage": f["learnable_coverage"],
        "generated_groups": f["generated_groups"],
    }
    print(json.dumps(row), flush=True)
    return row


def run(seed: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    pop = Population.synthetic(args.num_prompts, seed=seed)
    kw = dict(steps=args.steps, n=args.n, seed=seed)
    out = [figures("trend (default)", None, seed, simulate(default_strategies()["default"], pop, **kw))]
    for threshold in args.thresholds:
        # the true-rate skippers replace the rule's decision; under the posterior rule nothing
        # else (no confirmation rollouts) differs
        cfg = default_strategies({"rule": "posterior", "threshold": threshold})["default"]
        for name, make in SKIPPERS.items():
            out.append(figures(name, threshold, seed, simulate(cfg, pop, skip_policy=make, **kw)))
    return out


def table(rows: list[dict[str, Any]]) -> str:
    def span(vals: list[float]) -> str:
        lo, hi = min(vals), max(vals)
        return f"{lo:.3f}" if lo == hi else f"{lo:.3f}-{hi:.3f}"

    out = [
        "| skipper | threshold | qualified after warm-up | learnable coverage | both >= 0.9 |",
        "|---|---|---|---|---|",
    ]
    for key in dict.fromkeys((r["skipper"], r["threshold"]) for r in rows):
        rs = [r for r in rows if (r["skipper"], r["threshold"]) == key]
        q = [r["qualified_after_warmup"] for r in rs]
        c = [r["learnable_coverage"] for r in rs]
        both = sum(a >= 0.9 and b >= 0.9 for a, b in zip(q, c, strict=True))
        th = "its own" if key[1] is None else f"{key[1]:g}"
        out.append(f"| {key[0]} | {th} | {span(q)} | {span(c)} | {both} of {len(rs)} seeds |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--thresholds", type=float, nargs="+", default=[0.3, 0.35])
    ap.add_argument("--num-prompts", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--json", default=None, help="also write every row here")
    args = ap.parse_args()
    rows = [r for s in args.seeds for r in run(s, args)]
    print(table(rows))
    if args.json:
        Path(args.json).write_text(
            json.dumps({"config": dataclasses.asdict(FilterGroupsConfig().skip), "rows": rows})
        )


if __name__ == "__main__":
    main()
