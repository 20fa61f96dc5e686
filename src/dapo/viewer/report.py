"""``dapo report RUN_DIR``: one self-contained HTML page (figures embedded as base64 PNG) showing
how dynamic sampling behaved, plus each figure as a PNG file beside the page.

Reads ``metrics.jsonl`` (verl metric names), ``groups.jsonl`` (``dapo.outputs.records``),
``viewer.json`` and ``summary.json`` when present; every figure whose data is missing is listed
in the page with the reason instead of being drawn empty.
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from dapo.atomic import write_bytes
from dapo.errors import DapoError
from dapo.outputs.records import FATES, VIEWER_FILE, read_groups, read_metrics

DS = "dynamic_sampling/"
COV = DS + "coverage/"  # dapo.sampling.coverage
FATE_STYLE = {  # label, colour
    "kept": ("kept", "#2e7d32"),
    "filtered_all_correct": ("filtered: all correct", "#1565c0"),
    "filtered_all_wrong": ("filtered: all wrong", "#c62828"),
    "filtered_out_of_band": ("filtered: out of band", "#ef6c00"),
    "skipped": ("skipped before rollout", "#9e9e9e"),
}
PHASES = ("gen", "reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor")
PHASE_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")


class ReportError(DapoError, ValueError):
    pass


@dataclass
class RunData:
    run_dir: Path
    metrics: dict[int, dict[str, Any]]
    groups: dict[int, dict[str, Any]]
    info: dict[str, Any]
    summary: dict[str, Any]

    def train_steps(self) -> list[int]:
        """Steps that trained or generated (step 0 holds the validation before training)."""
        steps = {s for s, m in self.metrics.items() if s > 0 and _has_train_metrics(m)}
        steps |= {s for s in self.groups if s > 0}
        return sorted(steps)

    def series(self, key: str, steps: list[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        steps = self.train_steps() if steps is None else steps
        xs, ys = [], []
        for s in steps:
            v = self.metrics.get(s, {}).get(key)
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
                xs.append(s)
                ys.append(float(v))
        return np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)

    def max_response_length(self) -> int | None:
        for g in reversed(list(self.groups.values())):
            if g.get("max_response_length"):
                return int(g["max_response_length"])
        v = self.info.get("max_response_length")
        return int(v) if v else None

    def overlong_buffer_len(self) -> int:
        for g in reversed(list(self.groups.values())):
            if g.get("overlong_buffer_len"):
                return int(g["overlong_buffer_len"])
        return int(self.info.get("overlong_buffer_len") or 0)


def _has_train_metrics(m: dict[str, Any]) -> bool:
    return any(k.startswith(("train/", DS, "timing_s/step", "actor/", "critic/")) for k in m)


def load_run(run_dir: str | Path) -> RunData:
    run_dir = Path(run_dir).expanduser()
    if not run_dir.is_dir():
        raise ReportError(f"{run_dir}: no such run directory")
    metrics = read_metrics(run_dir)
    groups = read_groups(run_dir)
    if not metrics and not groups:
        raise ReportError(
            f"{run_dir}: neither metrics.jsonl nor groups.jsonl found; pass the run directory "
            "(trainer.default_local_dir) of a run that logged with trainer.logger containing jsonl"
        )
    info = _read_json(run_dir / VIEWER_FILE)
    summary = _read_json(run_dir / "summary.json")
    return RunData(run_dir, metrics, groups, info, summary)


def _read_json(p: Path) -> dict[str, Any]:
    try:
        d = json.loads(p.read_text())
        return d if isinstance(d, dict) else {}
    except (OSError, ValueError):
        return {}


# ---------------------------------------------------------------------------------------- figures


def _figure(height: float = 3.4, width: float = 7.2):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    return fig, fig.add_subplot(1, 1, 1)


def _step_axis(ax, steps: list[int]) -> None:
    ax.set_xlabel("training step")
    if steps:
        ax.set_xlim(min(steps) - 0.5, max(steps) + 0.5)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(True, axis="y", alpha=0.3)


def fig_group_heatmap(run: RunData):
    """x: step, y: fraction of a group's responses correct, colour: number of groups."""
    steps = sorted(s for s in run.groups if s > 0)
    entries = [(s, g) for s in steps for g in run.groups[s].get("groups", []) if g.get("mean") is not None]
    if not entries:
        return None, "no per-group outcomes: groups.jsonl is missing or has no acc/score"
    sizes = {int(g["n"]) for _, g in entries}
    if len(sizes) == 1 and next(iter(sizes)) <= 64:
        n = next(iter(sizes))
        edges = (np.arange(n + 2) - 0.5) / n
    else:
        n = 20
        edges = np.linspace(-0.025, 1.025, 22)
    lo, hi = steps[0], steps[-1]
    counts = np.zeros((len(edges) - 1, hi - lo + 1))
    for s, g in entries:
        yi = int(np.clip(np.searchsorted(edges, float(g["mean"]), side="right") - 1, 0, len(edges) - 2))
        counts[yi, s - lo] += int(g.get("count", 1))
    fig, ax = _figure(3.8)
    from matplotlib import colormaps

    cmap = colormaps["viridis"].with_extremes(bad="white")
    x_edges = np.arange(lo, hi + 2) - 0.5
    mesh = ax.pcolormesh(x_edges, edges, np.ma.masked_equal(counts, 0), cmap=cmap, shading="flat")
    fig.colorbar(mesh, ax=ax, label="groups", pad=0.01)
    xs, low = run.series(DS + "band_low", steps)
    if len(xs):
        _, high = run.series(DS + "band_high", steps)
        ax.step(xs, low, where="mid", color="#ef6c00", lw=1.2, ls="--", label="keep band")
        ax.step(xs, high, where="mid", color="#ef6c00", lw=1.2, ls="--")
        ax.legend(loc="upper right", fontsize=8)
    ax.set_ylim(edges[0], edges[-1])
    ax.set_ylabel("fraction of group correct")
    ax.set_title("Group accuracy per step (every generated group, kept and filtered)", fontsize=10)
    _step_axis(ax, steps)
    ax.grid(False)
    return fig, None


