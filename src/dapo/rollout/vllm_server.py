"""vLLM as the rollout engine in a server process of its own, on 127.0.0.1.

Same interface as :class:`dapo.rollout.vllm_rollout.VllmRollout`; the trainer's process never
imports vLLM. dapo starts the server (``python -m vllm.entrypoints.launchers.api_server.entry``
with ``vllm serve``'s flags), waits for ``/health``, generates through the token-in/token-out
endpoint ``/inference/v1/generate`` (one HTTP request per prompt, all in flight at once, so the
engine batches them), and stops it at the end.

Weights: each sync writes the actor's tensors as one safetensors file in a private directory
under /dev/shm (memory, not disk), asks every worker to ``reload_weights`` from it
(``/collective_rpc``, a development endpoint: ``VLLM_SERVER_DEV_MODE=1``), drops the prefix
cache (``/reset_prefix_cache``) and deletes the file.

The server never outlives the trainer: it runs under a small guard process
(``vllm_server_guard.py``) in a session (process group) of its own. The guard holds a
parent-death signal, so the kernel tells it when the trainer dies, even by SIGKILL, and it then
kills the whole group, vLLM's engine and worker processes included;
:meth:`VllmServerRollout.shutdown` (also run at exit) does the same through the guard.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from dapo.rollout.vllm_rollout import (
    VllmEngineBase,
    VllmSettings,
    WeightSyncError,
    engine_env,
    state_dict_for_vllm,
)

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
    if settings.tensor_model_parallel_size == 1:
        args += ["--distributed-executor-backend", "uni"]  # the worker in the engine's process
    return args


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
    ):
        super().__init__(eos_token_ids, pad_token_id, settings, seed)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._shm = Path(tempfile.mkdtemp(prefix="dapo-vllm-weights-", dir=_shm_root()))
        self._log = tempfile.NamedTemporaryFile(prefix="dapo-vllm-server-", suffix=".log", delete=False)
        env = dict(os.environ, **engine_env(settings), VLLM_SERVER_DEV_MODE="1")
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        server = [
            python or sys.executable,
            "-m",
            SERVER_MODULE,
            *server_args(model_path, settings, self.port, seed),
        ]
        self.proc = subprocess.Popen(
            [sys.executable, str(GUARD), str(os.getpid()), str(self._shm), *server],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its own process group, which the guard kills as a whole
        )
        atexit.register(self.shutdown)
        self._pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="dapo-vllm-http")
        self._wait_healthy(startup_timeout_s)

    # ------------------------------------------------------------------ process
    def _log_tail(self, lines: int = 15) -> str:
        try:
            with open(self._log.name, errors="replace") as f:
                return "".join(deque(f, maxlen=lines))
        except OSError:
            return ""

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self._log_tail()
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
        tail = self._log_tail()
        self.shutdown()
        raise ServerError(
            f"the vLLM server did not answer /health within {timeout_s:g} s "
            f"(actor_rollout_ref.rollout.server_startup_timeout_s); its log ends:\n{tail}"
        )

    def shutdown(self) -> None:
        """Kill the server's process group (idempotent) and remove the weights directory."""
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
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown(wait=False)
            self._pool = None
        shutil.rmtree(getattr(self, "_shm", ""), ignore_errors=True)

    @property
    def weights_dir(self) -> str:
        return str(self._shm)

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
        responses = list(self._pool.map(lambda b: self._post("/inference/v1/generate", b), bodies))
        return [parse_choices(r) for r in responses]

    def update_weights(self, model: torch.nn.Module) -> None:
        from safetensors.torch import save_file

        weights = {k: v.contiguous().clone() for k, v in state_dict_for_vllm(model).items()}
        path = self._shm / "model.safetensors"
        try:
            save_file(weights, str(path))
            self._post(
                "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(self._shm)}}
            )
            self._post("/reset_prefix_cache")
        except Exception as e:
            raise WeightSyncError(e) from e
        finally:
            path.unlink(missing_ok=True)


def _shm_root() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
