r"""DAPO math scorer with verl 0.9.1 semantics.

Grading looks at the tail of the response only (300 characters). The default path
("Minerva") takes the text after the last ``Answer:`` marker, normalises it and the
ground truth with :func:`normalize_final_answer`, and compares the two strings exactly.
When no marker exists, the 0.9.1 fallback grades the last ``\boxed{...}`` in the final
100 characters against the raw ground truth. Correct gives +1.0, anything else -1.0.

verl's quirks are kept by default, so that scores compare with verl's:

* ``strict_box_verify=True`` without a closed ``\boxed{}``: ``pred`` is None.
* A ground truth that is not a string (an int from a JSON dataset): the strict-box path
  compares the string with it and scores -1; the default path raises a TypeError
  (verl fails on ``int.split``). ``ground_truth_as_str=True`` compares ``str(ground_truth)``.
* ``pause_tokens_index[-1] < 100`` slices from a negative start, so only the last
  ``100 - index`` characters are searched. ``clamp_pause_window=True`` starts at 0 instead.

Every step works on bounded-length strings with linear regexes, so this scorer is cheap
and cannot hang; it is on the list of scorers that may run in-process (see
``dapo.reward.scorers.INLINE_SAFE_SOURCES``).
"""

from __future__ import annotations

import re
from typing import Any

INVALID = "[INVALID]"
ANSWER_PATTERN = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")

# Literal replacements, applied in this order.
_REPLACEMENTS: tuple[tuple[str, str], ...] = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)

# Units and filler words deleted outright, in this order.
_DELETIONS: tuple[str, ...] = (
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "hours",
    "km",
    "units",
    "\\ldots",
    "sue",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "meals",
    "edges",
    "students",
    "childrentickets",
    "multiples",
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    "\\mathrm{th}",
    "^\\circ",
    "^{\\circ}",
    "\\;",
    ",\\!",
    "{,}",
    '"',
    "\\dots",
)

_FIRST_DOLLAR_SPAN = re.compile(r"(.*?)(\$)(.*?)(\$)(.*)")
_TEXT = re.compile(r"(\\text\{)(.*?)(\})")
_TEXTBF = re.compile(r"(\\textbf\{)(.*?)(\})")
_OVERLINE = re.compile(r"(\\overline\{)(.*?)(\})")
_BOXED_GREEDY = re.compile(r"(\\boxed\{)(.*)(\})")
_FRAC_SHORT = re.compile(r"(frac)([^{])(.)")
_SQRT_SHORT = re.compile(r"(sqrt)([^{])")


def normalize_final_answer(final_answer: str) -> str:
    """Canonical string form of a final answer (Minerva-style normalisation)."""
    final_answer = final_answer.split("=")[-1]
    for old, new in _REPLACEMENTS:
        final_answer = final_answer.replace(old, new)
    for junk in _DELETIONS:
        final_answer = final_answer.replace(junk, "")

    final_answer = _FIRST_DOLLAR_SPAN.sub(r"$\3$", final_answer)
    final_answer = _TEXT.sub(r"\2", final_answer)
    final_answer = _TEXTBF.sub(r"\2", final_answer)
    final_answer = _OVERLINE.sub(r"\2", final_answer)
    final_answer = _BOXED_GREEDY.sub(r"\2", final_answer)

    final_answer = _FRAC_SHORT.sub(r"frac{\2}{\3}", final_answer)
    final_answer = _SQRT_SHORT.sub(r"sqrt{\2}", final_answer)
    final_answer = final_answer.replace("$", "")

    if final_answer.replace(",", "").isdigit():
        final_answer = final_answer.replace(",", "")
    return final_answer.strip()


def last_boxed_only_string(text: str) -> str | None:
    r"""The last ``\boxed{...}`` in ``text`` with its braces matched, or None if absent/unclosed."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth = 0
    for pos in range(start, len(text)):
        ch = text[pos]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start : pos + 1]
    return None


def remove_boxed(boxed: str) -> str | None:
    prefix = "\\boxed{"
    if boxed.startswith(prefix) and boxed.endswith("}"):
        return boxed[len(prefix) : -1]
    return None


def is_correct_minerva(solution_str: str, gt: str) -> tuple[bool, str]:
    matches = ANSWER_PATTERN.findall(solution_str)
    extracted = matches[-1] if matches else INVALID
    pred = normalize_final_answer(extracted)
    return pred == normalize_final_answer(gt), pred


def pause_window_start(pause_index: int, clamp: bool = False) -> int:
    """Where the strict-box search starts: 100 characters before the last pause token.

    verl slices ``pred[index - 100:]``; for an index below 100 that start is negative and
    counts from the end. ``clamp`` starts at 0 instead (the window the index names).
    """
    start = pause_index - 100
    return max(start, 0) if clamp else start


def is_correct_strict_box(
    solution_str: str,
    gt: Any,
    pause_tokens_index: list[int] | None = None,
    clamp_pause_window: bool = False,
) -> tuple[int, str | None]:
    """+1 / -1 by exact equality of the last boxed expression with the raw ground truth."""
    if pause_tokens_index is not None:
        if len(pause_tokens_index) != 4:
            raise ValueError(f"pause_tokens_index must hold 4 indices, got {len(pause_tokens_index)}")
        tail = solution_str[pause_window_start(pause_tokens_index[-1], clamp_pause_window) :]
    else:
        tail = solution_str[-100:]
    boxed = last_boxed_only_string(tail)
    extracted = remove_boxed(boxed) if boxed is not None else None
    return (1 if extracted == gt else -1), extracted


def verify(
    solution_str: str,
    gt: Any,
    strict_box_verify: bool = False,
    pause_tokens_index: list[int] | None = None,
    clamp_pause_window: bool = False,
) -> tuple[bool, str | None]:
    if strict_box_verify:
        correct, pred = is_correct_strict_box(solution_str, gt, pause_tokens_index, clamp_pause_window)
        return correct == 1, pred
    if not isinstance(gt, str):
        raise TypeError(
            f"math_dapo: ground_truth must be a string, got {type(gt).__name__} {gt!r} (verl fails here too); "
            "store it as a string in the dataset or set reward_kwargs.ground_truth_as_str=true"
        )
    correct, pred = is_correct_minerva(solution_str, gt)
    if pred == INVALID:
        # verl 0.9.1: without an "Answer:" marker, fall back to the last boxed expression.
        box_correct, box_pred = is_correct_strict_box(
            solution_str, gt, pause_tokens_index, clamp_pause_window
        )
        if box_pred is not None:
            return box_correct == 1, box_pred
    return correct, pred


def compute_score(
    solution_str: str,
    ground_truth: Any,
    strict_box_verify: bool = False,
    pause_tokens_index: list[int] | None = None,
    ground_truth_as_str: bool = False,
    clamp_pause_window: bool = False,
) -> dict:
    """{"score": +1.0 / -1.0, "acc": bool, "pred": prediction (None: strict mode found no box)}.

    ``ground_truth_as_str`` and ``clamp_pause_window`` fix two verl quirks (module docstring);
    both default to verl's behaviour.
    """
    solution_str = str(solution_str)[-300:]
    gt = str(ground_truth) if ground_truth_as_str else ground_truth
    correct, pred = verify(solution_str, gt, strict_box_verify, pause_tokens_index, clamp_pause_window)
    return {"score": 1.0 if correct else -1.0, "acc": bool(correct), "pred": pred}