def _fate_counts(run: RunData, steps: list[int]) -> dict[str, np.ndarray]:
    keys = {
        "kept": DS + "kept_groups",
        "filtered_all_correct": DS + "filtered_all_correct",
        "filtered_all_wrong": DS + "filtered_all_wrong",
        "filtered_out_of_band": DS + "filtered_out_of_band",
        "skipped": DS + "skipped_prompts",
    }
    out: dict[str, np.ndarray] = {}
    for fate, key in keys.items():
        vals = []
        for s in steps:
            m = run.metrics.get(s, {})
            if key in m and isinstance(m[key], int | float):
                vals.append(float(m[key]))
            elif s in run.groups:
                g = run.groups[s]
                if fate == "skipped":
                    vals.append(float(g.get("skipped_prompts", 0)))
                else:
                    vals.append(
                        float(sum(x.get("count", 1) for x in g.get("groups", []) if x["fate"] == fate))
                    )
            else:
                vals.append(0.0)
        out[fate] = np.asarray(vals)
    return out


def fig_fates(run: RunData):
    steps = run.train_steps()
    counts = _fate_counts(run, steps)
    if not steps or not any(c.sum() for c in counts.values()):
        return None, "no dynamic_sampling/* counts in metrics.jsonl and no groups.jsonl"
    fig, ax = _figure()
    bottom = np.zeros(len(steps))
    for fate in FATES.values():
        c = counts[fate]
        if not c.sum():
            continue
        label, color = FATE_STYLE[fate]
        ax.bar(steps, c, bottom=bottom, width=0.85, color=color, label=label, linewidth=0)
        bottom += c
    ax.set_ylabel("generated groups")
    handles, labels = ax.get_legend_handles_labels()
    if counts["skipped"].sum():
        # skipped prompts can outnumber generated groups by far: own axis, so bars stay readable
        ax2 = ax.twinx()
        label, color = FATE_STYLE["skipped"]
        (line,) = ax2.plot(steps, counts["skipped"], color="#424242", marker="o", ms=3, lw=1.2, ls="--")
        ax2.set_ylabel("prompts skipped before rollout", color="#424242")
        ax2.set_ylim(bottom=0)
        handles.append(line)
        labels.append(label + " (right axis)")
    ax.set_title("What happened to each prompt, per step", fontsize=10)
    ax.legend(
        handles, labels, fontsize=8, ncols=3, loc="upper left", bbox_to_anchor=(0, -0.22), frameon=False
    )
    _step_axis(ax, steps)
    return fig, None


