"""The trainer's weights to vLLM workers in other processes, broadcast over a torch.distributed
process group: the second transport beside the socket stream (:mod:`dapo.rollout.vllm_weight_stream`),
chosen by ``actor_rollout_ref.rollout.weight_transfer=collective``.

The trainer is rank 0 of a group of 1 + (number of vLLM workers) ranks and broadcasts every
tensor to all workers at once; each worker is rank (its vLLM rank) + 1. Backend ``gloo`` on CPU,
``nccl`` on CUDA, where the tensors go from GPU to GPU without the host's memory. NCCL cannot
put two ranks on one GPU, so on CUDA this needs vLLM on devices of its own (the server with
``rollout.server_devices``). Each sync builds a new group and destroys it afterwards, on both
sides, with the store it met through: a sync is rare beside what it carries, and a group that
outlives it would hold the workers' sockets (or NCCL communicators) between syncs.

Per tensor the trainer broadcasts a header, an int64 length then that many bytes of the same
JSON header the socket stream sends (:func:`~dapo.rollout.vllm_weight_stream.frame_header`,
checked by :func:`~dapo.rollout.vllm_weight_stream.read_header`: the dtype by name from a fixed
list of weight dtypes, shapes non-negative integers, the header at most ``MAX_HEADER`` bytes)
plus ``nbytes``, then the tensor's bytes in pieces of at most ``CHUNK`` bytes; an ``end`` header
closes the stream (with ``error`` when the trainer's own iterator failed). Nothing received is
ever unpickled. Each worker feeds the ``(name, tensor | RowBlock)`` pairs to the same
``dapo_reload_weights`` the socket stream feeds, so blocks of rows of the embedding tables,
their in-place writes and tensor-parallel slicing work as there. A worker whose loader fails, or
that refuses a header, keeps receiving (and discarding: a refused frame is drained in pieces of
``CHUNK`` bytes, whatever its header claims) to the end, so the trainer's broadcasts never wait
on it; it then reports its error. Each worker acknowledges through the store (``ack/<rank>``:
``ok`` or its error), and the trainer raises naming the worker that failed, or, once the RPC has
returned (:meth:`CollectiveSender.close`), the worker that never acknowledged (it died). Every wait
is bounded by ``timeout_s`` (600 s by default, as the socket's).

Threat model: other local users and processes. The rendezvous is a ``TCPStore`` that the trainer
serves on 127.0.0.1 only, on a free port, and every key lives under a random secret prefix
(``secrets.token_hex``) that reaches the workers only through the RPC; a process that does not
know it cannot find the group's keys, join the group or overwrite an acknowledgement. It could
still connect to the store's port and disturb it (the store itself has no authentication), and
gloo's own peer connections, also on 127.0.0.1, carry no token as the socket stream's do; what
such a process could feed a worker is still only a JSON header and the raw bytes of a weight
dtype, never code, and no frame of more elements than the worker's largest tensor (refused before
it is allocated). This module imports only torch, the standard library and dapo modules that
load inside vLLM's worker processes.
"""

from __future__ import annotations

import json
import secrets
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from dapo.checkpoint.rows import RowBlock
from dapo.rollout.vllm_weight_stream import MAX_HEADER, ThreadedSender, frame_header, is_count, read_header

RPC_METHOD = "dapo_receive_weights_collective"  # WeightReceiver's method that joins the group
BACKENDS = ("gloo", "nccl")
CHUNK = 64 * 2**20  # the most bytes one broadcast carries (bounds what a refused frame costs to drain)
_POLL_S = 0.05


