"""Trackers: where per-step metrics go (``trainer.logger``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Protocol


class Tracker(Protocol):
    def log(self, metrics: dict[str, Any], step: int) -> None: ...
    def close(self) -> None: ...


class JsonlTracker:
    """``metrics.jsonl`` in the run directory: one object per step with ``step`` and every metric."""

    def __init__(self, run_dir: Path, filename: str = "metrics.jsonl"):
        self.path = Path(run_dir) / filename
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = self.path.open("a", encoding="utf-8")

    def log(self, metrics: dict[str, Any], step: int) -> None:
        row = {"step": step, **{k: _jsonable(v) for k, v in metrics.items()}}
        self._f.write(json.dumps(row, sort_keys=True) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def _jsonable(v: Any) -> Any:
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


# The per-step console line: (metric, label, format)
CONSOLE_FIELDS = (
    ("train/num_gen_batches", "rounds", "{:.0f}"),
    ("dynamic_sampling/kept_groups", "kept", "{:.0f}"),
    ("dynamic_sampling/filtered_all_correct", "all-right", "{:.0f}"),
    ("dynamic_sampling/filtered_all_wrong", "all-wrong", "{:.0f}"),
    ("dynamic_sampling/skipped_prompts", "skipped", "{:.0f}"),
    ("critic/score/mean", "score", "{:+.3f}"),
    ("train/acc", "acc", "{:.3f}"),
    ("response_length/mean", "len", "{:.1f}"),
    ("actor/pg_loss", "pg_loss", "{:+.4f}"),
    ("actor/entropy", "entropy", "{:.3f}"),
    ("timing_s/step", "s", "{:.1f}"),
)


class ConsoleTracker:
    """A compact line per step, plus every ``val-core`` metric when validation ran."""

    def __init__(self, printer: Any):
        self.print = printer

    def log(self, metrics: dict[str, Any], step: int) -> None:
        parts = [f"step {step}"]
        for key, label, fmt in CONSOLE_FIELDS:
            if key in metrics and metrics[key] is not None:
                parts.append(f"{label} {fmt.format(metrics[key])}")
        self.print(" | ".join(parts))
        val = {k: v for k, v in metrics.items() if k.startswith("val-core/")}
        for k, v in sorted(val.items()):
            self.print(f"  {k} = {v:.4f}")

    def close(self) -> None:
        pass


def build_trackers(names: list[str], run_dir: Path, printer: Any) -> list[Tracker]:
    out: list[Tracker] = []
    for name in names:
        if name == "console":
            out.append(ConsoleTracker(printer))
        elif name == "jsonl":
            out.append(JsonlTracker(run_dir))
        else:
            raise ValueError(f"trainer.logger: {name!r} is not available in this build; use console, jsonl")
    return out
