"""A Python code interpreter tool (the retool ``code_interpreter`` of verl's DAPO multi-turn example).

The code runs in :func:`dapo.tools.sandbox.run_python`: a fresh interpreter behind an OS
boundary (bubblewrap namespaces, a read-only view of the interpreter, a size-limited tmpfs
work directory, a seccomp filter) with CPU-time, memory, wall-clock and output limits. The
model sees stdout, then stderr (a traceback, a refusal), or a line that names the limit it
hit. ``metrics["error"]`` names what went wrong so the rollout counts it:
``sandbox_refused``, ``sandbox_timeout``, ``sandbox_cpu_limit``, ``sandbox_memory_limit``,
``sandbox_output_limit``, ``sandbox_killed`` or ``code_error``. ``metrics["status_problem"]`` is
there when the program wrote something other than the runner's report to its status pipe (the
verdict is then the parent's alone).

``config`` keys: ``cpu_seconds``, ``memory_mb``, ``wall_seconds``, ``max_output_chars``,
``max_output_bytes``, ``disk_mb``, ``allow_weak_sandbox`` (default false: without a working
bubblewrap the tool refuses to start; true runs the code with only the in-process guard and
the limits, and says so every step) and ``network_namespace`` (auto | always | never; the weak
mode only).
"""

from __future__ import annotations

from typing import Any

from dapo.tools.base import BaseTool, ToolResponse, register_tool
from dapo.tools.sandbox import SandboxLimits, os_boundary_problem, run_python

_LIMIT_TEXT = {
    "timeout": "Error: the code ran past its wall-clock limit of {wall}s and was stopped.",
    "cpu_limit": "Error: the code used more than {cpu}s of CPU time and was stopped.",
    "memory_limit": "Error: the code ran out of memory (limit {mem} MB).",
    "output_limit": "Error: the code printed more than {out} bytes and was stopped.",
    "killed": "Error: the code was killed.",
}


@register_tool("code_interpreter")
class CodeInterpreterTool(BaseTool):
    default_schema = {
        "type": "function",
        "function": {
            "name": "code_interpreter",
            "description": "Run Python code and return what it prints.",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string", "description": "the Python code to run"}},
                "required": ["code"],
            },
        },
    }

    def __init__(self, config: dict[str, Any] | None = None, tool_schema: dict[str, Any] | None = None):
        super().__init__(config, tool_schema)
        c = self.config
        self.limits = SandboxLimits(
            cpu_seconds=int(c.get("cpu_seconds", 5)),
            memory_mb=int(c.get("memory_mb", 512)),
            wall_seconds=float(c.get("wall_seconds", 10.0)),
            max_output_chars=int(c.get("max_output_chars", 4096)),
            max_output_bytes=int(c.get("max_output_bytes", 1 << 20)),
            disk_mb=int(c.get("disk_mb", 16)),
            network_namespace=str(c.get("network_namespace", "auto")),
        )
        allow_weak = c.get("allow_weak_sandbox", False)
        if not isinstance(allow_weak, bool):
            raise ValueError(
                f"code_interpreter: config.allow_weak_sandbox must be true or false, got {allow_weak!r}"
            )
        problem = os_boundary_problem()
        if problem and not allow_weak:
            raise ValueError(
                f"code_interpreter: no OS sandbox for model-written code: {problem}. Install bubblewrap "
                "(`make sandbox` as root), or accept the weak in-process guard with "
                "`allow_weak_sandbox: true` in this tool's config"
            )
        self.weak = problem is not None
        self.weak_reason = problem

    def step_warning(self) -> str | None:
        if not self.weak:
            return None
        return (
            f"warning: {self.name} runs model-written code WITHOUT an OS sandbox (allow_weak_sandbox: true; "
            f"{self.weak_reason}): only the in-process guard and resource limits stand in its way"
        )

    def run(self, state: dict[str, Any], **arguments: Any) -> ToolResponse:
        code = str(next(iter(arguments.values()), ""))
        res = run_python(code, self.limits, weak=self.weak)
        parts = [res.stdout.rstrip("\n")] if res.stdout.strip() else []
        if res.stderr.strip():
            parts.append(res.stderr.rstrip("\n"))
        lim = self.limits
        if res.status in _LIMIT_TEXT:
            parts.append(
                _LIMIT_TEXT[res.status].format(
                    wall=lim.wall_seconds, cpu=lim.cpu_seconds, mem=lim.memory_mb, out=lim.max_output_bytes
                )
            )
        text = "\n".join(parts) if parts else "(no output)"
        metrics: dict[str, Any] = {"status": res.status, "seconds": round(res.seconds, 3)}
        if res.status_problem:  # the program wrote to its status pipe; the verdict above is the parent's
            metrics["status_problem"] = res.status_problem
        if res.refused:
            metrics["error"] = "sandbox_refused"
            metrics["refused"] = list(res.refused)
        elif res.status in _LIMIT_TEXT:
            metrics["error"] = f"sandbox_{res.status}"
        elif res.status == "error":
            metrics["error"] = "code_error"
        return ToolResponse(text, metrics=metrics)
