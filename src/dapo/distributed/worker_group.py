"""Worker groups: W workers, one per rank, driven by the single controller.

A worker is any object built by ``factory(rank, world_size, master_addr, master_port)``. The
driver calls a method on every rank at once (``call``, one argument tuple per rank, or
``call_all``, the same arguments everywhere) and gets the results in rank order. Collective
methods (all-reduce, FSDP) need every rank called together, which each implementation does:

* ``InProcessWorkerGroup``: one worker in this process (world size 1; today's default);
* ``ProcessWorkerGroup``: W local processes (``torch.multiprocessing`` spawn, one pipe each);
  tensors cross through shared memory, never the disk;
* ``dapo.distributed.ray_group.RayWorkerGroup``: W Ray actors, on one machine or a cluster.

Nothing here imports Ray.
"""

from __future__ import annotations

import socket
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

WorkerFactory = Callable[[int, int, str, int], Any]


class WorkerError(RuntimeError):
    """A worker raised; the message carries its rank and traceback."""


class WorkerGroup:
    """Interface: ``world_size``, ``call``, ``call_all``, ``shutdown``."""

    world_size: int = 1
    startup_s: float = 0.0

    def call(self, method: str, per_rank_args: Sequence[tuple], **kwargs: Any) -> list[Any]:
        raise NotImplementedError

    def call_all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        return self.call(method, [args] * self.world_size, **kwargs)

    def shutdown(self) -> None:
        pass

    def __enter__(self) -> WorkerGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class InProcessWorkerGroup(WorkerGroup):
    """One worker, called directly (no process, no copy of the arguments)."""

    def __init__(self, factory: WorkerFactory):
        t0 = time.perf_counter()
        self.world_size = 1
        self.worker = factory(0, 1, "127.0.0.1", 0)
        self.startup_s = time.perf_counter() - t0

    def call(self, method: str, per_rank_args: Sequence[tuple], **kwargs: Any) -> list[Any]:
        if len(per_rank_args) != 1:
            raise ValueError(f"in-process group has 1 rank, got {len(per_rank_args)} argument sets")
        return [getattr(self.worker, method)(*per_rank_args[0], **kwargs)]

    def shutdown(self) -> None:
        close = getattr(self.worker, "close", None)
        if close is not None:
            close()


def _process_main(rank: int, world: int, addr: str, port: int, factory: WorkerFactory, conn: Any) -> None:
    try:
        worker = factory(rank, world, addr, port)
        conn.send(("ready", None))
    except BaseException:  # report and exit: the driver raises it
        conn.send(("err", f"rank {rank} failed to start:\n{traceback.format_exc()}"))
        return
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            break
        if msg is None:
            break
        method, args, kwargs = msg
        try:
            conn.send(("ok", getattr(worker, method)(*args, **kwargs)))
        except BaseException:
            conn.send(("err", f"rank {rank} {method}:\n{traceback.format_exc()}"))
    close = getattr(worker, "close", None)
    if close is not None:
        close()


class ProcessWorkerGroup(WorkerGroup):
    """W spawned local processes talking over 127.0.0.1 (gloo on CPU, nccl on GPU)."""

    def __init__(self, factory: WorkerFactory, world_size: int, start_timeout_s: float = 300.0):
        import torch.multiprocessing as mp

        t0 = time.perf_counter()
        self.world_size = world_size
        ctx = mp.get_context("spawn")
        addr, port = "127.0.0.1", free_port()
        self._conns, self._procs = [], []
        for rank in range(world_size):
            parent, child = ctx.Pipe()
            p = ctx.Process(
                target=_process_main, args=(rank, world_size, addr, port, factory, child), daemon=True
            )
            p.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(p)
        try:
            self._gather("start", timeout=start_timeout_s)
        except BaseException:
            self.shutdown()
            raise
        self.startup_s = time.perf_counter() - t0

    def _gather(self, what: str, timeout: float | None = None) -> list[Any]:
        out, errors = [], []
        for rank, c in enumerate(self._conns):
            if timeout is not None and not c.poll(timeout):
                errors.append(f"rank {rank}: no answer to {what} within {timeout:.0f} s")
                continue
            try:
                kind, value = c.recv()
            except EOFError:
                errors.append(
                    f"rank {rank}: process exited during {what} (code {self._procs[rank].exitcode})"
                )
                continue
            if kind == "err":
                errors.append(value)
            out.append(value)
        if errors:
            raise WorkerError("\n".join(errors))
        return out

    def call(self, method: str, per_rank_args: Sequence[tuple], **kwargs: Any) -> list[Any]:
        if len(per_rank_args) != self.world_size:
            raise ValueError(f"{self.world_size} ranks, got {len(per_rank_args)} argument sets")
        for c, args in zip(self._conns, per_rank_args):
            c.send((method, tuple(args), kwargs))
        return self._gather(method)

    def shutdown(self) -> None:
        for c in getattr(self, "_conns", []):
            try:
                c.send(None)
            except (BrokenPipeError, OSError):
                pass
        for p in getattr(self, "_procs", []):
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
        self._conns, self._procs = [], []
