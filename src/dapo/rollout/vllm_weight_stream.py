"""The trainer's weights to vLLM workers in other processes, one tensor at a time over a socket.

Used where the in-process loader cannot be handed a Python iterator: the server placement's
workers, and the in-process engine's workers when ``tensor_model_parallel_size`` > 1 (vLLM's
``collective_rpc`` would otherwise pickle every tensor into its shared-memory broadcast queue).
The trainer listens on 127.0.0.1 (:class:`WeightSender`) and asks each worker, through a small
RPC, to connect and pull (:class:`WeightReceiver`, vLLM's ``worker_extension_cls``). Each
worker receives every tensor and vLLM's own loaders keep that worker's tensor-parallel slice,
so no worker ever holds a second model. A tensor is written from the trainer's memory as it is
(no copy, no file); a worker holds at most the tensors of one layer, which vLLM's layer-wise
reload buffers until the layer is complete, and the embedding tables, which are written in place
once the stream has ended (:mod:`dapo.rollout.vllm_reload`).

Frames: a 4-byte big-endian length, a JSON header (``name``, ``dtype``, ``shape``; for a block
of rows of a larger tensor, ``start``, its first row, and ``whole``, the whole tensor's shape;
``end`` on the last frame), then the tensor's raw bytes. A connection first presents a random
token, so no other local process can feed weights in. This module imports only torch, the
standard library and :mod:`dapo.checkpoint.rows`: it is loaded inside vLLM's worker processes.
"""

from __future__ import annotations

import hmac
import json
import math
import secrets
import socket
import struct
import threading
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

import torch

from dapo.checkpoint.rows import RowBlock

_LEN = struct.Struct("!I")
MAX_HEADER = 2**20  # a header is a name and two shapes; more is not one of ours
# the dtypes a checkpoint tensor comes in; a header names one by string, never any torch attribute
_DTYPES = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.float64,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
        *(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)),
    )
}


def _send_frame(conns: list[socket.socket], header: dict[str, Any], payload: memoryview | None) -> None:
    head = json.dumps(header).encode()
    for c in conns:
        c.sendall(_LEN.pack(len(head)) + head)
        if payload is not None and len(payload):
            c.sendall(payload)


def _recv_exact(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("weight stream: the trainer closed the connection mid-tensor")
        got += n


def _recv_frame_header(sock: socket.socket) -> dict[str, Any]:
    raw = bytearray(_LEN.size)
    _recv_exact(sock, memoryview(raw))
    (n,) = _LEN.unpack(raw)
    if n > MAX_HEADER:
        raise ValueError(f"weight stream: a frame header of {n} bytes (at most {MAX_HEADER})")
    head = bytearray(n)
    _recv_exact(sock, memoryview(head))
    return json.loads(head)


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The tensor's bytes as a view of its own memory (a copy only if it is not contiguous or
    not on the CPU)."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous().reshape(-1)
    return memoryview(t.view(torch.uint8).numpy())


def frame_header(name: str, t: torch.Tensor | RowBlock) -> dict[str, Any]:
    """The header of the frame that carries ``t`` (a tensor, or a block of rows of one)."""
    rows = t.rows if isinstance(t, RowBlock) else t
    header = {"name": name, "dtype": str(rows.dtype).removeprefix("torch."), "shape": list(rows.shape)}
    if isinstance(t, RowBlock):
        header.update(start=t.start, whole=list(t.shape))
    return header


