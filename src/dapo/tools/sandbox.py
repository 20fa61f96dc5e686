"""Run untrusted Python in a separate, limited process.

Each run gets:

* a fresh empty temporary working directory, removed afterwards;
* CPU-time (``RLIMIT_CPU``), address-space (``RLIMIT_AS``) and file-size (``RLIMIT_FSIZE``)
  limits set by the child on itself, and a wall-clock limit enforced by the parent, which
  kills the child's whole process group;
* no network: a new network namespace (``unshare -rn``) where the system allows it, and in
  every case an audit hook that refuses socket creation;
* the same audit hook refuses fork / exec / spawn / signals, native libraries (ctypes) and
  any write, rename, delete or chmod outside the working directory;
* stdout and stderr written to files outside the sandbox, capped, and read back truncated.

Refused operations raise ``PermissionError`` inside the child (the code can carry on) and
are reported in :attr:`SandboxResult.refused`. This is defence in depth for a research
trainer, not a security boundary against a determined attacker: run untrusted models'
code in a container as well.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

RUNNER = Path(__file__).with_name("_sandbox_runner.py")


@dataclass
class SandboxLimits:
    cpu_seconds: int = 5
    memory_mb: int = 512
    wall_seconds: float = 10.0
    max_output_chars: int = 4096
    max_file_bytes: int = 1 << 20
    network_namespace: str = "auto"  # auto | always | never


@dataclass
class SandboxResult:
    status: str  # ok | error | refused | timeout | cpu_limit | memory_limit | killed
    stdout: str
    stderr: str
    returncode: int | None
    refused: list[str] = field(default_factory=list)
    exception: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@lru_cache(maxsize=1)
def network_namespace_available() -> bool:
    exe = shutil.which("unshare")
    if not exe:
        return False
    try:
        done = subprocess.run([exe, "-rn", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def _read_capped(path: Path, limit: int) -> str:
    with open(path, "rb") as f:
        data = f.read(limit * 4 + 4)
    text = data.decode("utf-8", errors="replace")
    if len(text) > limit:
        text = text[:limit] + f"\n...[output truncated at {limit} characters]"
    return text


def run_python(code: str, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run ``code`` under ``limits``; never raises for anything the code does."""
    lim = limits or SandboxLimits()
    t0 = time.monotonic()
    box = tempfile.mkdtemp(prefix="dapo-sandbox-")
    io_dir = tempfile.mkdtemp(prefix="dapo-sandbox-io-")
    out_path, err_path = Path(io_dir) / "stdout", Path(io_dir) / "stderr"
    cmd: list[str] = [
        sys.executable,
        "-I",
        str(RUNNER),
        box,
        str(int(lim.cpu_seconds)),
        str(int(lim.memory_mb) << 20),
        str(int(lim.max_file_bytes)),
    ]
    use_ns = lim.network_namespace == "always" or (
        lim.network_namespace == "auto" and network_namespace_available()
    )
    if use_ns:
        cmd = [shutil.which("unshare") or "unshare", "-rn", *cmd]
    env = {"PATH": "/usr/bin:/bin", "HOME": box, "TMPDIR": box, "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}
    status_r, status_w = os.pipe()
    cmd.append(str(status_w))
    timed_out = False
    try:
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            try:
                proc = subprocess.Popen(
                    cmd,
                    stdin=subprocess.PIPE,
                    stdout=out,
                    stderr=err,
                    cwd=box,
                    env=env,
                    pass_fds=(status_w,),
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError as exc:
                return SandboxResult("error", "", f"could not start the sandbox: {exc}", None)
            finally:
                os.close(status_w)
            try:
                proc.communicate(code.encode(), timeout=lim.wall_seconds)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc)
                proc.wait()
            except BrokenPipeError:
                proc.wait()
        status = _read_status(status_r)
        rc = proc.returncode
        stdout = _read_capped(out_path, lim.max_output_chars)
        stderr = _read_capped(err_path, lim.max_output_chars)
    finally:
        os.close(status_r)
        shutil.rmtree(box, ignore_errors=True)
        shutil.rmtree(io_dir, ignore_errors=True)
    refused = list(status.get("refused") or [])
    exception = status.get("exception")
    if timed_out:
        kind = "timeout"
    elif rc is not None and rc < 0 and -rc in (signal.SIGXCPU, signal.SIGKILL) and not status:
        kind = "cpu_limit"
    elif exception == "MemoryError":
        kind = "memory_limit"
    elif refused:
        kind = "refused"
    elif rc == 0:
        kind = "ok"
    elif rc is not None and rc < 0:
        kind = "killed"
    else:
        kind = "error"
    return SandboxResult(kind, stdout, stderr, rc, refused, exception, time.monotonic() - t0)


def _read_status(fd: int) -> dict:
    chunks = []
    while True:
        try:
            b = os.read(fd, 65536)
        except OSError:
            break
        if not b:
            break
        chunks.append(b)
        if sum(map(len, chunks)) > 1 << 20:
            break
    try:
        data = json.loads(b"".join(chunks).decode() or "{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            proc.kill()
        except ProcessLookupError:
            pass
