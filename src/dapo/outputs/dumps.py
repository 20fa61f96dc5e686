"""Rollout and validation dumps: ``<dir>/<step>.jsonl``, verl's format (docs/verl_compat.md, Dumps).

One JSON object per trajectory with ``input``, ``output``, ``gts``, ``score``, ``step`` and every
reward-extra key whose list has one value per row (extra keys overwrite base keys of the same
name, as in verl). Unlike verl (docs/verl_compat.md, quirk Q3) the caller passes the extras of the batch that was
trained, so rows stay aligned; a key with the wrong length is left out and reported.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dapo.atomic import replacing

# what a failed dump means for the run: it stops there, and its checkpoints are untouched
_DUMP_THEN = "The run stopped there; run the same command again to resume from its last checkpoint"


def _plain(v: Any) -> Any:
    if isinstance(v, np.generic):
        v = v.item()
    elif hasattr(v, "item") and getattr(v, "ndim", None) == 0:
        v = v.item()
    elif isinstance(v, np.ndarray):
        return [_plain(x) for x in v.tolist()]
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return v


def dump_generations(
    dump_dir: str | os.PathLike,
    step: int,
    inputs: Sequence[str],
    outputs: Sequence[str],
    gts: Sequence[Any],
    scores: Sequence[float],
    reward_extra_infos: Mapping[str, Sequence[Any]] | None = None,
    fields: Mapping[str, Any] | None = None,
) -> tuple[Path, list[str]]:
    """Write ``<dump_dir>/<step>.jsonl`` (overwriting it, as verl does). ``fields``: keys and
    values added to every row (``{"trained": False}`` for the groups of a step that trained nothing).

    Returns the file and the extra keys left out because their length differs from the batch.
    """
    n = len(inputs)
    for name, col in (("outputs", outputs), ("gts", gts), ("scores", scores)):
        if len(col) != n:
            raise ValueError(f"dump_generations: {name} has {len(col)} rows, inputs has {n}")
    extras = dict(reward_extra_infos or {})
    kept = {k: list(v) for k, v in extras.items() if _len(v) == n}
    dropped = sorted(k for k in extras if k not in kept)
    d = Path(dump_dir)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{int(step)}.jsonl"
    with replacing(path, then=_DUMP_THEN) as f:
        for i in range(n):
            row: dict[str, Any] = {
                "input": inputs[i],
                "output": outputs[i],
                "gts": _plain(gts[i]),
                "score": _plain(scores[i]),
                "step": int(step),
            }
            for k, v in kept.items():
                row[k] = _plain(v[i])
            row.update(fields or {})
            f.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
    return path, dropped


def _len(v: Any) -> int | None:
    try:
        return len(v)
    except TypeError:
        return None


def dump_batch(
    dump_dir: str | os.PathLike,
    step: int,
    batch: Any,
    tokenizer: Any,
    reward_extra_keys: Sequence[str] | None = None,
    score_key: str = "token_level_scores",
    fields: Mapping[str, Any] | None = None,
) -> tuple[Path, list[str]]:
    """:func:`dump_generations` from a :class:`dapo.batch.Batch` (the trained batch, or validation's).

    ``input``/``output`` are the decoded ``prompts``/``responses`` (special tokens skipped, so
    padding disappears), ``gts`` is ``reward_model["ground_truth"]``, ``score`` the sum of
    ``score_key`` over the response. Extras are read from the batch's own non-tensor columns, so
    they are aligned with it row by row whatever filtering, trimming or carry-over happened.
    """
    prompts = batch.tensors["prompts"]
    responses = batch.tensors["responses"]
    inputs = tokenizer.batch_decode(prompts.tolist(), skip_special_tokens=True)
    outputs = tokenizer.batch_decode(responses.tolist(), skip_special_tokens=True)
    rm = batch.non_tensors.get("reward_model")
    gts = (
        [(r.get("ground_truth") if isinstance(r, Mapping) else None) for r in rm]
        if rm is not None
        else [None] * len(inputs)
    )
    scores = batch.tensors[score_key].sum(-1).tolist()
    keys = reward_extra_keys if reward_extra_keys is not None else ()
    extras = {k: list(batch.non_tensors[k]) for k in keys if k in batch.non_tensors}
    return dump_generations(dump_dir, step, inputs, outputs, gts, scores, extras, fields)


def turn_keys(batch: Any) -> list[str]:
    """Multi-turn columns that dumps show: every turn's messages, turn and tool-call counts."""
    return [k for k in ("messages", "num_turns", "tool_call_counts") if k in batch.non_tensors]
