r"""General math verifier with symbolic equivalence, for MATH-style data sources.

The prediction is the last ``\boxed{...}`` of the response (else the last ``Answer:``
line); a ground truth that contains ``\boxed{}`` is unboxed the same way. Two answers
match when their normalised strings are equal, or when each top-level comma-separated
part (tuples, sets, lists of solutions) is equal as a sympy expression: numerically for
constants (relative tolerance 1e-9), by ``simplify(a - b) == 0`` otherwise.

Scores follow verl's ``math_reward``: 1.0 correct, 0.0 otherwise.

LaTeX is converted by a small translator written here rather than by math-verify (the
library verl's ``math_verify`` scorer calls): on this project's scorer and safety tests
math-verify's parser scored 26 of 35 cases against 35 for this one (it fails ``10\%`` = 10
and a 150-deep bracket, and only its 5-second alarm stops exponent bombs, where the guard
below refuses them before sympy evaluates anything). The translated text is checked against a
whitelist of characters and names before sympy parses it, every constant exponent
expression is bounded before sympy evaluates anything (``power_guard``), and answers
longer than ``MAX_ANSWER_CHARS`` are compared as strings only. Symbolic
simplification can still be slow on hostile input, so this scorer is *not* inline-safe:
the reward pool runs it in a worker process with a wall-clock timeout.
"""

from __future__ import annotations

import re

from dapo.reward.scorers.math_dapo import (
    ANSWER_PATTERN,
    INVALID,
    last_boxed_only_string,
    normalize_final_answer,
    remove_boxed,
)
from dapo.reward.scorers.power_guard import constant_powers_bounded

MAX_ANSWER_CHARS = 300
_TAIL_CHARS = 4000
_MAX_EXPONENT = 1000

_FUNCTIONS = {"sqrt", "pi", "oo", "sin", "cos", "tan", "log", "exp", "I"}
_LATEX_WORDS = {
    "\\pi": " pi ",
    "\\infty": " oo ",
    "\\cdot": "*",
    "\\times": "*",
    "\\div": "/",
    "\\sin": " sin ",
    "\\cos": " cos ",
    "\\tan": " tan ",
    "\\ln": " log ",
    "\\log": " log ",
    "\\exp": " exp ",
}
_STRIP_TOKENS = (
    "\\left",
    "\\right",
    "\\!",
    "\\,",
    "\\;",
    "\\:",
    "\\quad",
    "\\qquad",
    "\\displaystyle",
    "\\%",
    "%",
)


def extract_answer(solution_str: str) -> str:
    tail = solution_str[-_TAIL_CHARS:]
    boxed = last_boxed_only_string(tail)
    if boxed is not None:
        inner = remove_boxed(boxed)
        if inner is not None:
            return inner
    matches = ANSWER_PATTERN.findall(tail)
    return matches[-1] if matches else INVALID


def _unbox_ground_truth(ground_truth: str) -> str:
    if "\\boxed" in ground_truth:
        boxed = last_boxed_only_string(ground_truth)
        if boxed is not None:
            inner = remove_boxed(boxed)
            if inner is not None:
                return inner
    return ground_truth


