"""The dapo cache (``$DAPO_CACHE``, default ``~/.cache/dapo``) and the one way anything is built into it.

A build runs in a hidden sibling of its target, ``.<name>-<pid>-<random>``, renamed onto the
target when it is complete, so a reader sees the whole folder or none. One process builds a
target at a time: the builder holds an exclusive ``flock`` on ``.<name>.lock`` beside it, and a
second process asking for the same target waits, then uses what the first built. A build that
fails, or is stopped by SIGTERM or SIGHUP, removes its folder; one whose process was killed
outright (SIGKILL) leaves it, and the next build of that target removes it, since the pid in its
name is no longer running.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import os
import re
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

# signals whose default action ends the process without running cleanup code
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def cache_dir() -> Path:
    return Path(os.environ.get("DAPO_CACHE", Path.home() / ".cache" / "dapo")).expanduser()


def ensure_built(
    target: Path,
    build: Callable[[Path], dict],
    log: Callable[[str], None],
    force: bool = False,
    record: str = "dapo_warm_start.json",
) -> Path:
    """``target`` if a finished build is there (its ``record`` file, written last, exists);
    otherwise ``build(tmp_dir)``, which returns the record's contents, into a temporary sibling
    that then replaces ``target`` in one rename, so a killed build never leaves a half folder."""
    if (target / record).exists() and not force:
        return target
    parent = _mkdir(target.parent)
    try:
        with _build_lock(parent / f".{target.name}.lock", target, log):
            if (target / record).exists() and not force:
                return target  # built by the process we waited for
            remove_stale_builds(target)
            log(f"building {target.name} (first use) into {target} ...")
            tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-{os.getpid()}-", dir=parent))
            try:
                with _stop_signals_raise():
                    info = build(tmp)
                    (tmp / record).write_text(json.dumps(info, indent=2))
                    if target.exists():
                        shutil.rmtree(target)
                    os.replace(tmp, target)
            finally:
                if tmp.exists():
                    shutil.rmtree(tmp, ignore_errors=True)
    except _Stopped as e:
        # cleaned up and unlocked: end the way the signal would have ended the process
        os.kill(os.getpid(), e.signum)
        raise SystemExit(128 + e.signum) from None
    return target


def ensure_model(
    name: str,
    fingerprint: str,
    build: Callable[[Path], dict],
    log: Callable[[str], None],
    force: bool = False,
) -> Path:
    """``models/<name>-<fingerprint>/`` in the cache, ``build(dir)`` (the warm start) on first use."""
    return ensure_built(cache_dir() / "models" / f"{name}-{fingerprint}", build, log, force)


def ensure_task_files(
    name: str, fingerprint: str, write: Callable[[Path], object], log: Callable[[str], None]
) -> tuple[Path, Path]:
    """``data/<name>-<fingerprint>/{train,test}.parquet`` in the cache, ``write(dir)`` on first use."""
    d = cache_dir() / "data" / f"{name}-{fingerprint}"
    ensure_built(d, lambda tmp: (write(tmp), {"fingerprint": fingerprint})[1], log, record="dapo_task.json")
    return d / "train.parquet", d / "test.parquet"


def remove_stale_builds(target: Path) -> list[Path]:
    """Remove the temporary folders of ``target`` left by builders that are no longer running
    (their pid is in the name); returns what was removed."""
    pattern = re.compile(rf"\.{re.escape(target.name)}-(\d+)-[A-Za-z0-9_]{{8}}")
    removed = []
    for p in target.parent.glob(f".{glob.escape(target.name)}-*"):
        m = pattern.fullmatch(p.name)
        if m and p.is_dir() and not _running(int(m.group(1))):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def _running(pid: int) -> bool:
    if pid == os.getpid():
        return False  # this process is building nothing else of this name
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, another user's
    return True


@contextlib.contextmanager
def _build_lock(path: Path, target: Path, log: Callable[[str], None]) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (waiting for a builder that holds it)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            log(f"waiting for process {holder}, which is building {target} ...")
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # drops the lock


class _Stopped(BaseException):
    """A stop signal arrived during a build: raised so the build's cleanup runs."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _stop_signals_raise() -> Iterator[None]:
    """While the block runs, SIGTERM and SIGHUP raise :class:`_Stopped` where their default
    action (ending the process on the spot, no cleanup) is in place; restored on exit."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise _Stopped(signum)

    previous = {
        sig: signal.signal(sig, stop) for sig in _STOP_SIGNALS if signal.getsignal(sig) == signal.SIG_DFL
    }
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _mkdir(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p