def new_group(store: dist.Store, rank: int, size: int, backend: str, timeout_s: float) -> Any:
    """A process group of ``size`` ranks built straight from ``store`` (the caller's default group,
    vLLM's in a worker, is left alone); gloo on the loopback interface."""
    timeout = timedelta(seconds=timeout_s)
    store = dist.PrefixStore("pg/", store)  # the group's keys apart from ours
    if backend == "nccl":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, size, opts)
    if backend != "gloo":
        raise ValueError(f"weight collective: backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = timeout
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    return dist.ProcessGroupGloo(store, rank, size, opts)


def _shutdown(pg: Any) -> None:
    try:
        pg.shutdown()
    except Exception:
        pass  # already broken: the group is dropped with the reference


class _Link:
    """Broadcasts from rank 0 in a group, in pieces of at most ``CHUNK`` bytes; ``device`` is
    where the group's tensors live (CUDA for nccl)."""

    def __init__(self, pg: Any, device: torch.device):
        self.pg, self.device = pg, device
        self._opts = dist.BroadcastOptions()
        self._opts.rootRank = 0

    def broadcast(self, t: torch.Tensor) -> None:
        self.pg.broadcast([t], self._opts).wait()

    def bytes(self, flat: torch.Tensor) -> None:
        """Broadcast (rank 0) or receive into (the others) the flat uint8 tensor ``flat``; on rank 0
        each piece is copied to the group's device just before it goes, and let go after."""
        for s in range(0, flat.numel(), CHUNK):
            piece = flat[s : s + CHUNK]
            if piece.device == self.device:
                self.broadcast(piece)
            else:  # the trainer's tensor on another device (host memory for nccl, a GPU for gloo)
                self.broadcast(piece.to(self.device))

    def skip(self, nbytes: int) -> None:
        """Receive ``nbytes`` and drop them, one piece at a time."""
        scratch = torch.empty(min(nbytes, CHUNK), dtype=torch.uint8, device=self.device)
        for s in range(0, nbytes, CHUNK):
            self.broadcast(scratch[: min(CHUNK, nbytes - s)])

    def send_header(self, header: dict[str, Any] | bytes) -> None:
        raw = header if isinstance(header, bytes) else encode_header(header)
        self.broadcast(torch.tensor([len(raw)], dtype=torch.int64, device=self.device))
        self.bytes(torch.frombuffer(bytearray(raw), dtype=torch.uint8))

    def recv_header(self) -> dict[str, Any]:
        n = torch.zeros(1, dtype=torch.int64, device=self.device)
        self.broadcast(n)
        size = int(n.item())
        if size < 0:
            raise _OutOfStep(f"weight collective: a header of {size} bytes")
        if size > MAX_HEADER:
            self.skip(size)
            raise ValueError(f"weight collective: a header of {size} bytes (at most {MAX_HEADER})")
        raw = torch.empty(size, dtype=torch.uint8, device=self.device)
        self.bytes(raw)
        try:
            h = json.loads(bytes(raw.cpu().numpy()))
        except ValueError as e:
            raise _OutOfStep(f"weight collective: a header that is not JSON ({e})") from e
        if not isinstance(h, dict):
            raise _OutOfStep(f"weight collective: a header that is not an object: {str(h)[:200]}")
        return h


class _OutOfStep(ValueError):
    """A header after which the worker cannot tell what comes next: it stops receiving."""


class GroupFailed(RuntimeError):
    """A broadcast failed: the group is broken (a worker left it, or a wait timed out)."""


def encode_header(header: dict[str, Any]) -> bytes:
    """``header`` as it is broadcast; ``ValueError`` when it is larger than a worker takes."""
    raw = json.dumps(header).encode()
    if len(raw) > MAX_HEADER:
        raise ValueError(f"weight collective: a header of {len(raw)} bytes (at most {MAX_HEADER})")
    return raw


def send_stream(link: _Link, weights: Iterable[tuple[str, torch.Tensor | RowBlock]]) -> int:
    """Broadcast ``weights`` then the end header (the trainer's side); the bytes sent. A failure
    of the iterator, or of a frame before any of it went out (not a tensor, a header too large),
    is broadcast as an ``end`` with ``error`` (the workers stop) and re-raised; a failed broadcast
    raises :class:`GroupFailed`."""
    nbytes, it = 0, iter(weights)
    while True:
        try:
            name, t = next(it)
            rows = (t.rows if isinstance(t, RowBlock) else t).detach()
            flat = rows.contiguous().reshape(-1).view(torch.uint8)
            header = encode_header({**frame_header(name, t), "nbytes": flat.numel()})
        except StopIteration:
            break
        except BaseException as e:
            # the workers wait for a header: without this end they would wait out the timeout
            try:
                link.send_header({"end": True, "error": f"{type(e).__name__}: {e}"[:4000]})
            except Exception:
                pass  # the group failed as well: the workers' waits time out; the trainer's error is the one
            raise
        _broadcast(link.send_header, header)
        _broadcast(link.bytes, flat)
        nbytes += flat.numel()
        del t, rows, flat  # not held while the next tensor is fetched
    _broadcast(link.send_header, {"end": True})
    return nbytes


def _broadcast(send: Any, what: Any) -> None:
    try:
        send(what)
    except Exception as e:
        raise GroupFailed(f"weight collective: a broadcast failed ({type(e).__name__}: {e})") from e


class Receiver:
    """The worker's side of one stream: :meth:`frames` yields what arrives; :meth:`drain` reads
    (and drops) the rest of the stream after the consumer stopped early."""

    def __init__(self, link: _Link, max_numel: int | None = None):
        self.link = link
        self.max_numel = max_numel  # the most elements one frame may claim (a shape is a claim)
        self.ended = False
        self.out_of_step = False

    def _header(self) -> dict[str, Any]:
        try:
            return self.link.recv_header()
        except _OutOfStep:
            self.out_of_step = True
            raise

    def frames(self) -> Iterator[tuple[str, torch.Tensor | RowBlock]]:
        while True:
            h = self._header()
            if h.get("end"):
                self.ended = True
                if h.get("error"):
                    raise RuntimeError(f"the trainer stopped the weight stream: {h['error']}")
                return
            nbytes = h.get("nbytes")
            if not is_count(nbytes):
                self.out_of_step = True
                raise ValueError(f"weight collective: a header without its size: {str(h)[:200]}")
            try:
                f = read_header(h, self.max_numel)
                if f.nbytes != nbytes:
                    raise ValueError(
                        f"weight collective: {f.name} is {f.nbytes} bytes, the header says {nbytes}"
                    )
            except ValueError:
                self.link.skip(nbytes)  # still in step with the trainer for drain()
                raise
            t = torch.empty(f.shape, dtype=f.dtype, device=self.link.device)
            self.link.bytes(t.reshape(-1).view(torch.uint8))
            yield f.name, f.wrap(t)
            del t

    def drain(self) -> int:
        """Receive and drop every frame up to the end; how many there were (0 when the stream
        had already ended, or cannot be followed any more)."""
        n = 0
        while not (self.ended or self.out_of_step):
            h = self._header()
            if h.get("end"):
                self.ended = True
                break
            nbytes = h.get("nbytes")
            if not is_count(nbytes):
                self.out_of_step = True
                break
            self.link.skip(nbytes)
            n += 1
        return n


def _store(host: str, port: int, master: bool, timeout_s: float, listen_fd: int | None = None) -> Any:
    return dist.TCPStore(
        host,
        port,
        is_master=master,
        master_listen_fd=listen_fd,
        wait_for_workers=False,
        timeout=timedelta(seconds=timeout_s),
    )


def receive_into(
    consume: Any,
    host: str,
    port: int,
    prefix: str,
    rank: int,
    world_size: int,
    backend: str,
    device: torch.device,
    timeout_s: float = 600.0,
    max_numel: int | None = None,
) -> None:
    """The worker's side of a sync (rank >= 1): join the group, hand the stream to ``consume``
    (an iterator of ``(name, tensor | RowBlock)`` pairs, read to its end), drain what it left,
    acknowledge through the store, destroy the group; a failure is acknowledged with its text
    and re-raised. A frame of more than ``max_numel`` elements is refused before it is allocated."""
    store = dist.PrefixStore(prefix + "/", _store(host, port, False, timeout_s))
    store.set(f"join/{rank}", "ready")
    if store.get("start") != b"go":
        raise RuntimeError("weight collective: the trainer gave the sync up before it started")
    pg = new_group(store, rank, world_size, backend, timeout_s)
    link = _Link(pg, device)
    error: BaseException | None = None
    try:
        rx = Receiver(link, max_numel)
        try:
            consume(rx.frames())
        except BaseException as e:
            error = e
        try:
            left = rx.drain()
        except BaseException as e:
            error = error or e
            left = 0
        if error is None and left:
            error = RuntimeError(f"weight collective: the loader stopped {left} tensors before the end")
        if error is None and rx.out_of_step:
            error = RuntimeError("weight collective: the stream could not be followed to its end")
    finally:
        store.set(
            f"ack/{rank}", "ok" if error is None else f"{type(error).__name__}: {error}"[:4000] or "error"
        )
        _shutdown(pg)
        # the error's traceback holds the receiver, and so the link, in a reference cycle: a group
        # left to the garbage collector outlives the sync (its sockets open), and one destroyed at
        # the interpreter's exit aborts the process (gloo's threads)
        link.pg = None
        del pg
    if error is not None:
        raise error


class CollectiveSender(ThreadedSender):
    """The trainer's side (rank 0) for ``expected`` workers, one sync; the interface of
    :class:`~dapo.rollout.vllm_weight_stream.WeightSender` (``address``, ``send``,
    ``send_in_thread``, ``close``, ``error``, ``nbytes``, ``method``)."""

    method = RPC_METHOD
    thread_name = "dapo-weight-collective"

    def __init__(
        self,
        expected: int = 1,
        timeout_s: float = 600.0,
        backend: str = "gloo",
        device: torch.device | None = None,
    ):
        if backend not in BACKENDS:
            raise ValueError(
                f"weight collective: backend must be one of {', '.join(BACKENDS)}, got {backend!r}"
            )
        self.expected, self.timeout_s, self.backend = int(expected), float(timeout_s), backend
        if device is None:
            device = (
                torch.device("cuda", torch.cuda.current_device())
                if backend == "nccl"
                else torch.device("cpu")
            )
        self.device = device
        self.prefix = secrets.token_hex(16)
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))  # loopback only (a store given a host name listens on all)
        listener.listen(self.expected)
        self.port = int(listener.getsockname()[1])
        # the store takes the socket (and closes it when it goes)
        self._master = _store("127.0.0.1", self.port, True, self.timeout_s, listener.detach())
        self._closed = threading.Event()
        self.nbytes = 0
        self.error: BaseException | None = None

    def address(self) -> dict[str, str]:
        """The RPC's arguments (strings: vLLM's HTTP ``collective_rpc`` passes only strings)."""
        return {
            "host": "127.0.0.1",
            "port": str(self.port),
            "prefix": self.prefix,
            "world_size": str(self.expected + 1),
            "backend": self.backend,
            "timeout_s": str(self.timeout_s),
        }

    def _wait_for_workers(self, store: Any) -> None:
        keys = [f"join/{r}" for r in range(1, self.expected + 1)]
        deadline = time.monotonic() + self.timeout_s
        while not store.check(keys):
            if self._closed.is_set():
                raise RuntimeError("weight collective: the RPC ended before every vLLM worker joined")
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"weight collective: no {self.expected} vLLM workers joined in {self.timeout_s} s"
                )
            time.sleep(_POLL_S)

    def _acks(self) -> list[str]:
        return [f"ack/{r}" for r in range(1, self.expected + 1)]

    def _failure(self, store: Any, keys: list[str]) -> str | None:
        """The first worker's error among the acknowledgements ``keys`` already given."""
        for k in keys:
            if store.check([k]) and (answer := store.get(k).decode(errors="replace")) != "ok":
                return (
                    f"vLLM worker {int(k.split('/')[1]) - 1} failed to load the broadcast weights: {answer}"
                )
        return None

    def _check_acks(self, store: Any) -> None:
        keys = self._acks()
        deadline = time.monotonic() + self.timeout_s
        while not store.check(keys):
            # every worker acknowledges before its RPC returns: once it has (close()), a missing
            # acknowledgement is a worker that died, and waiting out the timeout would not bring it
            if self._closed.is_set() and (missing := [k for k in keys if not store.check([k])]):
                ranks = ", ".join(str(int(k.split("/")[1]) - 1) for k in missing)
                raise RuntimeError(
                    f"weight collective: vLLM worker {ranks} never acknowledged the weights "
                    "(the RPC returned without it: did the worker die?)"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"weight collective: the vLLM workers did not acknowledge in {self.timeout_s} s"
                )
            time.sleep(_POLL_S)
        if (failure := self._failure(store, keys)) is not None:
            raise RuntimeError(failure)

    def send(self, weights: Iterable[tuple[str, torch.Tensor | RowBlock]]) -> int:
        """Broadcast ``weights`` to every worker and wait for each to acknowledge; the bytes sent."""
        store = dist.PrefixStore(self.prefix + "/", self._master)
        pg = link = None
        try:
            try:
                self._wait_for_workers(store)
            except BaseException:
                store.set("start", "abort")  # a worker that did join stops waiting
                raise
            store.set("start", "go")
            pg = new_group(store, 0, self.expected + 1, self.backend, self.timeout_s)
            try:
                nbytes = send_stream(link := _Link(pg, self.device), weights)
            except GroupFailed as e:
                # a worker that gave up (not drained, e.g. a header it could not follow) breaks the
                # group; its own error, once acknowledged, says more than the broken group's
                if (failure := self._failure(store, self._acks())) is not None:
                    raise RuntimeError(failure) from e
                raise
            self._check_acks(store)
            self.nbytes = nbytes
            return nbytes
        finally:
            if pg is not None:
                _shutdown(pg)
            if link is not None:  # self.error's traceback holds the link: the group goes now, not with it
                link.pg = None
            del pg, store
            self._master = None  # the workers are done with it (acknowledged, or the sync failed)

    def close(self) -> None:
        """The RPC has returned: a sender still waiting for workers to join gives up at once."""
        self._closed.set()