def fig_rounds(run: RunData):
    steps = run.train_steps()
    xs, ys = run.series("train/num_gen_batches", steps)
    if not len(xs):
        pairs = [(s, run.groups[s].get("rounds", 0)) for s in steps if s in run.groups]
        xs = np.asarray([p[0] for p in pairs], dtype=float)
        ys = np.asarray([p[1] for p in pairs], dtype=float)
    if not len(xs):
        return None, "no train/num_gen_batches in metrics.jsonl"
    fig, ax = _figure(2.8)
    ax.bar(xs, ys, width=0.85, color="#5c6bc0", linewidth=0)
    ax.axhline(float(ys.mean()), color="black", lw=1, ls=":", label=f"mean {ys.mean():.2f}")
    ax.set_ylabel("generation rounds")
    ax.set_title("Generation rounds per training step", fontsize=10)
    ax.legend(fontsize=8, loc="upper right")
    ax.yaxis.get_major_locator().set_params(integer=True)
    _step_axis(ax, steps)
    return fig, None


def fig_qualified(run: RunData):
    steps = run.train_steps()
    xs, ys = run.series(DS + "qualified_ratio", steps)
    if not len(xs):
        return None, "no dynamic_sampling/qualified_ratio in metrics.jsonl"
    fig, ax = _figure(2.8)
    ax.plot(xs, ys, marker="o" if len(xs) <= 60 else None, ms=3, color="#2e7d32", lw=1.4)
    ax.fill_between(xs, 0, ys, color="#2e7d32", alpha=0.12)
    ax.set_ylim(0, 1.02)
    ax.set_ylabel("kept / generated groups")
    ax.set_title("Qualified ratio (share of generated groups kept)", fontsize=10)
    _step_axis(ax, steps)
    return fig, None


def fig_coverage(run: RunData):
    steps = run.train_steps()
    xs, rolled = run.series(COV + "rolled_out_prompts", steps)
    if not len(xs):
        return None, "no dynamic_sampling/coverage/* in metrics.jsonl (strategies default and stream log it)"
    fig, ax = _figure(3.0)
    ax.plot(xs, rolled, color="#1565c0", lw=1.5, label="prompts rolled out so far")
    tx, trained = run.series(COV + "trained_prompts", steps)
    ax.plot(tx, trained, color="#2e7d32", lw=1.5, label="prompts trained so far")
    nx, never = run.series(COV + "never_rolled_out", steps)
    if len(nx):
        pool = float(never[-1] + rolled[-1]) if len(nx) == len(xs) else None
        if pool:
            ax.axhline(pool, color="black", lw=1, ls=":", label=f"pool ({pool:.0f} prompts)")
    ax.set_ylim(bottom=0)
    ax.set_ylabel("distinct prompts")
    handles, labels = ax.get_legend_handles_labels()
    sx, share = run.series(COV + "top10_trained_share", steps)
    if len(sx):
        ax2 = ax.twinx()
        (line,) = ax2.plot(sx, share, color="#6a1b9a", lw=1.2, ls="--")
        ax2.set_ylim(0, 1.02)
        ax2.set_ylabel("share of trained groups", color="#6a1b9a")
        handles.append(line)
        labels.append("to the most-trained 10% of the pool (right axis)")
    ax.set_title("Coverage: how much of the pool is rolled out and trained", fontsize=10)
    ax.legend(
        handles, labels, fontsize=8, loc="upper left", bbox_to_anchor=(0, -0.22), frameon=False, ncols=2
    )
    _step_axis(ax, steps)
    return fig, None


