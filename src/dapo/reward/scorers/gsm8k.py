"""GSM8K scorer with verl semantics (docs/verl_compat.md, Rewards).

``strict``: the last ``#### <number>`` in the final 300 characters, with "," and "$"
removed. ``flexible``: the last number-like token of the final 300 characters. No answer
gives the int 0, an exact string match with the ground truth gives ``score`` and any
other answer gives ``format_score``. As in verl, the extracted string is compared with the
ground truth as given, so an int ground truth never matches; ``ground_truth_as_str=True``
compares with ``str(ground_truth)``. Bounded input and linear regexes: safe in-process.
"""

from __future__ import annotations

import re

_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_FLEXIBLE = re.compile(r"(\-?[0-9\.\,]+)")
_TAIL_CHARS = 300


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    if method not in ("strict", "flexible"):
        raise ValueError(f"gsm8k method must be 'strict' or 'flexible', got {method!r}")
    solution_str = solution_str[-_TAIL_CHARS:]
    if method == "strict":
        found = _STRICT.findall(solution_str)
        if not found:
            return None
        return found[-1].replace(",", "").replace("$", "")
    for token in reversed(_FLEXIBLE.findall(solution_str)):
        if token not in ("", "."):
            return token
    return None


def compute_score(
    solution_str: str,
    ground_truth: str,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
    ground_truth_as_str: bool = False,
):
    answer = extract_solution(str(solution_str), method=method)
    if answer is None:
        return 0
    gt = str(ground_truth) if ground_truth_as_str else ground_truth
    return score if answer == gt else format_score
