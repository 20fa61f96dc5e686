"""The live progress bar over training steps (rich), updated after every generation round."""

from __future__ import annotations

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


class StepProgress:
    def __init__(self, total_steps: int, enabled: bool = True, console: Console | None = None):
        self.enabled = enabled
        self.total = total_steps
        self.console = console or Console(stderr=True)
        self.progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
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
        parts = [f"round {info.get('round', '?')}"]
        if "target" in info and "kept" in info:
            parts.append(f"kept {info['kept']}/{info['target']}")
        for key, label in (("filtered", "filtered"), ("skipped_prompts", "skipped")):
            if key in info:
                parts.append(f"{label} {info[key]}")
        self.progress.update(self.task, info=" ".join(parts))

    def advance_to(self, step: int) -> None:
        """Start the bar at ``step`` (a resumed run)."""
        self.progress.update(self.task, completed=step)

    def advance(self, metrics: dict[str, Any]) -> None:
        tput = metrics.get("perf/throughput")
        info = f"{tput:,.0f} tok/s" if tput else ""
        self.progress.update(self.task, advance=1, info=info)
