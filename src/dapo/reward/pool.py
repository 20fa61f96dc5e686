"""Scoring in worker processes with a per-sample wall-clock timeout.

Why not ``concurrent.futures.ProcessPoolExecutor``: it cannot cancel a running task, and
one worker that dies breaks the whole executor. This pool keeps one pipe per worker and
watches every worker itself:

* A worker gets a *chunk* of samples (cheap: one message per chunk, not per sample) and
  reports each result as it finishes. Each sample has its own deadline: ``timeout_s``
  after the previous result of that worker (or after the scorer finished loading).
* A worker past its deadline is killed (SIGKILL); the sample it was on is a *timeout*,
  the rest of its chunk goes back to the queue, and a fresh worker replaces it.
* A worker that dies (``os._exit``, a segfault, SIGKILL) is noticed when its socket
  closes; the sample it was on is an *error* (``died``), the rest is re-queued, and
  the worker is replaced. Every dead worker consumes one sample, so a batch always ends.
* A worker that dies or hangs *before* it has loaded the scorer costs no sample (the
  work is re-queued); three such failures in a row raise a RuntimeError, since that is a
  broken reward function or environment, not a bad response.
* ``map(..., deadline=)`` bounds the whole batch: at that time every sample without a
  result is a *timeout*, the workers still busy are killed and replaced, and ``map``
  returns. Many slow samples cannot stretch a step beyond it.
* Each worker's address space is capped (``RLIMIT_AS``, ``memory_limit_mb``): a scorer
  that allocates past it gets a MemoryError (an *error*) or dies (``died``); either way
  the trainer's memory is untouched and the worker is replaced if needed.
* Workers are fresh interpreters (``python -c``, as the ``spawn`` start method would
  make, with the parent's ``sys.path``), never forks of the trainer: forking a process
  that holds torch threads is unsafe, and unlike ``multiprocessing`` spawn this never
  re-imports the user's ``__main__``. Scorers are named by :class:`ScorerRef` (module +
  attribute, or file path + function name), never pickled as code. Samples and results
  are pickled over a socket.

Workers are started lazily on the first ``map`` and live until :meth:`close` (also at
interpreter exit). ``map`` is not thread-safe; use one pool per thread.
"""

from __future__ import annotations

import asyncio
import atexit
import hashlib
import importlib
import importlib.util
import inspect
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import InitVar, dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from dapo.config.resolve import default_scoring_workers
from dapo.errors import DapoError

OK, ERROR, TIMEOUT, DIED, CONFIG = "ok", "error", "timeout", "died", "config"
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass(frozen=True)
class ScorerRef:
    """A picklable name for a scoring function.

    ``module`` + ``attr`` import a module-level function (``dapo.reward.scorers`` /
    ``default_compute_score``); ``path`` + ``attr`` load a function from a ``.py`` file
    (``custom_reward_function.path`` / ``.name``). ``kwargs`` are added to every call and
    override call-time keyword arguments (verl's ``reward_kwargs``). ``preload`` names
    modules to import when a worker loads the scorer, outside the per-sample timer.
    """

    attr: str = "compute_score"
    module: str | None = None
    path: str | None = None
    kwargs: tuple[tuple[str, Any], ...] = ()
    preload: tuple[str, ...] = ()
    name: InitVar[str | None] = None  # alias of attr (custom_reward_function.name)

    def __post_init__(self, name: str | None) -> None:
        if name:
            object.__setattr__(self, "attr", name)
        if (self.module is None) == (self.path is None):
            raise ValueError("ScorerRef needs exactly one of module= or path=")

    @staticmethod
    def builtin() -> ScorerRef:
        return ScorerRef(module="dapo.reward.scorers", attr="default_compute_score", preload=("sympy",))

    @staticmethod
    def from_file(path: str, name: str = "compute_score", reward_kwargs: dict | None = None) -> ScorerRef:
        return ScorerRef(
            path=os.path.abspath(os.path.expanduser(path)), attr=name, kwargs=_freeze(reward_kwargs)
        )

    @staticmethod
    def from_callable(fn: Callable[..., Any], reward_kwargs: dict | None = None) -> ScorerRef | None:
        """A ref that re-imports ``fn`` by name in a worker, or None if it cannot (lambda, closure, __main__)."""
        module = getattr(fn, "__module__", None)
        qualname = getattr(fn, "__qualname__", "")
        if not module or module == "__main__" or "<" in qualname or "." in qualname:
            return None
        try:
            if getattr(importlib.import_module(module), qualname, None) is not fn:
                return None
        except Exception:
            return None
        return ScorerRef(module=module, attr=qualname, kwargs=_freeze(reward_kwargs))

    @property
    def reward_kwargs(self) -> dict[str, Any]:
        return dict(self.kwargs)

    def describe(self) -> str:
        return f"{self.path or self.module}:{self.attr}"

    def load(self) -> Callable[..., Any]:
        for name in self.preload:
            try:
                importlib.import_module(name)
            except ImportError:
                pass
        if self.module is not None:
            return getattr(importlib.import_module(self.module), self.attr)
        return load_function_from_file(self.path, self.attr)


