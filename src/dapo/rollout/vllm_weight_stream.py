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
import secrets
import socket
import struct
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from dapo.checkpoint.rows import RowBlock

_LEN = struct.Struct("!I")
_MAX_HEADER = 2**20  # a header is a name and two shapes; more is not one of ours
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
    if n > _MAX_HEADER:
        raise ValueError(f"weight stream: a frame header of {n} bytes (at most {_MAX_HEADER})")
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


def receive(sock: socket.socket) -> Iterator[tuple[str, torch.Tensor | RowBlock]]:
    """The ``(name, tensor)`` frames of one stream (a block of rows as a :class:`RowBlock`),
    each tensor freshly allocated."""
    while True:
        h = _recv_frame_header(sock)
        if h.get("end"):
            return
        name, dtype, shape = h["name"], _DTYPES.get(h["dtype"]), tuple(h["shape"])
        if dtype is None:
            raise ValueError(f"weight stream: {name} has dtype {h['dtype']!r}, not a weight's")
        whole = tuple(h["whole"]) if "start" in h else shape
        if not all(isinstance(d, int) and d >= 0 for d in (*shape, *whole)):
            raise ValueError(f"weight stream: {name} has shape {list(shape)} of whole {list(whole)}")
        t = torch.empty(shape, dtype=dtype)
        if t.numel():
            _recv_exact(sock, memoryview(t.reshape(-1).view(torch.uint8).numpy()))
        yield name, (RowBlock(int(h["start"]), t, whole) if "start" in h else t)
        del t


class WeightSender:
    """A one-shot listener for ``expected`` worker connections; :meth:`send` streams weights to
    all of them and waits for each to say it loaded them."""

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

    def send_in_thread(self, weights: Iterable[tuple[str, torch.Tensor | RowBlock]]) -> threading.Thread:
        """:meth:`send` in a thread (the RPC that makes the workers connect blocks the caller);
        a failure is kept in ``error``."""

        def run() -> None:
            try:
                self.send(weights)
            except BaseException as e:  # reported by the caller after join()
                self.error = e

        t = threading.Thread(target=run, name="dapo-weight-stream", daemon=True)
        t.start()
        return t

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
    trainer, feeds the stream to it and acknowledges."""

    def dapo_reload_weights(self, weights_iterator: Iterable[tuple[str, torch.Tensor | RowBlock]]) -> None:
        """vLLM's in-place reload, with the embedding tables written in place
        (:mod:`dapo.rollout.vllm_reload`)."""
        from dapo.rollout.vllm_reload import reload_with_tables_in_place

        reload_with_tables_in_place(self, weights_iterator)

    def dapo_receive_weights(self, host: str, port: str, token: str) -> None:
        with socket.create_connection((host, int(port)), timeout=600) as sock:
            sock.sendall(token.encode())
            try:
                self.dapo_reload_weights(receive(sock))
            except BaseException as e:
                sock.sendall(f"{type(e).__name__}: {e}"[:4000].encode() or b"error")
                raise
            sock.sendall(b"ok")