class Frame(NamedTuple):
    """A frame header's checked fields."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int | None  # the first row, for a block of rows of a larger tensor
    whole: tuple[int, ...]  # the whole tensor's shape (``shape`` for a whole tensor)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def wrap(self, t: torch.Tensor) -> torch.Tensor | RowBlock:
        """The received tensor as the loader takes it: a :class:`RowBlock` for a block of rows."""
        return t if self.start is None else RowBlock(self.start, t, self.whole)


def read_header(h: Any, max_numel: int | None = None) -> Frame:
    """A frame header's fields, refused (``ValueError``) unless the dtype is a weight's (by name,
    from a fixed list: a header never names a torch attribute), the shapes and first row are
    non-negative integers and the frame holds at most ``max_numel`` elements (the receiver's
    largest tensor: a shape is a claim, checked before anything is allocated)."""
    if not isinstance(h, dict) or not isinstance(h.get("name"), str):
        raise ValueError(f"weight stream: a frame header without a name: {str(h)[:200]}")
    name, dtype = h["name"], _DTYPES.get(h.get("dtype"))  # type: ignore[arg-type]
    if dtype is None:
        raise ValueError(f"weight stream: {name} has dtype {h.get('dtype')!r}, not a weight's")
    shape, start = h.get("shape"), h.get("start")
    whole = h.get("whole") if start is not None else shape
    dims = [*shape, *whole] if isinstance(shape, list) and isinstance(whole, list) else [None]
    if not all(is_count(d) for d in (*dims, 0 if start is None else start)):
        raise ValueError(f"weight stream: {name} has shape {shape} of whole {whole} from row {start}")
    if max_numel is not None and math.prod(shape) > max_numel:
        raise ValueError(
            f"weight stream: {name} has shape {list(shape)}, more elements than the largest tensor "
            f"this worker takes ({max_numel})"
        )
    return Frame(name, dtype, tuple(shape), start, tuple(whole))


def is_count(v: Any) -> bool:
    """Whether a header field is a count: a non-negative int (a JSON ``true`` is not one)."""
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def receive(
    sock: socket.socket, max_numel: int | None = None
) -> Iterator[tuple[str, torch.Tensor | RowBlock]]:
    """The ``(name, tensor)`` frames of one stream (a block of rows as a :class:`RowBlock`),
    each tensor freshly allocated; a frame of more than ``max_numel`` elements is refused."""
    while True:
        h = _recv_frame_header(sock)
        if h.get("end"):
            return
        f = read_header(h, max_numel)
        t = torch.empty(f.shape, dtype=f.dtype)
        if t.numel():
            _recv_exact(sock, memoryview(t.reshape(-1).view(torch.uint8).numpy()))
        yield f.name, f.wrap(t)
        del t


class ThreadedSender:
    """A sender's :meth:`send_in_thread`: the RPC that makes the workers take the weights blocks
    the caller, so the sender runs in a thread and keeps a failure in ``error``."""

    thread_name = "dapo-weight-sync"
    error: BaseException | None = None

    def send(self, weights: Iterable[tuple[str, torch.Tensor | RowBlock]]) -> int:
        raise NotImplementedError

    def send_in_thread(self, weights: Iterable[tuple[str, torch.Tensor | RowBlock]]) -> threading.Thread:
        def run() -> None:
            try:
                self.send(weights)
            except BaseException as e:  # reported by the caller after join()
                self.error = e

        t = threading.Thread(target=run, name=self.thread_name, daemon=True)
        t.start()
        return t


class WeightSender(ThreadedSender):
    """A one-shot listener for ``expected`` worker connections; :meth:`send` streams weights to
    all of them and waits for each to say it loaded them."""

    method = "dapo_receive_weights"  # the worker's RPC that pulls the stream (WeightReceiver)
    thread_name = "dapo-weight-stream"

    def __init__(self, expected: int = 1, timeout_s: float = 600.0):
        self.expected = int(expected)
        self.timeout_s = float(timeout_s)
        self.token = secrets.token_hex(16)
        self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(self.expected)
        self._server.settimeout(self.timeout_s)
        self.port = int(self._server.getsockname()[1])
        self.nbytes = 0
        self.error: BaseException | None = None

    def address(self) -> dict[str, str]:
        """The RPC's arguments (strings: vLLM's HTTP ``collective_rpc`` passes only strings)."""
        return {"host": "127.0.0.1", "port": str(self.port), "token": self.token}

    def _accept(self) -> list[socket.socket]:
        conns = []
        while len(conns) < self.expected:
            c, _ = self._server.accept()
            c.settimeout(self.timeout_s)
            raw = bytearray(len(self.token))
            try:
                _recv_exact(c, memoryview(raw))
            except (ConnectionError, OSError):
                c.close()
                continue
            if not hmac.compare_digest(bytes(raw), self.token.encode()):
                c.close()  # not one of our workers
                continue
            conns.append(c)
        return conns

    def send(self, weights: Iterable[tuple[str, torch.Tensor | RowBlock]]) -> int:
        """Stream ``weights``; the bytes sent to each worker."""
        conns = self._accept()
        try:
            nbytes = 0
            for name, t in weights:
                payload = tensor_bytes(t.rows if isinstance(t, RowBlock) else t)
                _send_frame(conns, frame_header(name, t), payload)
                nbytes += len(payload)
                del t, payload  # not held while the next tensor is fetched
            _send_frame(conns, {"end": True}, None)
            for c in conns:  # each worker answers once its loader has finished
                answer = c.recv(4096).decode(errors="replace")
                if answer != "ok":
                    raise RuntimeError(
                        f"a vLLM worker failed to load the streamed weights: {answer or 'closed'}"
                    )
            self.nbytes = nbytes
            return nbytes
        finally:
            for c in conns:
                c.close()
            self._server.close()

    def close(self) -> None:
        # shutdown wakes a thread blocked in accept() (close alone does not on Linux), so a failed
        # RPC that no worker connected for is reported at once, not after the socket's timeout
        try:
            self._server.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # not listening any more
        self._server.close()


class WeightReceiver:
    """Mixed into vLLM's worker (``worker_extension_cls``): ``dapo_reload_weights`` loads an
    iterator of weights (the in-process engine's call), ``dapo_receive_weights`` connects to the
    trainer, feeds the stream to it and acknowledges; ``dapo_receive_weights_collective`` does the
    same through a process group."""

    def dapo_reload_weights(self, weights_iterator: Iterable[tuple[str, torch.Tensor | RowBlock]]) -> None:
        """vLLM's in-place reload, with the embedding tables written in place
        (:mod:`dapo.rollout.vllm_reload`)."""
        from dapo.rollout.vllm_reload import reload_with_tables_in_place

        reload_with_tables_in_place(self, weights_iterator)

    def dapo_receive_weights(self, host: str, port: str, token: str) -> None:
        with socket.create_connection((host, int(port)), timeout=600) as sock:
            sock.sendall(token.encode())
            try:
                self.dapo_reload_weights(receive(sock, self.dapo_largest_numel()))
            except BaseException as e:
                sock.sendall(f"{type(e).__name__}: {e}"[:4000].encode() or b"error")
                raise
            sock.sendall(b"ok")

    def dapo_receive_weights_collective(
        self, host: str, port: str, prefix: str, world_size: str, backend: str, timeout_s: str = "600"
    ) -> None:
        """Join the trainer's process group as rank (this worker's rank) + 1 and load what it
        broadcasts (:mod:`dapo.rollout.vllm_weight_collective`); nccl receives on the worker's
        device."""
        from dapo.rollout.vllm_weight_collective import receive_into

        rank = int(self.rank) + 1  # type: ignore[attr-defined]  # vLLM's worker
        # unlike the socket's, the group's peers present no token: a shape is only a claim
        device = self.device if backend == "nccl" else torch.device("cpu")  # type: ignore[attr-defined]
        receive_into(
            self.dapo_reload_weights,
            host,
            int(port),
            prefix,
            rank,
            int(world_size),
            backend,
            device,
            float(timeout_s),
            self.dapo_largest_numel(),
        )

    def dapo_largest_numel(self) -> int:
        """The most elements a checkpoint tensor for this worker holds (its largest shard, whole)."""
        from dapo.rollout.vllm_reload import largest_numel

        return largest_numel(self)
