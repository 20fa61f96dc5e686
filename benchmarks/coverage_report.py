"""What ``coverage_real_loop.py`` reports, from a run directory and from the records of finished
runs: held-out accuracy against training time and generated tokens, accuracy at a matched
budget, per tier, on the chains the start model never solved, and the distinct prompts trained.

A run's record (one JSON per run) holds its validation curve, each point with the training time
(the sum of ``timing_s/step``: validation excluded) and the generated response tokens up to its
step, both counted from the offline pass's cost for the arms that ran one (the model is the start
model until then, so the curve starts at zero cost with the start accuracy and is flat over the
pass). Nothing here runs a model.
"""

from __future__ import annotations

import json
import re
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from reasoning_runs import run_usage

from dapo.outputs.records import read_metrics

# a chain's question as the prompt holds it, e.g. "47 1)+8 2)+8 =" (dapo.tasks.reasoning)
QUESTION = re.compile(r"\d+(?: \d+\)[-+*]\d+)+ =")
TIERS = ("easy", "medium", "hard", "beyond")
VALIDATION_DIR, ROLLOUT_DIR = "validation", "rollouts"


def question_of(text: str, where: str) -> str:
    """The chain question in a dumped prompt; raises naming ``where`` when there is none."""
    m = QUESTION.search(text)
    if m is None:
        raise ValueError(f"{where}: no chain question ('<start> 1)<op><x> ... =') in the prompt {text!r}")
    return m.group(0)


def read_dump(path: Path) -> list[tuple[str, float]]:
    """``(question, acc)`` of every sample in a validation or rollout dump."""
    out = []
    for i, line in enumerate(path.read_text().splitlines()):
        row = json.loads(line)
        acc = row.get("acc", row.get("score"))
        out.append((question_of(row["input"], f"{path} line {i + 1}"), float(acc)))
    return out


def chain_accuracy(samples: Sequence[tuple[str, float]]) -> dict[str, float]:
    """Each chain's mean accuracy over its samples."""
    total: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for q, acc in samples:
        total[q] += acc
        count[q] += 1
    return {q: total[q] / count[q] for q in count}


def sample_mean(samples: Sequence[tuple[str, float]], keep: Any = None) -> float | None:
    """The mean accuracy of the samples whose question is in ``keep`` (all when None)."""
    accs = [a for q, a in samples if keep is None or q in keep]
    return sum(accs) / len(accs) if accs else None


def tier_accuracy(samples: Sequence[tuple[str, float]], tiers: Mapping[str, str]) -> dict[str, float]:
    """Mean accuracy of the samples of each tier present (``tiers``: question to tier)."""
    by: dict[str, list[float]] = defaultdict(list)
    for q, acc in samples:
        if q not in tiers:
            raise ValueError(f"validation sample of {q!r}: the question is not in the held-out set")
        by[tiers[q]].append(acc)
    return {t: sum(v) / len(v) for t, v in sorted(by.items(), key=lambda kv: TIERS.index(kv[0]))}


def interpolate(points: Sequence[tuple[float, float]], x: float) -> float | None:
    """The value at ``x`` of the piecewise-linear curve through ``points`` (sorted by x); None
    past either end. Where x repeats (a jump), the later point holds from there on."""
    if not points or x < points[0][0] or x > points[-1][0]:
        return None
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 <= x < x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1]  # x is the last point's


def curve(record: Mapping[str, Any], x: str) -> list[tuple[float, float]]:
    """``(cost, held-out accuracy)`` of a run's validations, ``x`` being ``"wall_s"`` or
    ``"gen_tokens"``; an arm with an offline pass starts at zero cost with the start accuracy."""
    pts = [(float(p[x]), float(p["acc"])) for p in record["curve"]]
    if pts and pts[0][0] > 0:
        pts.insert(0, (0.0, pts[0][1]))
    return pts


def matched(records: Sequence[Mapping[str, Any]], x: str) -> dict[str, Any]:
    """Each run's accuracy at the cost where the cheapest run (in ``x``) ends: one seed's runs."""
    budget = min(curve(r, x)[-1][0] for r in records)
    return {"budget": budget, "acc": {r["arm"]: interpolate(curve(r, x), budget) for r in records}}


