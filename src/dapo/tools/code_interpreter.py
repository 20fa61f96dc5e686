"""A Python code interpreter tool (the retool ``code_interpreter`` of verl's DAPO multi-turn example).

The code runs in :func:`dapo.tools.sandbox.run_python`: a separate process with CPU-time,
memory and wall-clock limits, an empty temporary working directory, no network, and its
output truncated. The model sees stdout, then stderr (a traceback, a refusal), or a line
that names the limit it hit. ``metrics["error"]`` names what went wrong so the rollout
counts it: ``sandbox_refused``, ``sandbox_timeout``, ``sandbox_cpu_limit``,
``sandbox_memory_limit``, ``sandbox_killed`` or ``code_error``.

``config`` keys: ``cpu_seconds``, ``memory_mb``, ``wall_seconds``, ``max_output_chars``,
``network_namespace`` (auto | always | never).
"""

from __future__ import annotations

from typing import Any

from dapo.tools.base import BaseTool, ToolResponse, register_tool
from dapo.tools.sandbox import SandboxLimits, run_python

_LIMIT_TEXT = {
    "timeout": "Error: the code ran past its wall-clock limit of {wall}s and was stopped.",
    "cpu_limit": "Error: the code used more than {cpu}s of CPU time and was stopped.",
    "memory_limit": "Error: the code ran out of memory (limit {mem} MB).",
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
            network_namespace=str(c.get("network_namespace", "auto")),
        )

    def run(self, state: dict[str, Any], **arguments: Any) -> ToolResponse:
        code = str(next(iter(arguments.values()), ""))
        res = run_python(code, self.limits)
        parts = [res.stdout.rstrip("\n")] if res.stdout.strip() else []
        if res.stderr.strip():
            parts.append(res.stderr.rstrip("\n"))
        lim = self.limits
        if res.status in _LIMIT_TEXT:
            parts.append(
                _LIMIT_TEXT[res.status].format(wall=lim.wall_seconds, cpu=lim.cpu_seconds, mem=lim.memory_mb)
            )
        text = "\n".join(parts) if parts else "(no output)"
        metrics: dict[str, Any] = {"status": res.status, "seconds": round(res.seconds, 3)}
        if res.refused:
            metrics["error"] = "sandbox_refused"
            metrics["refused"] = list(res.refused)
        elif res.status in _LIMIT_TEXT:
            metrics["error"] = f"sandbox_{res.status}"
        elif res.status == "error":
            metrics["error"] = "code_error"
        return ToolResponse(text, metrics=metrics)