def fig_response_length(run: RunData):
    steps = run.train_steps()
    R = run.max_response_length()
    L = run.overlong_buffer_len()
    hsteps = [s for s in steps if "response_length_hist" in run.groups.get(s, {})]
    fig, ax = _figure(3.8)
    if hsteps:
        from matplotlib import colormaps

        w = int(run.groups[hsteps[-1]]["response_length_hist"]["bin_width"])
        nb = max(len(run.groups[s]["response_length_hist"]["counts"]) for s in hsteps)
        lo, hi = hsteps[0], hsteps[-1]
        grid = np.zeros((nb, hi - lo + 1))
        means_x, means_y = [], []
        for s in hsteps:
            h = run.groups[s]["response_length_hist"]
            c = np.asarray(h["counts"], dtype=float)
            if int(h["bin_width"]) != w:  # a resumed run with another length: rebin roughly
                idx = (np.arange(len(c)) * int(h["bin_width"])) // w
                c = np.bincount(np.minimum(idx, nb - 1), weights=c, minlength=nb)
            grid[: len(c), s - lo] = c
            if "response_length" in run.groups[s]:
                means_x.append(s)
                means_y.append(run.groups[s]["response_length"]["mean"])
        cmap = colormaps["magma_r"].with_extremes(bad="white")
        mesh = ax.pcolormesh(
            np.arange(lo, hi + 2) - 0.5,
            np.arange(nb + 1) * w,
            np.ma.masked_equal(grid, 0),
            cmap=cmap,
            shading="flat",
        )
        fig.colorbar(mesh, ax=ax, label="responses", pad=0.01)
        ax.plot(means_x, means_y, color="#1565c0", lw=1.4, label="mean (all generated)")
    else:
        xs, mean = run.series("response_length/mean", steps)
        if not len(xs):
            return None, "no response lengths: neither groups.jsonl histograms nor response_length/mean"
        _, lo_ = run.series("response_length/min", steps)
        _, hi_ = run.series("response_length/max", steps)
        if len(lo_) == len(xs) and len(hi_) == len(xs):
            ax.fill_between(xs, lo_, hi_, color="#7e57c2", alpha=0.2, label="min-max (trained)")
        ax.plot(xs, mean, color="#1565c0", lw=1.4, label="mean (trained)")
    if R:
        ax.axhline(R, color="black", lw=1, label=f"max_response_length={R}")
        if L:
            ax.axhspan(R - L, R, facecolor="#e53935", alpha=0.13, hatch="//", edgecolor="#e53935", lw=0)
            ax.plot([], [], color="#e53935", alpha=0.4, lw=6, label=f"overlong buffer ({L} tokens)")
        ax.set_ylim(0, R * 1.04)
    ax.set_ylabel("response length (tokens)")
    ax.set_title("Response-length distribution per step", fontsize=10)
    ax.legend(fontsize=8, loc="lower right", framealpha=0.9)
    _step_axis(ax, steps)
    ax.grid(False)
    return fig, None


def fig_validation(run: RunData):
    all_steps = sorted(run.metrics)
    # accuracies only: verl also logs the spread (best@N/std, maj@N/std), not an accuracy
    keys = sorted(
        {k for m in run.metrics.values() for k in m if k.startswith("val-core/") and not k.endswith("/std")}
    )
    if not keys:
        keys = ["val/acc"] if any("val/acc" in m for m in run.metrics.values()) else []
    if not keys:
        return None, "no validation metrics (val-core/* or val/acc): set trainer.test_freq"
    fig, ax = _figure(3.0)
    for k in keys:
        xs, ys = run.series(k, all_steps)
        label = k.removeprefix("val-core/")
        ax.plot(xs, ys, marker="o", ms=4, lw=1.5, label=label)
        if len(ys) and len(keys) == 1:
            ax.annotate(
                f"{ys[-1]:.3f}", (xs[-1], ys[-1]), textcoords="offset points", xytext=(4, 4), fontsize=8
            )
    ax.set_ylabel("accuracy")
    ax.set_title("Validation accuracy (step 0: before training)", fontsize=10)
    ax.legend(fontsize=8, loc="best")
    _step_axis(ax, all_steps)
    return fig, None


