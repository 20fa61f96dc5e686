"""Progress lines of a warm-start build: the step, the loss, the time so far and an estimate of
the time left, at most one line every ``every_s`` seconds (a build on a loaded machine takes
minutes, so a fixed step interval is either silent for long or noisy)."""

from __future__ import annotations

import time
from collections.abc import Callable


def duration(seconds: float) -> str:
    """``42 s``, ``3 min 05 s``, ``1 h 02 min``."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def progress_line(what: str, step: int, steps: int, loss: float, elapsed_s: float) -> str:
    """One line: ``what`` at ``step`` of ``steps`` after ``elapsed_s``, the time left estimated
    from the mean step time so far."""
    left = elapsed_s / step * (steps - step) if step > 0 else 0.0
    tail = "done" if step >= steps else f"about {duration(left)} left"
    return f"  {what} step {step}/{steps} loss {loss:.3f} ({duration(elapsed_s)}, {tail})"


class BuildProgress:
    """Calls ``log`` with :func:`progress_line` after a step when ``every_s`` seconds have passed
    since the last line (and after the last step)."""

    def __init__(
        self,
        what: str,
        steps: int,
        log: Callable[[str], None],
        every_s: float = 15.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.what, self.steps, self.log, self.every_s, self.clock = what, steps, log, every_s, clock
        self.t0 = self.last = clock()

    def step(self, step: int, loss: Callable[[], float]) -> None:
        """After step ``step`` (1-based); ``loss`` is called only when a line is printed."""
        now = self.clock()
        if step >= self.steps or now - self.last >= self.every_s:
            self.last = now
            self.log(progress_line(self.what, step, self.steps, loss(), now - self.t0))