def run_record(
    run_dir: Path,
    arm: str,
    seed: int,
    val_tiers: Mapping[str, str],
    train_tiers: Mapping[str, str],
    offline: Mapping[str, Any] | None = None,
    window: int = 10,
) -> dict[str, Any]:
    """A finished run's record, from its metrics, validation dumps and rollout dumps.
    ``offline``: the pass's ``generated_response_tokens`` and ``wall_s`` (and what it set), for
    an arm that paid for one; ``window``: the last steps whose ``train/acc_generated`` is
    compared with the final held-out accuracy."""
    rows = read_metrics(run_dir)
    wall0 = float(offline["wall_s"]) if offline else 0.0
    tok0 = float(offline["generated_response_tokens"]) if offline else 0.0
    wall, tok = wall0, tok0
    steps = [r for s, r in rows.items() if s > 0 and "timing_s/step" in r]
    starts: set[str] | None = None
    points = []
    for s, r in rows.items():
        if s > 0 and "timing_s/step" in r:
            wall += float(r["timing_s/step"])
            tok += float(r.get("dynamic_sampling/generated_response_tokens", 0.0))
        if "val/acc" not in r:
            continue
        point: dict[str, Any] = {"step": s, "wall_s": wall, "gen_tokens": tok, "acc": float(r["val/acc"])}
        dump = run_dir / VALIDATION_DIR / f"{s}.jsonl"
        if dump.is_file():
            samples = read_dump(dump)
            if starts is None and s == 0:
                starts = {q for q, a in chain_accuracy(samples).items() if a == 0}
            point["acc_by_tier"] = tier_accuracy(samples, val_tiers)
            point["acc_start_all_wrong"] = sample_mean(samples, starts) if starts else None
        points.append(point)
    trained: set[str] = set()
    for dump in sorted((run_dir / ROLLOUT_DIR).glob("*.jsonl")):
        trained.update(q for q, _ in read_dump(dump))
    last = steps[-window:]
    train_acc = [float(r["train/acc_generated"]) for r in last if "train/acc_generated" in r]
    final = points[-1]["acc"] if points else None

    def mean_of(key: str) -> float:
        return sum(float(r.get(key, 0.0)) for r in steps) / max(1, len(steps))

    usage = run_usage(run_dir)
    by_tier: dict[str, int] = defaultdict(int)
    for q in trained:
        by_tier[train_tiers.get(q, "unknown")] += 1
    return {
        "arm": arm,
        "seed": seed,
        "steps": len(steps),
        "offline": dict(offline) if offline else None,
        "curve": points,
        "wall_s": wall,
        "gen_tokens": tok,
        "train_s": wall - wall0,
        "final_acc": final,
        "final_acc_by_tier": points[-1].get("acc_by_tier") if points else None,
        "final_acc_start_all_wrong": points[-1].get("acc_start_all_wrong") if points else None,
        "start_all_wrong_chains": len(starts) if starts is not None else None,
        "train_acc_generated_last": sum(train_acc) / len(train_acc) if train_acc else None,
        "train_heldout_gap": (sum(train_acc) / len(train_acc) - final)
        if train_acc and final is not None
        else None,
        "distinct_prompts_trained": len(trained),
        "distinct_prompts_trained_by_tier": dict(sorted(by_tier.items())),
        "pool_size": len(train_tiers),
        "step_s": mean_of("timing_s/step"),
        "phase_s": {p: mean_of(f"timing_s/{p}") for p in ("gen", "old_log_prob", "update_actor")},
        "rounds_per_step": mean_of("train/num_gen_batches"),
        # the run's processes (startup and validation included): the CPU share it got of its core
        "process_cpu_s": usage["cpu_s"],
        "process_wall_s": usage["wall_s"],
        "cpu_share": usage["cpu_s"] / usage["wall_s"] if usage["wall_s"] else None,
    }


def _stats(values: Sequence[float | None]) -> dict[str, Any]:
    vals = [v for v in values if v is not None]
    return {
        "mean": statistics.fmean(vals) if vals else None,
        "sd": statistics.stdev(vals) if len(vals) > 1 else None,
        "values": list(values),
    }