def fig_throughput(run: RunData):
    steps = run.train_steps()
    xs, ys = run.series("perf/throughput", steps)
    if not len(xs):
        return None, "no perf/throughput in metrics.jsonl"
    fig, ax = _figure(2.8)
    ax.plot(xs, ys, color="#00838f", lw=1.4, marker="o" if len(xs) <= 60 else None, ms=3)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("tokens / s")
    ax.set_title("Throughput (perf/throughput: trained tokens per second of step)", fontsize=10)
    _step_axis(ax, steps)
    return fig, None


def fig_timing(run: RunData):
    steps = run.train_steps()
    xs, total = run.series("timing_s/step", steps)
    phases = [p for p in PHASES if run.series("timing_s/" + p, steps)[0].size]
    if not len(xs) and not phases:
        return None, "no timing_s/* in metrics.jsonl"
    fig, ax = _figure()
    bottom = np.zeros(len(steps))
    for p, color in zip(PHASES, PHASE_COLORS):
        if p not in phases:
            continue
        v = np.asarray([float(run.metrics.get(s, {}).get("timing_s/" + p) or 0.0) for s in steps])
        ax.bar(steps, v, bottom=bottom, width=0.85, color=color, label=p, linewidth=0)
        bottom += v
    if len(xs):
        step_t = np.asarray([float(run.metrics.get(s, {}).get("timing_s/step") or 0.0) for s in steps])
        other = np.clip(step_t - bottom, 0, None)
        if other.sum() > 0:
            ax.bar(steps, other, bottom=bottom, width=0.85, color="#bdbdbd", label="other", linewidth=0)
            bottom += other
    test = np.asarray([float(run.metrics.get(s, {}).get("timing_s/testing") or 0.0) for s in steps])
    if test.sum() > 0:
        ax.bar(
            steps,
            test,
            bottom=bottom,
            width=0.85,
            color="white",
            edgecolor="#616161",
            hatch="///",
            label="testing",
            linewidth=0.5,
        )
    ax.set_ylabel("seconds")
    ax.set_title("Time per step, split by phase", fontsize=10)
    ax.legend(fontsize=8, ncols=5, loc="upper left", bbox_to_anchor=(0, -0.22), frameon=False)
    _step_axis(ax, steps)
    return fig, None


@dataclass
class FigureSpec:
    name: str
    title: str
    caption: str
    build: Callable[[RunData], tuple[Any, str | None]]
    wide: bool = False


