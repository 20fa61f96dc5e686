"""Graceful stopping: Ctrl-C or SIGTERM finishes the current step, saves, and exits.

    with GracefulStop(printer) as stop:
        while step < total:
            train_one_step()
            if stop.requested:
                save(); break

The first SIGINT/SIGTERM only sets ``requested`` (and says so); a second SIGINT raises
``KeyboardInterrupt`` at once (the user really wants out); a second SIGTERM is ignored beyond
a message, since schedulers send SIGKILL after a grace period anyway. The previous handlers are
restored on exit. Outside the main thread (where Python cannot install handlers) it does nothing.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

_NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}


class GracefulStop:
    def __init__(
        self,
        printer: Callable[[str], None] | None = print,
        signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM),
    ):
        self.print = printer or (lambda _msg: None)
        self.signals = signals
        self.requested = False
        self.signal: int | None = None
        self._previous: dict[int, Any] = {}
        self._installed = False

    def request(self, signum: int | None = None) -> None:
        """Ask for a stop without a signal (tests, other triggers)."""
        self.requested = True
        self.signal = signum

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        name = _NAMES.get(signum, f"signal {signum}")
        if self.requested and signum == signal.SIGINT:
            self.print(f"{name} again: stopping now, without saving")
            raise KeyboardInterrupt
        if self.requested:
            self.print(f"{name}: already stopping after the current step")
            return
        self.request(signum)
        self.print(
            f"{name}: finishing the current step, saving a checkpoint, then stopping (Ctrl-C again to abort)"
        )

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            for s in self.signals:
                self._previous[s] = signal.signal(s, self._handler)
            self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            for s, h in self._previous.items():
                signal.signal(s, h if h is not None else signal.SIG_DFL)
            self._previous.clear()
            self._installed = False
