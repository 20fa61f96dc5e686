"""vLLM as the rollout engine in a server process of its own, on 127.0.0.1.

Same interface as :class:`dapo.rollout.vllm_rollout.VllmRollout`; the trainer's process never
imports vLLM. dapo starts the server (``python -m vllm.entrypoints.launchers.api_server.entry``
with ``vllm serve``'s flags), waits for ``/health``, generates through the token-in/token-out
endpoint ``/inference/v1/generate`` (one HTTP request per prompt, all in flight at once on
asyncio connections, bounded only by the process's open-file limit, so the engine schedules
them all), and stops it at the end. ``rollout.server_devices`` puts the server on CUDA devices
of its own (its ``CUDA_VISIBLE_DEVICES``).

Weights: each sync sends the actor's tensors straight from the trainer's memory (no copy, no
file), over a local socket (:mod:`dapo.rollout.vllm_weight_stream`) or, with
``rollout.weight_transfer=collective``, a torch.distributed broadcast
(:mod:`dapo.rollout.vllm_weight_collective`): the trainer asks every worker through
``/collective_rpc`` (a development endpoint: ``VLLM_SERVER_DEV_MODE=1``) to connect and feed the
stream to ``reload_weights`` (:mod:`dapo.rollout.vllm_weight_transfer`), then drops the prefix
cache (``/reset_prefix_cache``); a reset the server reports as failed stops the run.

Sleep (``free_cache_engine``, the server on the trainer's devices): the colocated
handoff (:mod:`dapo.rollout.handoff`) drives the server as it drives the in-process engine: it
sleeps at level 2 (``/sleep``: weights and KV cache discarded) while the actor computes and
updates, and before generating wakes its weights, takes the new ones, then wakes its KV cache,
so the cache is not allocated while weights arrive (on CPU vLLM pauses and keeps its memory).
On devices of its own (``rollout.server_devices``) it shares nothing and never sleeps.

The server never outlives the trainer: it runs under a small guard process
(``vllm_server_guard.py``) in a session (process group) of its own. The guard holds a
parent-death signal, so the kernel tells it when the trainer dies, even by SIGKILL, and it then
kills the whole group, vLLM's engine and worker processes included;
:meth:`VllmServerRollout.shutdown` (also run at exit) does the same through the guard.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import resource
import signal
import site
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from dapo.checkpoint.rows import RowBlock
from dapo.config.load import ConfigError
from dapo.rollout.vllm_rollout import (
    WEIGHT_RECEIVER,
    WEIGHTS,
    VllmEngineBase,
    VllmSettings,
    WeightSyncError,
    check_prefix_cache_reset,
    engine_env,
    state_dict_for_vllm,
    weight_pairs,
)
from dapo.rollout.vllm_weight_transfer import push_weights

SERVER_MODULE = "vllm.entrypoints.launchers.api_server.entry"
GUARD = Path(__file__).with_name("vllm_server_guard.py")


class ServerError(RuntimeError):
    """The vLLM server did not start or did not answer."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_args(model_path: str, settings: VllmSettings, port: int, seed: int) -> list[str]:
    """``vllm serve`` flags for the settings (the same engine arguments as the in-process engine)."""
    kw = settings.engine_kwargs()
    args = ["--model", model_path, "--host", "127.0.0.1", "--port", str(port), "--seed", str(seed)]
    for key in (
        "dtype",
        "tensor_parallel_size",
        "max_num_seqs",
        "max_num_batched_tokens",
        "load_format",
        "max_model_len",
        "logprobs_mode",
        "gpu_memory_utilization",
    ):
        if key in kw:
            args += ["--" + key.replace("_", "-"), str(kw[key])]
    for flag in ("enforce_eager", "skip_tokenizer_init", "enable_sleep_mode"):
        if kw.get(flag):
            args.append("--" + flag.replace("_", "-"))
    args.append("--enable-prefix-caching" if kw["enable_prefix_caching"] else "--no-enable-prefix-caching")
    if kw.get("enable_chunked_prefill") is False:
        args.append("--no-enable-chunked-prefill")
    args.append("--enable-scale-out")  # the token-in/token-out endpoint
    args += ["--worker-extension-cls", WEIGHT_RECEIVER]
    if settings.tensor_model_parallel_size == 1:
        args += ["--distributed-executor-backend", "uni"]  # the worker in the engine's process
    return args


