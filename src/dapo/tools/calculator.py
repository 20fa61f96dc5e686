"""A calculator tool: arithmetic expressions evaluated on their syntax tree (no ``eval``).

Allowed: int and float literals, ``+ - * / // % **``, unary ``+ -`` and parentheses.
Anything else (names, calls, attributes, strings, comparisons) is refused. Sizes are bounded:
the expression text, the nesting depth, exponents and the magnitude of every intermediate
result, so no input can make the trainer process spin or exhaust memory.
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Any

from dapo.tools.base import BaseTool, ToolArgumentError, ToolResponse, register_tool

MAX_CHARS = 200
MAX_DEPTH = 32
MAX_EXPONENT = 64
MAX_MAGNITUDE = 10**40

_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class CalculatorError(ValueError):
    pass


def _check(value: int | float) -> int | float:
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("result is not a finite number")
    if abs(value) > MAX_MAGNITUDE:
        raise CalculatorError("result is too large")
    return value


def _eval(node: ast.AST, depth: int) -> int | float:
    if depth > MAX_DEPTH:
        raise CalculatorError("expression is nested too deeply")
    if isinstance(node, ast.Expression):
        return _eval(node.body, depth + 1)
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise CalculatorError(f"only numbers are allowed, got {node.value!r}")
        return _check(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _check(_UNARY[type(node.op)](_eval(node.operand, depth + 1)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left = _eval(node.left, depth + 1)
        right = _eval(node.right, depth + 1)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise CalculatorError(f"exponent {right} is larger than {MAX_EXPONENT}")
        try:
            out = _BINOPS[type(node.op)](left, right)
        except ZeroDivisionError as exc:
            raise CalculatorError("division by zero") from exc
        except OverflowError as exc:
            raise CalculatorError("result is too large") from exc
        if isinstance(out, complex):
            raise CalculatorError("result is not a real number")
        return _check(out)
    raise CalculatorError(f"unsupported syntax: {type(node).__name__}")


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic expression; raises CalculatorError on anything else."""
    text = str(expression).strip().replace("^", "**").replace("×", "*").replace("÷", "/")
    if text.endswith("="):
        text = text[:-1]
    if not text:
        raise CalculatorError("empty expression")
    if len(text) > MAX_CHARS:
        raise CalculatorError(f"expression longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise CalculatorError(f"invalid expression: {exc.msg}") from exc
    return _eval(tree, 0)


def format_number(value: int | float) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if isinstance(value, float):
        return format(value, ".12g")
    return str(value)


@register_tool("calculator")
class CalculatorTool(BaseTool):
    default_schema = {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression (+ - * / // % ** and parentheses).",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "for example 37*48"}},
                "required": ["expression"],
            },
        },
    }

    def run(self, state: dict[str, Any], **arguments: Any) -> ToolResponse:
        if len(arguments) != 1:
            raise ToolArgumentError(f"{self.name} takes exactly one argument")
        (expression,) = arguments.values()
        try:
            value = evaluate(str(expression))
        except CalculatorError as exc:
            return ToolResponse(f"Error: {exc}", metrics={"error": "tool_error"})
        return ToolResponse(format_number(value))