def _freeze(kwargs: dict | None) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((str(k), v) for k, v in (kwargs or {}).items()))


class RewardFileError(DapoError, ImportError):
    """The custom reward file cannot be compiled; the message names the file, line and fix."""


def load_function_from_file(path: str | None, name: str) -> Callable[..., Any]:
    """Import ``name`` from the Python file at ``path`` (verl's custom_reward_function)."""
    if not path or not os.path.isfile(path):
        raise FileNotFoundError(f"custom_reward_function.path: reward function file not found: {path!r}")
    mod_name = "dapo_custom_reward_" + hashlib.sha1(path.encode()).hexdigest()[:12]
    module = sys.modules.get(mod_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(mod_name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"custom_reward_function.path: cannot import {path!r} as a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        try:
            spec.loader.exec_module(module)
        except SyntaxError as e:
            del sys.modules[mod_name]
            raise RewardFileError(
                f"custom_reward_function.path: {path} line {e.lineno}: {e.msg}; fix the file "
                "(python -m py_compile FILE shows the same)"
            ) from None
        except BaseException:
            del sys.modules[mod_name]
            raise
    fn = getattr(module, name, None)
    if not callable(fn):
        raise AttributeError(f"custom_reward_function.name: no function {name!r} in {path}")
    return fn


def call_scorer(fn: Callable[..., Any], sample: dict[str, Any], reward_kwargs: dict[str, Any]) -> Any:
    """Call with verl's keyword signature; await coroutine results (async reward functions)."""
    kwargs = dict(sample)
    kwargs.update(reward_kwargs)
    result = fn(**kwargs)
    if inspect.isawaitable(result):
        result = _run_awaitable(result)
    return result


def _run_awaitable(awaitable: Any) -> Any:
    async def _wrap() -> Any:
        return await awaitable

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_wrap())
    # Called from inside a running loop (e.g. a notebook): run on a private loop in a thread.
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        return ex.submit(asyncio.run, _wrap()).result()


def _short_error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 500 else text[:497] + "..."


def _is_config_error(exc: BaseException) -> bool:
    from dapo.reward.scorers import UnknownDataSourceError

    return isinstance(exc, UnknownDataSourceError)


def _worker_entry(fd: int, memory_limit_mb: float | None = None) -> None:
    """Entry point of a worker process: ``python -c '...; _worker_entry(FD, LIMIT)'``."""
    if memory_limit_mb:
        _limit_address_space(int(memory_limit_mb * 1024 * 1024))
    sock = socket.socket(fileno=fd)
    _worker_main(Connection(sock.detach()))


def _limit_address_space(limit_bytes: int) -> None:
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit_bytes = min(limit_bytes, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, hard))


def _orphan_watchdog(parent_pid: int) -> None:
    """Exit if the trainer dies, even while a scorer hangs (the socket EOF is not seen then)."""
    while True:
        time.sleep(1.0)
        if os.getppid() != parent_pid:
            os._exit(0)


def _worker_main(conn: Connection) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and kills us
    threading.Thread(target=_orphan_watchdog, args=(os.getppid(),), daemon=True).start()
    loaded: dict[ScorerRef, Callable[..., Any]] = {}
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        ref, items = msg
        fn = loaded.get(ref)
        if fn is None:
            try:
                fn = loaded[ref] = ref.load()
            except BaseException as exc:
                for idx, _ in items:
                    conn.send((ERROR, idx, "loading scorer failed: " + _short_error(exc)))
                continue
        conn.send(("loaded", None, None))
        reward_kwargs = ref.reward_kwargs
        for idx, sample in items:
            try:
                result = call_scorer(fn, sample, reward_kwargs)
                status = OK
            except BaseException as exc:
                if _is_config_error(exc):
                    status, result = CONFIG, str(exc)
                else:
                    status, result = ERROR, _short_error(exc)
            try:
                conn.send((status, idx, result))
            except Exception as exc:  # unpicklable result
                conn.send((ERROR, idx, "scorer result cannot be sent back: " + _short_error(exc)))