FIGURES = (
    FigureSpec(
        "group_accuracy",
        "Group accuracy distribution",
        "Each column is one training step; each cell counts the groups (one prompt, n responses) whose "
        "fraction of correct responses falls there. The bottom and top rows are the zero-spread groups "
        "that dynamic sampling filters out (all wrong / all correct). Healthy runs keep mass in the middle.",
        fig_group_heatmap,
        wide=True,
    ),
    FigureSpec(
        "fates",
        "Kept vs filtered vs skipped",
        "Prompts per step: groups kept for training, filtered because every response was correct or "
        "every response was wrong (or the group mean fell outside the keep band), and prompts skipped "
        "before rollout from their history.",
        fig_fates,
    ),
    FigureSpec(
        "rounds",
        "Generation rounds",
        "train/num_gen_batches: rounds of rollout needed to fill one training batch.",
        fig_rounds,
    ),
    FigureSpec(
        "qualified_ratio",
        "Qualified ratio",
        "dynamic_sampling/qualified_ratio: kept groups / generated groups in the step.",
        fig_qualified,
    ),
    FigureSpec(
        "coverage",
        "Coverage",
        "dynamic_sampling/coverage/*: distinct prompts rolled out and trained so far, and the share of all "
        "trained groups that went to the most-trained tenth of the pool (about 0.1 when training is spread "
        "over the whole pool). A skipper that stops visiting its data shows as flat lines far below the pool.",
        fig_coverage,
    ),
    FigureSpec("validation", "Validation accuracy", "val-core/<data source>/acc/mean@N.", fig_validation),
    FigureSpec(
        "response_length",
        "Response length",
        "Distribution of the lengths of every generated response per step; the hatched zone is the "
        "overlong buffer where the DAPO length penalty applies, the black line max_response_length "
        "(responses there were truncated).",
        fig_response_length,
        wide=True,
    ),
    FigureSpec(
        "timing",
        "Time by phase",
        "timing_s/*: generation, reward, log-prob recomputation, reference, advantage and update; "
        "'other' is the rest of timing_s/step, 'testing' the validation run after the step.",
        fig_timing,
    ),
    FigureSpec("throughput", "Throughput", "perf/throughput.", fig_throughput),
)


# ---------------------------------------------------------------------------------------- page


def _summary_rows(run: RunData) -> list[tuple[str, str]]:
    steps = run.train_steps()
    rows: list[tuple[str, str]] = [
        ("run directory", str(run.run_dir.resolve())),
        ("training steps", str(len(steps))),
    ]
    counts = _fate_counts(run, steps)
    gen = sum(float(counts[f].sum()) for f in FATES.values())
    if gen:
        rows.append(("groups generated", f"{gen:.0f}"))
        for f in FATES.values():
            c = float(counts[f].sum())
            if c:
                rows.append((FATE_STYLE[f][0], f"{c:.0f} ({100 * c / gen:.1f}%)"))
        if counts["skipped"].sum():
            rows.append(("prompts skipped before rollout", f"{counts['skipped'].sum():.0f}"))
    rows += _coverage_rows(run, steps)
    _, rounds = run.series("train/num_gen_batches", steps)
    if len(rounds):
        rows.append(("rounds per step", f"mean {rounds.mean():.2f}, max {rounds.max():.0f}"))
    _, t = run.series("timing_s/step", steps)
    if len(t):
        rows.append(("time in steps", f"{t.sum():.1f} s ({t.mean():.2f} s/step)"))
    for key in ("val_acc_before", "val_acc_after"):
        v = run.summary.get(key)
        if isinstance(v, int | float):
            rows.append((key.replace("_", " "), f"{v:.4f}"))
    R = run.max_response_length()
    if R:
        L = run.overlong_buffer_len()
        rows.append(("max_response_length / overlong buffer", f"{R} / {L}"))
    return rows


