"""Built-in scorers and ``default_compute_score``, routed by ``data_source`` as verl does.

| data_source                                                         | scorer                          |
|---------------------------------------------------------------------|---------------------------------|
| ``openai/gsm8k``, ``gsm8k``                                         | gsm8k (strict; ``method=`` kw)  |
| ``lighteval/MATH``, ``DigitalLearningGmbH/MATH-lighteval``,          | math_equiv (symbolic; 1.0/0.0)  |
| ``HuggingFaceH4/MATH-500``, ``numina_*`` (verl's six), ``math_verify``|                                 |
| ``math_dapo``, ``math``, ``math_dapo_reasoning``, ``aime*``          | math_dapo (+1/-1)               |
| ``arithmetic`` (our built-in task)                                  | math_dapo ("Answer: X")         |
| ``countdown``                                                       | countdown                       |

verl routes MATH and numina sources to its ``math_reward`` / ``prime_math`` verifiers; we
route them to one symbolic verifier (same 1.0/0.0 scale). Code, geometry and search
sources need sandboxes or tools we do not ship: they raise :class:`UnknownDataSourceError`
like any unknown source, pointing at ``custom_reward_function.path``.

Nothing here imports torch: worker processes import this module cheaply.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any

from dapo.errors import DapoError
from dapo.reward.scorers import countdown, gsm8k, math_dapo, math_equiv

_MATH_EQUIV_SOURCES = (
    "lighteval/MATH",
    "DigitalLearningGmbH/MATH-lighteval",
    "HuggingFaceH4/MATH-500",
    "math_verify",
    "numina_aops_forum",
    "numina_synthetic_math",
    "numina_amc_aime",
    "numina_synthetic_amc",
    "numina_cn_k12",
    "numina_olympiads",
)
_MATH_DAPO_SOURCES = ("math_dapo", "math", "math_dapo_reasoning", "arithmetic")
_GSM8K_SOURCES = ("openai/gsm8k", "gsm8k")
_COUNTDOWN_SOURCES = ("countdown",)

#: Sources whose scorer only runs bounded regex / tree walks on capped input: they may
#: run in-process under the ``auto`` safety mode. Everything else goes to worker processes.
INLINE_SAFE_SOURCES = frozenset(_MATH_DAPO_SOURCES + _GSM8K_SOURCES + _COUNTDOWN_SOURCES)

KNOWN_SOURCES: tuple[str, ...] = (
    _GSM8K_SOURCES + _MATH_EQUIV_SOURCES + _MATH_DAPO_SOURCES + ("aime*",) + _COUNTDOWN_SOURCES
)


class UnknownDataSourceError(DapoError, NotImplementedError):
    """No built-in scorer for a data_source. A configuration error, never counted as a scorer failure."""


def scorer_for(data_source: str) -> Callable[..., Any]:
    """The scorer function for ``data_source``; raises UnknownDataSourceError."""
    ds = str(data_source)
    if ds in _GSM8K_SOURCES:
        return gsm8k.compute_score
    if ds in _MATH_DAPO_SOURCES or ds.startswith("aime"):
        return math_dapo.compute_score
    if ds in _MATH_EQUIV_SOURCES:
        return math_equiv.compute_score
    if ds in _COUNTDOWN_SOURCES:
        return countdown.compute_score
    raise UnknownDataSourceError(
        f"no built-in reward scorer for data_source {ds!r}. Known data sources: {', '.join(KNOWN_SOURCES)}. "
        "To score other data, set custom_reward_function.path (a .py file) and custom_reward_function.name "
        "(a function taking data_source, solution_str, ground_truth, extra_info)."
    )


# the scorers that compare the ground truth as one string; math_equiv str()s a number first
_STRING_GROUND_TRUTH = {gsm8k.compute_score: "gsm8k", math_dapo.compute_score: "math_dapo"}


def ground_truth_problem(
    data_source: str, ground_truth: Any, *, ground_truth_as_str: bool = False
) -> str | None:
    """Why the built-in scorer for ``data_source`` cannot grade ``ground_truth`` (None: it can),
    with the fix. Such a row would score every answer wrong without an error, so the data is
    refused up front (``dapo.data.check``). ``ground_truth_as_str``: the scorers' keyword
    (``reward_kwargs.ground_truth_as_str``) that compares ``str(ground_truth)``.
    Raises UnknownDataSourceError."""
    fn = scorer_for(data_source)
    gt = ground_truth
    if fn is countdown.compute_score:
        try:
            countdown.parse_ground_truth(gt)
        except (ValueError, TypeError) as exc:
            return (
                f"{exc} (got {type(gt).__name__} {_short(gt)}); "
                'store it as {"target": 24, "numbers": [3, 4, 6, 1]} or that JSON as a string'
            )
        return None
    name = _STRING_GROUND_TRUTH.get(fn, "math_equiv")
    if isinstance(gt, list | tuple | dict):
        return (
            f"is a {type(gt).__name__} {_short(gt)}; the {name} scorer for data_source {data_source!r} "
            "compares the answer with one string, so every response would score wrong: store the "
            'reference answer as a string (e.g. "4", not ["4"]), or score such rows with '
            "custom_reward_function.path"
        )
    if not isinstance(gt, str) and fn in _STRING_GROUND_TRUTH and not ground_truth_as_str:
        return (
            f"is a {type(gt).__name__} ({gt!r}); the {name} scorer needs a string (verl's fails or "
            'scores it wrong): store it as a string (e.g. "4"), or set '
            "custom_reward_function.reward_kwargs.ground_truth_as_str=true"
        )
    return None


def _short(value: Any, width: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def scorer_notes(data_sources: Iterable[str]) -> list[str]:
    """One console line per grading rule of ours that a verl user would not expect, for the
    built-in scorers these data sources route to (said once, before training)."""
    notes = []
    math_sources = sorted({str(ds) for ds in data_sources} & set(_MATH_EQUIV_SOURCES))
    if math_sources:
        notes.append(
            f"note: data_source {', '.join(math_sources)} is graded by dapo's symbolic verifier, which "
            "also accepts a last 'Answer: X' line when a response has no \\boxed{} (verl's math reward "
            "scores that 0); docs/algorithms.md lists the differences"
        )
    return notes


def is_inline_safe(data_source: str) -> bool:
    ds = str(data_source)
    return ds in INLINE_SAFE_SOURCES or ds.startswith("aime")


def _accepted_kwargs(fn: Callable[..., Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in params}


def default_compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    **kwargs: Any,
) -> dict | float:
    """Score one response with the built-in scorer for its data_source.

    Extra keyword arguments reach the scorer when it accepts them (``method`` for gsm8k,
    ``strict_box_verify`` for math_dapo, ...); others are ignored, as in verl. A dict
    result is returned as is, a number as float.
    """
    fn = scorer_for(data_source)
    result = fn(solution_str, ground_truth, **_accepted_kwargs(fn, kwargs))
    if isinstance(result, dict):
        return result
    if isinstance(result, int | float | bool):
        return float(result)
    return float(result[0])


__all__ = [
    "INLINE_SAFE_SOURCES",
    "KNOWN_SOURCES",
    "UnknownDataSourceError",
    "default_compute_score",
    "ground_truth_problem",
    "is_inline_safe",
    "scorer_for",
]