def summarize(records: Sequence[Mapping[str, Any]], arms: Sequence[str]) -> dict[str, Any]:
    """Per seed, the matched budgets (of the seeds every arm finished); per arm, each figure's
    mean, standard deviation and per-seed values."""
    by_seed: dict[int, dict[str, Mapping[str, Any]]] = defaultdict(dict)
    for r in records:
        by_seed[int(r["seed"])][r["arm"]] = r
    budgets, at_tokens, at_wall = {}, defaultdict(dict), defaultdict(dict)
    for seed, runs in sorted(by_seed.items()):
        if not all(a in runs for a in arms):
            continue
        ordered = [runs[a] for a in arms]
        tok, wall = matched(ordered, "gen_tokens"), matched(ordered, "wall_s")
        budgets[seed] = {"gen_tokens": tok["budget"], "wall_s": wall["budget"]}
        for a in arms:
            at_tokens[a][seed], at_wall[a][seed] = tok["acc"][a], wall["acc"][a]
    out: dict[str, Any] = {"matched_budgets": budgets, "arms": {}}
    for a in arms:
        runs = [by_seed[s][a] for s in sorted(by_seed) if a in by_seed[s]]
        if not runs:
            continue
        tier = {
            t: _stats([(r["final_acc_by_tier"] or {}).get(t) for r in runs])
            for t in TIERS
            if any(t in (r["final_acc_by_tier"] or {}) for r in runs)
        }
        out["arms"][a] = {
            "seeds": [r["seed"] for r in runs],
            "final_acc": _stats([r["final_acc"] for r in runs]),
            "acc_at_matched_tokens": _stats([at_tokens[a].get(r["seed"]) for r in runs]),
            "acc_at_matched_wall": _stats([at_wall[a].get(r["seed"]) for r in runs]),
            "gen_tokens": _stats([r["gen_tokens"] for r in runs]),
            "wall_s": _stats([r["wall_s"] for r in runs]),
            "distinct_prompts_trained": _stats([r["distinct_prompts_trained"] for r in runs]),
            "train_heldout_gap": _stats([r["train_heldout_gap"] for r in runs]),
            "final_acc_start_all_wrong": _stats([r["final_acc_start_all_wrong"] for r in runs]),
            "final_acc_by_tier": tier,
            "step_s": _stats([r["step_s"] for r in runs]),
        }
    return out


def _cell(s: Mapping[str, Any], fmt: str, scale: float = 1.0) -> str:
    if s["mean"] is None:
        return "n/a"
    text = fmt.format(s["mean"] * scale)
    return text + (f" ± {fmt.format(s['sd'] * scale)}" if s["sd"] is not None else "")


def markdown(summary: Mapping[str, Any]) -> str:
    """The per-arm table (mean ± sd over seeds) and the matched budgets, for the docs."""
    head = (
        "| arm | held-out acc | at matched tokens | at matched wall | generated tokens (M) | wall s "
        "| distinct prompts trained | train − held-out | start-all-wrong chains | " + " | ".join(TIERS) + " |"
    )
    lines = [head, "|" + "---|" * (9 + len(TIERS))]
    for arm, s in summary["arms"].items():
        tiers = [
            _cell(s["final_acc_by_tier"][t], "{:.3f}") if t in s["final_acc_by_tier"] else "n/a"
            for t in TIERS
        ]
        lines.append(
            f"| {arm} | {_cell(s['final_acc'], '{:.3f}')} | {_cell(s['acc_at_matched_tokens'], '{:.3f}')} "
            f"| {_cell(s['acc_at_matched_wall'], '{:.3f}')} | {_cell(s['gen_tokens'], '{:.2f}', 1e-6)} "
            f"| {_cell(s['wall_s'], '{:.0f}')} | {_cell(s['distinct_prompts_trained'], '{:.0f}')} "
            f"| {_cell(s['train_heldout_gap'], '{:+.3f}')} | {_cell(s['final_acc_start_all_wrong'], '{:.3f}')} | "
            + " | ".join(tiers)
            + " |"
        )
    budgets = summary["matched_budgets"]
    if budgets:
        lines.append("")
        lines.append(
            "Matched budgets (where the cheapest arm of each seed ends): "
            + "; ".join(
                f"seed {s}: {b['gen_tokens'] / 1e6:.2f} M tokens, {b['wall_s']:.0f} s"
                for s, b in budgets.items()
            )
        )
    return "\n".join(lines) + "\n"


def plot(
    records: Sequence[Mapping[str, Any]],
    arms: Sequence[str],
    out: Path,
    prefix: str = "coverage",
    labels: tuple[str, str] = (
        "training time, s (validation excluded; offline pass included)",
        "generated response tokens (offline pass included)",
    ),
) -> list[Path]:
    """``<prefix>_acc_vs_wall.png`` and ``<prefix>_acc_vs_tokens.png``: every run's curve, the
    x axes labelled ``labels``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = dict(zip(arms, plt.get_cmap("tab10").colors))
    paths = []
    for x, label, name in (("wall_s", labels[0], "wall"), ("gen_tokens", labels[1], "tokens")):
        fig, ax = plt.subplots(figsize=(7.5, 4.8))
        seen = set()
        for r in records:
            pts = curve(r, x)
            ax.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                "o-",
                ms=3,
                color=colors.get(r["arm"], "k"),
                alpha=0.75,
                label=None if r["arm"] in seen else r["arm"],
            )
            seen.add(r["arm"])
        ax.set_xlabel(label)
        ax.set_ylabel("held-out accuracy")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = out / f"{prefix}_acc_vs_{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