@dataclass
class _Worker:
    proc: subprocess.Popen
    conn: Connection
    todo: deque = field(default_factory=deque)
    deadline: float = math.inf
    loaded: bool = False
    eof: bool = False

    @property
    def busy(self) -> bool:
        return bool(self.todo)


class ScoringPool:
    """Worker processes that score samples with a per-sample wall-clock timeout.

    ``map(ref, samples)`` returns one ``(status, value)`` per sample, in order: status is
    ``"ok"`` (value = the scorer's result), ``"error"`` (value = message), ``"timeout"``,
    ``"died"`` (the worker process died on this sample) or ``"config"`` (the scorer raised
    UnknownDataSourceError: a configuration error the caller should raise).

    ``memory_limit_mb`` caps each worker's address space (None or 0: no cap).
    """

    def __init__(
        self,
        num_workers: int | None = None,
        timeout_s: float = 10.0,
        load_timeout_s: float = 120.0,
        max_chunk: int = 64,
        memory_limit_mb: float | None = None,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"reward_model.scoring.timeout_s must be > 0, got {timeout_s}")
        if memory_limit_mb is not None and memory_limit_mb < 0:
            raise ValueError(f"reward_model.scoring.memory_limit_mb must be >= 0, got {memory_limit_mb}")
        self.memory_limit_mb = float(memory_limit_mb or 0)
        self.num_workers = int(num_workers) if num_workers else default_scoring_workers()
        self.timeout_s = float(timeout_s)
        self.load_timeout_s = max(float(load_timeout_s), self.timeout_s)
        self.max_chunk = max(1, int(max_chunk))
        self._workers: list[_Worker] = []
        self.restarts = 0  # workers replaced after a timeout or death, over the pool's life
        self._finalizer = weakref.finalize(self, ScoringPool._shutdown, self._workers)
        atexit.register(self._finalizer)

    # -- lifecycle ---------------------------------------------------------------------
    def _spawn(self) -> _Worker:
        parent_sock, child_sock = socket.socketpair()
        fd = child_sock.fileno()
        env = dict(os.environ)
        paths = [_PACKAGE_ROOT] + [p for p in sys.path if p and os.path.isdir(p)]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        try:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    f"from dapo.reward.pool import _worker_entry; _worker_entry({fd}, {self.memory_limit_mb!r})",
                ],
                pass_fds=(fd,),
                env=env,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C in the terminal reaches the trainer only
            )
        finally:
            child_sock.close()
        return _Worker(proc=proc, conn=Connection(parent_sock.detach()))

    def _ensure_started(self) -> None:
        while len(self._workers) < self.num_workers:
            self._workers.append(self._spawn())

    @staticmethod
    def _kill(worker: _Worker) -> None:
        try:
            if worker.proc.poll() is None:
                worker.proc.kill()
            worker.proc.wait(timeout=5)
        except Exception:
            pass
        try:
            worker.conn.close()
        except Exception:
            pass

    @staticmethod
    def _shutdown(workers: list[_Worker]) -> None:
        for w in workers:
            try:
                w.conn.send(None)
            except Exception:
                pass
        for w in workers:
            try:
                w.proc.wait(timeout=1)
            except Exception:
                pass
            ScoringPool._kill(w)
        workers.clear()

    def close(self) -> None:
        ScoringPool._shutdown(self._workers)

    def __enter__(self) -> ScoringPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _replace(self, worker: _Worker) -> None:
        self._kill(worker)
        self._workers[self._workers.index(worker)] = self._spawn()
        self.restarts += 1

    # -- scoring -----------------------------------------------------------------------
    def map(
        self, ref: ScorerRef, samples: Sequence[dict[str, Any]], deadline: float | None = None
    ) -> list[tuple[str, Any]]:
        """One ``(status, value)`` per sample; ``deadline`` (``time.monotonic()``) bounds the batch."""
        n = len(samples)
        results: list[tuple[str, Any] | None] = [None] * n
        if n == 0:
            return []
        self._ensure_started()
        chunk = max(1, min(self.max_chunk, math.ceil(n / (2 * self.num_workers))))
        queue: deque[list[int]] = deque(list(range(s, min(s + chunk, n))) for s in range(0, n, chunk))
        finished = False
        try:
            self._run(ref, samples, queue, results, math.inf if deadline is None else deadline)
            finished = True
        finally:
            if not finished:  # interrupted: workers may hold stale work; start clean next time
                self.close()
        return results  # type: ignore[return-value]

    def _run(
        self, ref: ScorerRef, samples: Sequence[dict], queue: deque, results: list, deadline: float
    ) -> None:
        pending = sum(len(c) for c in queue)
        startup_failures = 0
        while pending:
            if time.monotonic() >= deadline:
                self._expire(queue, results)
                return
            for w in list(self._workers):
                if not w.busy and queue:
                    indices = queue.popleft()
                    try:
                        w.conn.send((ref, [(i, samples[i]) for i in indices]))
                    except (OSError, ValueError):  # the worker is gone already
                        queue.appendleft(indices)
                        startup_failures = self._startup_failed(w, startup_failures)
                        continue
                    w.todo.extend(indices)
                    w.loaded = False
                    w.deadline = time.monotonic() + self.load_timeout_s
            busy = [w for w in self._workers if w.busy]
            if not busy:
                continue
            wait_s = max(0.0, min(min(w.deadline for w in busy), deadline) - time.monotonic())
            ready = set(wait([w.conn for w in busy], timeout=wait_s))
            for w in busy:
                if w.conn in ready:
                    pending -= self._drain(w, results)
                if not w.busy:
                    continue
                died = w.eof or w.proc.poll() is not None
                if died:
                    pending -= self._drain(w, results)  # results it sent before dying
                    if not w.busy:
                        self._replace(w)
                        continue
                elif time.monotonic() < w.deadline:
                    continue
                if not w.loaded:
                    # died or stuck before the scorer was loaded: not the sample's fault
                    queue.appendleft(list(w.todo))
                    w.todo.clear()
                    startup_failures = self._startup_failed(w, startup_failures, ref)
                    continue
                startup_failures = 0
                idx = w.todo.popleft()
                if died:
                    try:
                        w.proc.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        pass
                    results[idx] = (DIED, f"reward worker process died (exit code {w.proc.returncode})")
                else:
                    results[idx] = (TIMEOUT, f"no result within {self.timeout_s:g}s")
                pending -= 1
                if w.todo:
                    queue.appendleft(list(w.todo))
                    w.todo.clear()
                self._replace(w)

    def _expire(self, queue: deque, results: list) -> None:
        """The batch's deadline passed: every sample without a result is a timeout."""
        message = "the step's scoring budget (reward_model.scoring.step_timeout_s) ran out"
        for w in list(self._workers):
            if w.busy:
                self._drain(w, results)  # results that arrived in time still count
            if w.busy:
                for idx in w.todo:
                    results[idx] = (TIMEOUT, message)
                w.todo.clear()
                self._replace(w)
        for indices in queue:
            for idx in indices:
                results[idx] = (TIMEOUT, message)
        queue.clear()

    def _startup_failed(self, w: _Worker, failures: int, ref: ScorerRef | None = None) -> int:
        code = w.proc.returncode
        self._replace(w)
        failures += 1
        if failures >= 3:
            what = f" loading {ref.describe()}" if ref is not None else ""
            raise RuntimeError(
                f"reward worker processes keep dying or hanging{what} before scoring anything "
                f"(last exit code {code}); check that the reward function imports cleanly in a fresh "
                "process, or set reward_model.scoring.mode=inline to score in the trainer process"
            )
        return failures

    def _drain(self, w: _Worker, results: list) -> int:
        done = 0
        try:
            while w.busy and w.conn.poll():
                status, idx, value = w.conn.recv()
                if status == "loaded":
                    w.loaded = True
                    w.deadline = time.monotonic() + self.timeout_s
                    continue
                if w.todo and w.todo[0] == idx:
                    w.todo.popleft()
                    results[idx] = (status, value)
                    w.loaded = True
                    done += 1
                    w.deadline = time.monotonic() + self.timeout_s
        except (EOFError, OSError):
            w.eof = True
        return done