def server_env(settings: VllmSettings, devices: list[int] | None) -> dict[str, str]:
    """The server's environment: the engine's, the development endpoints, dapo importable (the
    workers load the weight receiver), and its own CUDA devices when ``devices`` is given."""
    env = dict(os.environ, **engine_env(settings), VLLM_SERVER_DEV_MODE="1")
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    src = str(Path(__file__).resolve().parents[2])
    if src not in site.getsitepackages():  # a source checkout: an installed dapo is importable as is
        env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
    if devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible_devices(devices, os.environ.get("CUDA_VISIBLE_DEVICES"))
    return env


def visible_devices(devices: list[int], visible: str | None) -> str:
    """The server's ``CUDA_VISIBLE_DEVICES`` for ``rollout.server_devices``, which count the
    devices the trainer sees, as its ranks' ``cuda:i`` do: with the trainer's own ``visible``
    set, device ``i`` is its ``i``-th entry (an index or a UUID), else device ``i``."""
    if visible is None or not visible.strip():
        return ",".join(str(int(d)) for d in devices)
    mine = [v.strip() for v in visible.split(",") if v.strip()]
    if any(int(d) >= len(mine) for d in devices):
        raise ConfigError(
            [
                f"actor_rollout_ref.rollout.server_devices={list(devices)}: the trainer sees {len(mine)} CUDA "
                f"device(s) (CUDA_VISIBLE_DEVICES={visible}), numbered 0 to {len(mine) - 1}; pick ids among them"
            ]
        )
    return ",".join(mine[int(d)] for d in devices)


