"""Graceful stopping: Ctrl-C, SIGTERM, SIGHUP or a closed console finish the current step, save,
and exit.

    with GracefulStop(printer) as stop:
        while step < total:
            train_one_step()
            if stop.requested:
                save(); break

The first SIGINT/SIGTERM/SIGHUP only sets ``requested`` (and says so); a second SIGINT raises
``KeyboardInterrupt`` at once (the user really wants out); a second SIGTERM/SIGHUP is ignored
beyond a message, since schedulers send SIGKILL after a grace period anyway. The previous
handlers are restored on exit. Outside the main thread (where Python cannot install handlers)
no handler is installed.

A console whose reader is gone (``dapo train | head``, ``| tee log`` after Ctrl-C, a closed
terminal) must not kill the trainer: :func:`guarded_console` wraps ``sys.stdout`` and
``sys.stderr`` so that a write failing with EPIPE (Python ignores SIGPIPE, so a closed pipe
is an exception on write) or EIO (a hung-up terminal) is swallowed, the stream's descriptor is
pointed at ``/dev/null`` (so later writes from any library, and the flush at exit, succeed),
and the stop is requested as for a signal: the run saves and can be resumed with the same
command.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

_NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP"}
CLOSED_CONSOLE = "closed console"


class GracefulStop:
    def __init__(
        self,
        printer: Callable[[str], None] | None = print,
        signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP),
    ):
        self.print = printer or (lambda _msg: None)
        self.signals = signals
        self.requested = False
        self.signal: int | None = None
        self.reason: str | None = None  # "SIGINT", "SIGTERM", "SIGHUP" or CLOSED_CONSOLE
        self._previous: dict[int, Any] = {}
        self._installed = False

    def request(self, signum: int | None = None, reason: str | None = None) -> None:
        """Ask for a stop without a signal (tests, other triggers)."""
        self.requested = True
        self.signal = signum
        self.reason = reason or (signal.Signals(signum).name if signum is not None else None)

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

    def _console_closed(self, stream: str) -> None:
        if self.requested:
            return
        self.request(reason=CLOSED_CONSOLE)
        _say_on_live_stream(
            f"dapo: {stream} was closed; finishing the current step, saving a checkpoint, then stopping "
            "(run the same command to resume)"
        )

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            for s in self.signals:
                self._previous[s] = signal.signal(s, self._handler)
            self._installed = True
        _listeners.append(self._console_closed)
        gone = [g.name for g in _guards() if g.gone]
        if gone:  # the reader left before the loop began
            self._console_closed(gone[0])
        return self

    def __exit__(self, *exc: object) -> None:
        if self._console_closed in _listeners:
            _listeners.remove(self._console_closed)
        if self._installed:
            for s, h in self._previous.items():
                signal.signal(s, h if h is not None else signal.SIG_DFL)
            self._previous.clear()
            self._installed = False


# ------------------------------------------------------------------------------------ console streams

_listeners: list[Callable[[str], None]] = []
_READER_GONE = (errno.EPIPE, errno.EIO, errno.ECONNRESET)


class GuardedStream:
    """A text stream whose writes never raise because its reader went away (see the module
    docstring); every other attribute is the wrapped stream's."""

    def __init__(self, stream: Any, name: str):
        self._stream = stream
        self.name = name
        self.gone = False

    @property
    def wrapped(self) -> Any:
        return self._stream

    def write(self, s: str) -> int:
        if self.gone:
            return len(s)
        try:
            return self._stream.write(s)
        except OSError as e:
            self._lost(e)
            return len(s)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if self.gone:
            return
        try:
            self._stream.flush()
        except OSError as e:
            self._lost(e)

    def _lost(self, e: OSError) -> None:
        if e.errno not in _READER_GONE:
            raise e
        self.gone = True
        try:  # the data still buffered in the wrapped stream is flushed into /dev/null at exit
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._stream.fileno())
            os.close(null)
        except (OSError, ValueError, AttributeError):
            pass
        for cb in list(_listeners):
            cb(self.name)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _guards() -> list[GuardedStream]:
    return [s for s in (sys.stdout, sys.stderr) if isinstance(s, GuardedStream)]


def _say_on_live_stream(msg: str) -> None:
    for s in (sys.stderr, sys.stdout):
        if isinstance(s, GuardedStream) and s.gone:
            continue
        try:
            print(msg, file=s, flush=True)
        except (OSError, ValueError):
            continue
        return


@contextmanager
def guarded_console() -> Iterator[None]:
    """``sys.stdout`` and ``sys.stderr`` as :class:`GuardedStream` for the duration (both are
    flushed through the guard before they are restored, so a reader that left during the last
    writes cannot turn the exit into a BrokenPipeError)."""
    saved = sys.stdout, sys.stderr
    if not isinstance(sys.stdout, GuardedStream):
        sys.stdout = GuardedStream(sys.stdout, "stdout")
    if not isinstance(sys.stderr, GuardedStream):
        sys.stderr = GuardedStream(sys.stderr, "stderr")
    try:
        yield
    finally:
        for s in (sys.stdout, sys.stderr):
            if isinstance(s, GuardedStream):
                s.flush()
        sys.stdout, sys.stderr = saved
