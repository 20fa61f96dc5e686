"""Tool-call parsers (``multi_turn.format``). ``hermes`` is the Qwen / NousResearch format::

    <tool_call>{"name": "calculator", "arguments": {"expression": "37*48"}}</tool_call>

A parse never raises: a malformed call (bad JSON, no name, arguments not an object, an
unclosed tag) becomes a :class:`ToolCall` with ``error`` set, which the rollout answers with
a tool error message and counts.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_OPEN = "<tool_call>"
MAX_CALL_CHARS = 20_000


@dataclass
class ToolCall:
    name: str | None
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # None for a well-formed call, else the error kind
    message: str = ""  # for a malformed call, what the model is told
    raw: str = ""


@dataclass
class ParsedTurn:
    content: str  # the text with the tool-call blocks removed
    calls: list[ToolCall]


def parse_hermes(text: str) -> ParsedTurn:
    calls: list[ToolCall] = []
    for m in _HERMES.finditer(text):
        calls.append(_parse_call(m.group(1)))
    content = _HERMES.sub("", text)
    tail = content.find(_OPEN)
    if tail >= 0:  # an opened call that never closed (budget ran out, or a formatting slip)
        calls.append(
            ToolCall(
                None,
                error="malformed",
                message="Error: a <tool_call> block was not closed with </tool_call>.",
                raw=content[tail:],
            )
        )
        content = content[:tail]
    return ParsedTurn(content.strip(), calls)


def _parse_call(body: str) -> ToolCall:
    raw = body
    if len(body) > MAX_CALL_CHARS:
        return ToolCall(None, error="malformed", message="Error: the tool call is too long.", raw=raw[:200])
    try:
        obj = json.loads(body.strip())
    except ValueError as exc:
        return ToolCall(
            None, error="malformed", message=f"Error: the tool call is not valid JSON ({exc}).", raw=raw
        )
    if not isinstance(obj, dict):
        return ToolCall(
            None, error="malformed", message="Error: the tool call must be a JSON object.", raw=raw
        )
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return ToolCall(None, error="malformed", message='Error: the tool call has no "name".', raw=raw)
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models put the arguments in as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            return ToolCall(
                name, error="malformed", message="Error: the arguments are not valid JSON.", raw=raw
            )
    if not isinstance(args, dict):
        return ToolCall(name, error="malformed", message='Error: "arguments" must be a JSON object.', raw=raw)
    return ToolCall(name, args, raw=raw)


def format_hermes_call(name: str, arguments: dict[str, Any]) -> str:
    """The text a model writes to call ``name`` (used by warm starts and tests)."""
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


PARSERS = {"hermes": parse_hermes}


def get_parser(fmt: str):
    if fmt not in PARSERS:
        raise ValueError(
            f"actor_rollout_ref.rollout.multi_turn.format={fmt!r} is not supported; choose one of {sorted(PARSERS)}"
        )
    return PARSERS[fmt]