def _coverage_rows(run: RunData, steps: list[int]) -> list[tuple[str, str]]:
    last = next(
        (run.metrics[s] for s in reversed(steps) if COV + "rolled_out_prompts" in run.metrics.get(s, {})),
        None,
    )
    if last is None:
        return []
    rolled, trained = float(last[COV + "rolled_out_prompts"]), float(last[COV + "trained_prompts"])
    never = last.get(COV + "never_rolled_out")
    pool = f" of {rolled + float(never):.0f}" if isinstance(never, int | float) else ""
    _, against = run.series(COV + "skipped_with_spread", steps)
    return [
        ("prompts rolled out / trained", f"{rolled:.0f} / {trained:.0f}{pool}"),
        (
            "trained groups to the most-trained 10% of the pool",
            f"{float(last[COV + 'top10_trained_share']):.0%}",
        ),
        ("skips of a prompt whose last group had spread", f"{against.sum():.0f}"),
    ]


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1500px;
color:#212121;background:#fafafa;padding:0 16px}
h1{font-size:22px;margin:0 0 4px} .sub{color:#616161;font-size:13px;margin-bottom:16px}
table.summary{border-collapse:collapse;font-size:13px;margin-bottom:18px;background:#fff}
table.summary td{border:1px solid #e0e0e0;padding:4px 10px} table.summary td:first-child{color:#616161}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(560px,1fr));gap:16px}
figure{margin:0;background:#fff;border:1px solid #e0e0e0;border-radius:6px;padding:10px}
figure.wide{grid-column:1/-1} figure img{width:100%;height:auto;display:block}
figure.wide img{max-width:920px;margin:auto}
figcaption{font-size:12.5px;color:#424242;margin-top:6px;line-height:1.4} figcaption b{color:#212121}
.missing{font-size:13px;color:#8d6e63} .missing li{margin:2px 0}
"""


def render_html(run: RunData, figures: list[tuple[FigureSpec, bytes | None, str | None]]) -> str:
    title = f"dapo report: {run.run_dir.resolve().name}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f'<div class="sub">generated {datetime.now().strftime("%Y-%m-%d %H:%M:%S")} by dapo report</div>',
        '<table class="summary">',
    ]
    for k, v in _summary_rows(run):
        parts.append(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>")
    parts.append('</table><div class="grid">')
    missing = []
    for spec, png, why in figures:
        if png is None:
            missing.append(f"<li><b>{html.escape(spec.title)}</b>: {html.escape(why or 'no data')}</li>")
            continue
        data = base64.b64encode(png).decode("ascii")
        cls = ' class="wide"' if spec.wide else ""
        parts.append(
            f'<figure{cls} id="{spec.name}"><img alt="{html.escape(spec.title)}" '
            f'src="data:image/png;base64,{data}"><figcaption><b>{html.escape(spec.title)}.</b> '
            f"{html.escape(spec.caption)}</figcaption></figure>"
        )
    parts.append("</div>")
    if missing:
        parts.append(
            '<h2 style="font-size:15px">Not shown</h2><ul class="missing">' + "".join(missing) + "</ul>"
        )
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def refresh_report(
    run_dir: str | Path, step: int, report_freq: int, is_last: bool, log: Callable[[str], None] = print
) -> Path | None:
    """Rebuild ``<run_dir>/report.html`` when ``trainer.report_freq`` says so (after the step's
    metrics are logged); a report that cannot be built is one log line, never a stopped run."""
    if report_freq <= 0 or not (is_last or step % report_freq == 0):
        return None
    try:
        return build_report(run_dir)
    except Exception as e:
        log(f"could not refresh the report in {run_dir}: {e}")
        return None


def build_report(run_dir: str | Path, output: str | Path | None = None) -> Path:
    """Write the HTML report (default ``<run_dir>/report.html``) and ``<stem>_<figure>.png`` beside
    it; returns the HTML path. Files are replaced atomically so a browser never sees half a page."""
    run = load_run(run_dir)
    out = Path(output) if output else run.run_dir / "report.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    figures: list[tuple[FigureSpec, bytes | None, str | None]] = []
    for spec in FIGURES:
        fig, why = spec.build(run)
        if fig is None:
            figures.append((spec, None, why))
            continue
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        png = buf.getvalue()
        write_bytes(out.parent / f"{out.stem}_{spec.name}.png", png)
        figures.append((spec, png, None))
    write_bytes(out, render_html(run, figures).encode("utf-8"))
    return out


# ---------------------------------------------------------------------------------------- CLI


def cmd_report(args: argparse.Namespace) -> int:
    try:
        out = build_report(args.run_dir, args.output)
    except ModuleNotFoundError as e:
        print(
            f"dapo report: {e.name} is missing; install it with pip install 'dapo[report]'", file=sys.stderr
        )
        return 2
    print(out)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "report",
        help="write an HTML report (sampling heatmaps, rounds, lengths, validation, timing) of a run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run directory (trainer.default_local_dir)")
    p.add_argument("--output", "-o", metavar="FILE.html", help="default: RUN_DIR/report.html")
    p.set_defaults(func=cmd_report)
