"""The console during training: the live progress bar over training steps (rich), the log records
printed above it, and third-party progress bars kept quiet.

Everything a run prints goes through one rich ``Console``: while the bar is live, rich prints each
line above it, so no step line is ever glued to the bar.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

# set to 1 to see transformers' / huggingface_hub's own progress bars (loading and saving weights)
THIRD_PARTY_BARS_ENV = "DAPO_THIRD_PARTY_PROGRESS"


class StepProgress:
    def __init__(self, total_steps: int, enabled: bool = True, console: Console | None = None):
        self.enabled = enabled
        self.total = total_steps
        self.console = console or Console(stderr=True)
        self.progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(bar_width=20),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=self.console,
            disable=not enabled,
            transient=False,
        )
        self.task = None

    def __enter__(self) -> StepProgress:
        self.progress.__enter__()
        self.task = self.progress.add_task("train", total=self.total, info="")
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(*exc)

    def on_round(self, info: dict[str, Any]) -> None:
        """Called by the dynamic batcher after each generation round of the current step."""
        self.progress.update(self.task, info=round_info(info))

    def advance_to(self, step: int) -> None:
        """Start the bar at ``step`` (a resumed run)."""
        self.progress.update(self.task, completed=step)

    def advance(self, metrics: dict[str, Any]) -> None:
        tput = metrics.get("perf/throughput")
        info = f"{tput:,.0f} tok/s" if tput else ""
        self.progress.update(self.task, advance=1, info=info)


def round_info(info: dict[str, Any]) -> str:
    """The bar's text after a generation round: groups collected so far against the batch size
    (those waiting in the pool from earlier steps included) and groups filtered so far."""
    parts = [f"round {info.get('round', '?')}"]
    if "target" in info and "kept" in info:
        groups = f"groups {info['kept']}/{info['target']}"
        if info.get("pool"):
            groups += f" ({info['pool']} pooled)"
        parts.append(groups)
    if info.get("filtered"):
        parts.append(f"filtered {info['filtered']}")
    if info.get("skipped_prompts"):  # draws: a step that skips most prompts draws each many times
        parts.append(f"skipped {info['skipped_prompts']} draws")
    return " · ".join(parts)


def quiet_third_party_bars() -> None:
    """Turn off transformers' and huggingface_hub's progress bars ("Loading weights", "Writing
    model shards"): they would draw over the training bar. ``DAPO_THIRD_PARTY_PROGRESS=1`` keeps them."""
    if os.environ.get(THIRD_PARTY_BARS_ENV, "").strip() not in ("", "0"):
        return
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        return
    hf_logging.disable_progress_bar()


class _ConsoleHandler(logging.Handler):
    def __init__(self, console: Console):
        super().__init__()
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.console.print(self.format(record), markup=False, highlight=False)
        except Exception:
            self.handleError(record)


@contextmanager
def logging_through(console: Console) -> Iterator[None]:
    """Route the root logger's plain terminal handlers through ``console`` (so a warning prints
    above the live bar, not into it); other handlers (files, test capture) are left alone."""
    root = logging.getLogger()
    swapped = [
        h
        for h in root.handlers
        if type(h) is logging.StreamHandler and h.stream in (sys.stderr, sys.stdout, sys.__stderr__)
    ]
    if not swapped:
        yield
        return
    handler = _ConsoleHandler(console)
    handler.setFormatter(swapped[0].formatter)
    handler.setLevel(swapped[0].level)
    for h in swapped:
        root.removeHandler(h)
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
        for h in swapped:
            root.addHandler(h)
