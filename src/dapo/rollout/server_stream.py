"""Server-sent events from the vLLM server over one HTTP/1.1 connection per request.

:mod:`dapo.rollout.server_partial` opens one streaming request per sample on
``/inference/v1/generate`` (``"stream": true``): vLLM answers with ``text/event-stream``, one
``data: {json}`` event per batch of new tokens (their ids and sampled-token log-probs) and
``data: [DONE]`` at the end. Plain asyncio streams, like the server placement's other requests
(:func:`dapo.rollout.vllm_server._post_json`): the trainer's process needs no HTTP library, and
cancelling the task that reads a stream closes its connection, which vLLM takes as an abort.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from dapo.rollout.vllm_server import ServerError


async def _chunks(reader: asyncio.StreamReader, chunked: bool) -> AsyncIterator[bytes]:
    """The response body as it arrives (HTTP/1.1 chunked transfer coding, or until EOF), in blocks
    of whatever is buffered: one await per block, not per token, keeps up with the server."""
    buf, i = b"", 0
    while True:
        data = await reader.read(1 << 16)
        if not data:
            if chunked:
                raise asyncio.IncompleteReadError(buf[i:], None)
            return
        if not chunked:
            yield data
            continue
        buf, i = buf[i:] + data, 0
        out = bytearray()
        while (j := buf.find(b"\r\n", i)) >= 0:
            size = int(buf[i:j].split(b";")[0], 16)
            if size == 0:
                if out:
                    yield bytes(out)
                return
            if len(buf) < j + 2 + size + 2:
                break
            out += buf[j + 2 : j + 2 + size]
            i = j + 2 + size + 2
        if out:
            yield bytes(out)


async def sse_events(port: int, path: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    """POST ``body`` to ``path`` on 127.0.0.1 and yield each event's JSON until ``[DONE]``; an
    HTTP error status or an error event raises :class:`ServerError`."""
    data = json.dumps(body).encode()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError as e:
        raise ServerError(f"{path}: the vLLM server on port {port} did not answer ({e})") from e
    try:
        writer.write(
            (
                f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Accept: text/event-stream\r\nContent-Length: {len(data)}\r\nConnection: close\r\n\r\n"
            ).encode()
            + data
        )
        await writer.drain()
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, OSError) as e:
            raise ServerError(f"{path}: the vLLM server closed the connection ({e})") from e
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split()
        status = int(parts[1]) if len(parts) > 1 else 0
        chunked = any(
            h.lower().startswith("transfer-encoding:") and "chunked" in h.lower() for h in lines[1:]
        )
        if status != 200:
            rest = b"".join([c async for c in _chunks(reader, chunked)])
            raise ServerError(f"{path}: HTTP {status}: {rest[:500].decode(errors='replace')}")
        buf = b""
        try:
            async for piece in _chunks(reader, chunked):
                # a read of buffered data does not yield to the loop: without this, one fast stream
                # would starve the others (whose requests are then not even sent) and the caller
                await asyncio.sleep(0)
                buf += piece.replace(b"\r\n", b"\n")
                while b"\n\n" in buf:
                    event, buf = buf.split(b"\n\n", 1)
                    for line in event.split(b"\n"):
                        if not line.startswith(b"data:"):
                            continue
                        payload = line[5:].strip()
                        if payload == b"[DONE]":
                            return
                        msg = json.loads(payload)
                        if "error" in msg:
                            raise ServerError(f"{path}: the vLLM server reported {msg['error']}")
                        yield msg
        except (asyncio.IncompleteReadError, OSError) as e:
            raise ServerError(f"{path}: the vLLM server on port {port} broke off the stream ({e!r})") from e
        raise ServerError(f"{path}: the stream ended without [DONE]")
    finally:
        writer.close()