def normalize(answer: str) -> str:
    s = answer.strip()
    for tok in _STRIP_TOKENS:
        s = s.replace(tok, "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = s.rstrip(".")
    s = normalize_final_answer(s)
    s = re.sub(r"^[a-zA-Z]\s*(?:=|\\in)", "", s)  # "x=3" -> "3"
    return s.strip()


def _match_brace(s: str, open_pos: int) -> int:
    """Index of the brace closing the one at ``open_pos``; -1 if unbalanced."""
    depth = 0
    for pos in range(open_pos, len(s)):
        if s[pos] == "{":
            depth += 1
        elif s[pos] == "}":
            depth -= 1
            if depth == 0:
                return pos
    return -1


def _replace_command(s: str, command: str, n_args: int, build) -> str | None:
    for _ in range(100):
        at = s.find(command + "{")
        if at < 0:
            return s
        args, pos = [], at + len(command)
        for _ in range(n_args):
            if pos >= len(s) or s[pos] != "{":
                return None
            end = _match_brace(s, pos)
            if end < 0:
                return None
            args.append(s[pos + 1 : end])
            pos = end + 1
        s = s[:at] + build(*args) + s[pos:]
    return None


def latex_to_sympy_text(answer: str) -> str | None:
    """A sympy-parsable string for a simple LaTeX expression, or None."""
    s = re.sub(r"\\sqrt\[([^\]]+)\]\{", lambda m: "\\nthroot{" + m.group(1) + "}{", answer)
    s = normalize(s)
    s = _replace_command(s, "\\frac", 2, lambda a, b: f"(({a})/({b}))")
    if s is None:
        return None
    s = _replace_command(s, "\\nthroot", 2, lambda n, x: f"(({x})**(1/({n})))")
    if s is None:
        return None
    s = _replace_command(s, "\\sqrt", 1, lambda x: f"sqrt({x})")
    if s is None:
        return None
    for word, repl in _LATEX_WORDS.items():
        s = s.replace(word, repl)
    if "\\" in s:
        return None
    s = s.replace("{", "(").replace("}", ")").replace("^", "**")
    if not re.fullmatch(r"[0-9a-zA-Z+\-*/(). ]*", s) or not s.strip():
        return None
    if re.search(r"[a-zA-Z]\s*\.", s):  # attribute access
        return None
    for name in re.findall(r"[a-zA-Z]+", s):
        if len(name) > 1 and name not in _FUNCTIONS:
            return None
    return s


def _exponents_bounded(text: str) -> bool:
    for m in re.finditer(r"\*\*\s*\(?\s*([0-9.]+)", text):
        try:
            if abs(float(m.group(1))) > _MAX_EXPONENT:
                return False
        except ValueError:
            return False
    # a power of a power (9**9**9) can explode even with small literals
    return not re.search(r"\*\*[^+\-*/]*\*\*", text)


_MAX_DIGITS = 10_000  # a constant power or literal beyond 10**±this is not evaluated


def _to_sympy(answer: str):
    text = latex_to_sympy_text(answer)
    if text is None or len(text) > MAX_ANSWER_CHARS or not _exponents_bounded(text):
        return None
    import sympy
    from sympy.parsing.sympy_parser import (
        convert_xor,
        implicit_multiplication_application,
        parse_expr,
        standard_transformations,
        stringify_expr,
    )

    names = {
        name: sympy.Symbol(name) for name in set(re.findall(r"\b[a-zA-Z]\b", text)) if name not in ("E", "I")
    }
    names.update({"pi": sympy.pi, "oo": sympy.oo, "I": sympy.I, "E": sympy.E})
    transformations = standard_transformations + (implicit_multiplication_application, convert_xor)
    try:
        code = stringify_expr(text, dict(names), _sympy_globals(), transformations)
        if not constant_powers_bounded(code, _MAX_EXPONENT, _MAX_DIGITS):
            return None
        return parse_expr(text, local_dict=names, transformations=transformations, evaluate=True)
    except Exception:
        return None


def _sympy_globals() -> dict:
    """The names parse_expr resolves by default (``from sympy import *``)."""
    global _GLOBALS
    if _GLOBALS is None:
        _GLOBALS = {}
        exec("from sympy import *", _GLOBALS)  # what parse_expr does without a global_dict
    return _GLOBALS


_GLOBALS: dict | None = None


def _split_top_level(s: str) -> list[str]:
    s = s.strip()
    if len(s) >= 2 and s[0] + s[-1] in ("()", "[]", "{}"):
        s = s[1:-1]
    elif s.startswith("\\{") and s.endswith("\\}"):
        s = s[2:-2]
    parts, depth, start = [], 0, 0
    for pos, ch in enumerate(s):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(s[start:pos])
            start = pos + 1
    parts.append(s[start:])
    return [p.strip() for p in parts]


def _sympy_equal(a: str, b: str) -> bool:
    if normalize(a) == normalize(b):
        return True
    ea, eb = _to_sympy(a), _to_sympy(b)
    if ea is None or eb is None:
        return False
    import sympy

    try:
        if not ea.free_symbols and not eb.free_symbols:
            va, vb = complex(sympy.N(ea, 30)), complex(sympy.N(eb, 30))
            return abs(va - vb) <= 1e-9 * max(1.0, abs(vb))
        return sympy.simplify(ea - eb) == 0
    except Exception:
        return False


def is_equiv(pred: str, gt: str) -> bool:
    if pred == INVALID:
        return False
    if normalize(pred) == normalize(gt):
        return True
    pred_parts, gt_parts = _split_top_level(pred), _split_top_level(gt)
    if len(pred_parts) != len(gt_parts) or len(pred_parts) > 32:
        return False
    if len(gt_parts) > 1 and pred.strip()[:1] != gt.strip()[:1] and pred.strip()[:1] in "([":
        return False  # (1,2) is an open interval / tuple, [1,2] a closed one
    return all(_sympy_equal(p, g) for p, g in zip(pred_parts, gt_parts))


def compute_score(solution_str: str, ground_truth: str, **_: object) -> dict:
    pred = extract_answer(str(solution_str))
    gt = _unbox_ground_truth(str(ground_truth))
    correct = is_equiv(pred, gt)
    return {
        "score": 1.0 if correct else 0.0,
        "acc": bool(correct),
        "pred": normalize(pred) if pred != INVALID else pred,
    }
