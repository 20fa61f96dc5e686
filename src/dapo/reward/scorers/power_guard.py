"""Refuse expressions whose powers sympy would take long to evaluate.

sympy evaluates constant powers exactly while it parses: ``10**(999*999*999)`` is an
integer of a billion digits, and ``2**2**2**2**2`` is no better. Checking the first
number after ``**`` is not enough, since the exponent is an expression. This guard walks
the Python code that sympy's parser would run (``stringify_expr``: its tokens after the
transformations, nothing evaluated) and bounds every sub-expression with
interval arithmetic (mpmath's ``iv``, whose intervals always contain the exact value).
It refuses the expression when an exponent may exceed ``max_exponent`` in
magnitude, a power may exceed ``10**max_digits``, or a number literal is beyond
``10**±max_digits`` (sympy's ``Float("1e99999999")`` alone takes minutes). Symbols count
as the interval [-1, 1] (see ``_Bounds``).

The interval of a power is computed only after its exponent passed the bound, so the
guard itself stays cheap: every interval endpoint has a modest binary exponent.
"""

from __future__ import annotations

import ast
import math
from typing import Any

_FUNCTIONS = ("sqrt", "sin", "cos", "tan", "log", "exp")
_MAX_EXP_ARG = 1e4  # exp() of more than this is treated as unbounded (its interval would be huge)


class _Refused(Exception):
    pass


def _iv():
    import mpmath

    return mpmath.iv


def _top(x: Any) -> Any:
    """Upper bound of |x| for an interval, as an mpmath number (inf when unbounded)."""
    import mpmath

    return mpmath.mp.make_mpf(abs(x)._mpi_[1])


def _log10_top(x: Any) -> float:
    import mpmath

    return float(mpmath.mag(_top(x))) * math.log10(2)  # mag: a bound of log2, cheap for any size


class _Bounds:
    """An interval for every node, or None where no finite bound is known.

    A symbol counts as [-1, 1]: sympy distributes a power over a product and pulls a
    number out of a symbolic exponent (``2**(10**9*x)`` computes ``2**(10**9)``), so the
    numbers around a symbol must be bounded as if it were a unit.
    """

    def __init__(self, max_exponent: float, max_digits: float) -> None:
        self.max_exponent = max_exponent
        self.max_digits = max_digits
        self.iv = _iv()
        self.unit = self.iv.mpf([-1, 1])

    def visit(self, node: ast.AST) -> Any:
        iv = self.iv
        if isinstance(node, ast.Expression):
            return self.visit(node.body)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            name = node.func.id
            if (
                name in ("Integer", "Float")
                and len(node.args) == 1
                and isinstance(node.args[0], ast.Constant)
            ):
                value = iv.mpf(str(node.args[0].value))
                if value != 0 and abs(_log10_top(value)) > self.max_digits:
                    raise _Refused("literal")  # 1e99999999: sympy's Float converts it digit by digit
                return value
            if name == "Symbol":
                return self.unit
            if name in _FUNCTIONS and len(node.args) == 1:
                return self._function(name, self.visit(node.args[0]))
            raise _Refused(name)
        if isinstance(node, ast.Name):
            return {"pi": iv.pi, "E": iv.e, "oo": None}.get(node.id, self.unit)  # I and symbols: unit
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            value = self.visit(node.operand)
            return -value if value is not None and isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp):
            left = self.visit(node.left)
            right = self.visit(node.right)
            if isinstance(node.op, ast.Pow):
                return self._power(left, right)
            if left is None or right is None:
                return None
            try:
                if isinstance(node.op, ast.Add):
                    return left + right
                if isinstance(node.op, ast.Sub):
                    return left - right
                if isinstance(node.op, ast.Mult):
                    return left * right
                if isinstance(node.op, ast.Div):
                    return left / right
            except (ZeroDivisionError, ValueError, ArithmeticError):
                return None
        raise _Refused(type(node).__name__)

    def _function(self, name: str, value: Any) -> Any:
        if value is None or (name == "exp" and _top(value) > _MAX_EXP_ARG):
            return None
        try:
            result = getattr(self.iv, name)(value)
        except (ValueError, ZeroDivisionError, ArithmeticError):
            return None
        return result if isinstance(result, type(value)) else None  # a complex interval: unbounded

    def _power(self, base: Any, exponent: Any) -> Any:
        if exponent is None or _top(exponent) > self.max_exponent:
            raise _Refused("exponent")
        if base is None:
            return None
        import mpmath

        # |base ** e| <= max(|base|, 1) ** |e|, or (1 / min|base|) ** |e| for a negative e. A base
        # that may be 0 (a symbol, a cancelling sum) has no reciprocal bound; 0 ** -n is cheap.
        e = _top(exponent)
        size = mpmath.mpf(max(_top(base), 1)) ** e
        low = mpmath.mp.make_mpf(abs(base)._mpi_[0])
        if low > 0:
            size = max(size, (1 / low) ** e)
        if mpmath.mag(size) * math.log10(2) > self.max_digits:
            raise _Refused("power")
        return self.iv.mpf([-size, size])


def constant_powers_bounded(code: str, max_exponent: float, max_digits: float) -> bool:
    """True when every constant exponent in ``code`` (sympy parser output) is within bounds."""
    try:
        tree = ast.parse(code, mode="eval")
        _Bounds(max_exponent, max_digits).visit(tree)
    except (_Refused, SyntaxError, RecursionError, OverflowError, ValueError, TypeError):
        return False
    return True