def connection_limit() -> int:
    """How many HTTP requests may be open at once: the open-file limit less room for the
    trainer's own files."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(32, soft - 256) if soft != resource.RLIM_INFINITY else 1 << 16


async def _post_json(port: int, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
    data = json.dumps(body).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(
            (
                f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
            ).encode()
            + data
        )
        await writer.drain()
        raw = await reader.read()
    finally:
        writer.close()
    head, _, payload = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1]) if lines and len(lines[0].split()) > 1 else 0
    if any(h.lower().startswith("transfer-encoding:") and "chunked" in h.lower() for h in lines[1:]):
        payload = _dechunk(payload)
    return status, payload


def _dechunk(data: bytes) -> bytes:
    out, i = bytearray(), 0
    while True:
        j = data.index(b"\r\n", i)
        size = int(data[i:j].split(b";")[0], 16)
        if size == 0:
            return bytes(out)
        out += data[j + 2 : j + 2 + size]
        i = j + 2 + size + 2


def parse_choices(response: dict[str, Any]) -> list[tuple[list[int], list[float], bool]]:
    """``(token_ids, sampled-token log-probs, stopped on a stop token)`` per choice, in index order."""
    out = []
    for c in sorted(response["choices"], key=lambda c: c["index"]):
        ids = list(c.get("token_ids") or [])
        content = (c.get("logprobs") or {}).get("content") or []
        out.append((ids, [float(x["logprob"]) for x in content], c.get("finish_reason") == "stop"))
    return out


class VllmServerRollout(VllmEngineBase):
    """A vLLM server process that this object starts, talks to over HTTP and stops."""

    def __init__(
        self,
        model_path: str,
        eos_token_ids: list[int],
        pad_token_id: int,
        settings: VllmSettings,
        seed: int = 0,
        startup_timeout_s: float = 300.0,
        python: str | None = None,
        devices: list[int] | None = None,
    ):
        super().__init__(eos_token_ids, pad_token_id, settings, seed)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = tempfile.NamedTemporaryFile(prefix="dapo-vllm-server-", suffix=".log", delete=False)
        env = server_env(settings, devices)
        self.devices = devices
        self.in_flight = 0  # HTTP requests open now, and the most at once (generation stats)
        self.max_in_flight = 0
        server = [
            python or sys.executable,
            "-m",
            SERVER_MODULE,
            *server_args(model_path, settings, self.port, seed),
        ]
        self.proc = subprocess.Popen(
            [sys.executable, str(GUARD), str(os.getpid()), *server],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its own process group, which the guard kills as a whole
        )
        atexit.register(self.shutdown)
        self._wait_healthy(startup_timeout_s)

    # ------------------------------------------------------------------ process
    def log_tail(self, lines: int = 15) -> str:
        try:
            with open(self._log.name, errors="replace") as f:
                return "".join(deque(f, maxlen=lines))
        except OSError:
            return ""

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_tail()
                self.shutdown()
                raise ServerError(
                    f"the vLLM server exited with code {self.proc.returncode} while starting; its log ends:\n{tail}"
                )
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.5)
        tail = self.log_tail()
        self.shutdown()
        raise ServerError(
            f"the vLLM server did not answer /health within {timeout_s:g} s "
            f"(actor_rollout_ref.rollout.server_startup_timeout_s); its log ends:\n{tail}"
        )

    def shutdown(self) -> None:
        """Kill the server's process group (idempotent)."""
        proc = getattr(self, "proc", None)
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    pass
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            self.proc = None

    @property
    def log_path(self) -> str:
        """The server's stdout and stderr (vLLM's logging at ``VLLM_LOGGING_LEVEL``)."""
        return self._log.name

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    # ------------------------------------------------------------------ HTTP
    def _post(self, path: str, body: dict[str, Any] | None = None, timeout: float = 3600.0) -> Any:
        data = json.dumps(body or {}).encode()
        req = urllib.request.Request(
            self.url + path, data=data, headers={"Content-Type": "application/json"}, method="POST"
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            raise ServerError(f"{path}: HTTP {e.code}: {e.read()[:500].decode(errors='replace')}") from e
        except (urllib.error.URLError, ConnectionError) as e:
            raise ServerError(f"{path}: the vLLM server at {self.url} did not answer ({e})") from e
        return json.loads(raw) if raw else None

    # ------------------------------------------------------------------ engine interface
    def _complete(
        self, prompt_ids: list[list[int]], requests: list[dict[str, Any]]
    ) -> list[list[tuple[list[int], list[float], bool]]]:
        bodies = [{"token_ids": list(p), "sampling_params": r} for p, r in zip(prompt_ids, requests)]
        self._wake()
        responses = asyncio.run(self._generate_all(bodies))
        return [parse_choices(r) for r in responses]

    async def _generate_all(self, bodies: list[dict[str, Any]]) -> list[Any]:
        gate = asyncio.Semaphore(connection_limit())

        async def one(body: dict[str, Any]) -> Any:
            async with gate:
                self.in_flight += 1
                self.max_in_flight = max(self.max_in_flight, self.in_flight)
                try:
                    status, raw = await _post_json(self.port, "/inference/v1/generate", body)
                except (ConnectionError, OSError) as e:
                    raise ServerError(
                        f"/inference/v1/generate: the vLLM server at {self.url} did not answer ({e})"
                    ) from e
                finally:
                    self.in_flight -= 1
            if status != 200:
                raise ServerError(
                    f"/inference/v1/generate: HTTP {status}: {raw[:500].decode(errors='replace')}"
                )
            return json.loads(raw)

        return await asyncio.gather(*(one(b) for b in bodies))

    def abort_all(self) -> int:
        """Abort every request the server runs (vLLM's development endpoint ``/abort_requests``,
        where an empty list means all); how many. The async loop's weight sync needs the server
        idle, and the server is the run's own."""
        return int((self._post("/abort_requests", {"request_ids": []}) or {}).get("aborted", 0))

    def update_weights(self, model: torch.nn.Module) -> None:
        """Stream the actor's tensors to every worker (no copy, no file), then drop the prefix
        cache; any failure, a refused reset included, raises :class:`WeightSyncError`."""
        self.load_weights(state_dict_for_vllm(model))

    def load_weights(
        self, weights: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor | RowBlock]]
    ) -> None:
        """:meth:`update_weights` from a state dict under Hugging Face names (the async loop's
        generation thread sends a snapshot while the update writes the live weights), or from
        ``(name, tensor)`` pairs, consumed once (the worker ranks' stream, where a parameter larger
        than the bucket comes as ``(name, RowBlock)`` pairs, one block of its rows each)."""
        try:
            self.wake_up([WEIGHTS])
            push_weights(
                weight_pairs(weights),
                self.settings,
                lambda method, kw: self._post("/collective_rpc", {"method": method, "kwargs": kw}),
            )
            del weights
            check_prefix_cache_reset(self._post("/reset_prefix_cache"))
        except Exception as e:
            raise WeightSyncError(e) from e

    def _may_sleep(self) -> bool:
        # only on the trainer's devices: on devices of its own it shares nothing
        return bool(self.settings.free_cache_engine) and self.devices is None

    def _engine_sleep(self) -> None:
        self._post("/sleep?level=2")

    def _engine_wake(self, tags: list[str]) -> None:
        self._post("/wake_up?" + "&".join(f"tags={t}" for t in tags))
