"""Countdown scorer: reach a target with each given number used exactly once.

The response's last ``<answer>...</answer>`` holds an arithmetic expression over the
given numbers with ``+ - * /`` and parentheses. The ground truth is a mapping (or its
JSON text) with ``target`` and ``numbers``.

Scores (the usual Countdown shaping): 1.0 when the expression uses every number once and
evaluates to the target, ``format_score`` (0.1) for a well-formed answer that is wrong,
0.0 for no answer. ``acc`` is True only for the full score.

The expression is evaluated by walking its syntax tree (never ``eval``), only the four
operators are allowed and only the given numbers may appear, so evaluation is bounded;
the response tail and the expression length are capped as well. Safe in-process.
"""

from __future__ import annotations

import ast
import json
import re
from collections import Counter
from fractions import Fraction
from typing import Any

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ALLOWED_CHARS = re.compile(r"^[0-9+\-*/()., \t]+$")
_TAIL_CHARS = 2000
_MAX_EXPR_CHARS = 200
_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b}


def parse_ground_truth(ground_truth: Any) -> tuple[Fraction, list[Fraction]]:
    gt = ground_truth
    if isinstance(gt, str):
        gt = json.loads(gt)
    if not isinstance(gt, dict) or "target" not in gt or "numbers" not in gt:
        raise ValueError("countdown ground_truth must be a mapping with 'target' and 'numbers'")
    numbers = [Fraction(str(n)) for n in list(gt["numbers"])]
    return Fraction(str(gt["target"])), numbers


def extract_expression(solution_str: str) -> str | None:
    found = _ANSWER.findall(solution_str[-_TAIL_CHARS:])
    if not found:
        return None
    expr = found[-1].strip()
    if "=" in expr:  # "25 + 3 = 28": keep the left side
        expr = expr.split("=")[0].strip()
    return expr


def _evaluate(node: ast.AST, used: list[Fraction]) -> Fraction:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, used)
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    ):
        value = Fraction(str(node.value))
        used.append(value)
        return value
    if isinstance(node, ast.BinOp):
        left = _evaluate(node.left, used)
        right = _evaluate(node.right, used)
        if isinstance(node.op, ast.Div):
            if right == 0:
                raise ZeroDivisionError("division by zero in the answer")
            return left / right
        op = _OPS.get(type(node.op))
        if op is None:
            raise ValueError("operator not allowed")
        return op(left, right)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _evaluate(node.operand, used)
        return -value if isinstance(node.op, ast.USub) else value
    raise ValueError("expression element not allowed")


def evaluate_expression(expr: str) -> tuple[Fraction, list[Fraction]] | None:
    """(value, numbers used) of a +-*/ expression, or None if it is not one."""
    if not expr or len(expr) > _MAX_EXPR_CHARS or not _ALLOWED_CHARS.match(expr) or "**" in expr:
        return None
    try:
        tree = ast.parse(expr, mode="eval")
        used: list[Fraction] = []
        return _evaluate(tree, used), used
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError, MemoryError, OverflowError):
        return None


def compute_score(
    solution_str: str, ground_truth: Any, format_score: float = 0.1, score: float = 1.0
) -> dict:
    target, numbers = parse_ground_truth(ground_truth)
    expr = extract_expression(str(solution_str))
    if expr is None:
        return {"score": 0.0, "acc": False, "pred": "[INVALID]"}
    evaluated = evaluate_expression(expr)
    if evaluated is None:
        return {"score": float(format_score), "acc": False, "pred": expr}
    value, used = evaluated
    correct = Counter(used) == Counter(numbers) and value == target
    return {"score": float(score) if correct else float(format_score), "acc": bool(correct), "pred": expr}
