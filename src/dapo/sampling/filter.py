"""The group filter: metric extraction and the keep rules. Pure functions on a Batch."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dapo.batch import Batch
from dapo.config.sampling import KEY

# outcome labels of one group
KEPT = "kept"
ALL_CORRECT = "all_correct"  # filtered: no spread, value > 0 (acc true, score +1, ...)
ALL_WRONG = "all_wrong"  # filtered: no spread, value <= 0
OUT_OF_BAND = "out_of_band"  # filtered: has spread but mean outside the band


def metric_values(batch: Batch, metric: str) -> np.ndarray:
    """Per-trajectory values of ``metric`` (object array, raw values).

    ``seq_reward`` / ``seq_final_reward`` are the per-trajectory sums of ``token_level_scores`` /
    ``token_level_rewards`` (computed if the batch does not carry them already); any other name
    must be a non-tensor column (reward extra info such as ``acc``, ``score``).
    """
    if metric in batch.non_tensors:
        return batch.non_tensors[metric]
    source = {"seq_reward": "token_level_scores", "seq_final_reward": "token_level_rewards"}.get(metric)
    if source is not None:
        if source not in batch.tensors:
            raise KeyError(
                f"{KEY}.metric={metric} needs the tensor {source!r}, which the generated batch lacks"
            )
        sums = batch.tensors[source].sum(dim=-1).tolist()
        out = np.empty(len(sums), dtype=object)
        out[:] = sums
        return out
    available = sorted(batch.non_tensors)
    raise KeyError(
        f"{KEY}.metric={metric!r}: no such per-trajectory value in the scored batch. "
        f"Use acc, score, seq_reward, seq_final_reward or a reward extra key; available columns: {available}"
    )


def verl_keep(values: np.ndarray) -> bool:
    """The recipe's rule: keep iff one trajectory or population std > 0 (float rounding included)."""
    if len(values) == 1:
        return True
    try:
        arr = np.asarray(values.tolist(), dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{KEY}.metric must be numeric for strategy verl (np.std), got {values[:3]!r}") from e
    return bool(np.std(arr) > 0)


def has_spread(values: np.ndarray) -> bool:
    """True iff the raw values are not all equal (exact equality; one trajectory counts as spread)."""
    if len(values) <= 1:
        return True
    first = values[0]
    return any(not _equal(v, first) for v in values[1:])


def _equal(a: object, b: object) -> bool:
    try:
        return bool(a == b)
    except (TypeError, ValueError):
        return a is b


def group_mean(values: np.ndarray) -> float:
    try:
        return float(np.mean(np.asarray(values.tolist(), dtype=np.float64)))
    except (TypeError, ValueError):
        return float("nan")


@dataclass
class GroupOutcome:
    uid: object
    rows: np.ndarray  # row indices in the round's batch
    label: str  # KEPT / ALL_CORRECT / ALL_WRONG / OUT_OF_BAND
    mean: float
    acc_spread: bool | None  # spread of "acc" when present (to detect shaped-metric slip-through)

    @property
    def kept(self) -> bool:
        return self.label == KEPT


def _zero_spread_label(mean: float) -> str:
    return ALL_CORRECT if mean > 0 else ALL_WRONG


def classify(
    batch: Batch,
    metric: str,
    *,
    rule: str = "zero_spread",
    band: tuple[float, float] | None = None,
    verl: bool = False,
) -> list[GroupOutcome]:
    """One outcome per group (``uid``), in first-appearance order."""
    values = metric_values(batch, metric)
    acc = batch.non_tensors.get("acc") if metric != "acc" else None
    out = []
    for uid, rows in batch.group_slices("uid"):
        vals = values[rows]
        mean = group_mean(vals)
        keep = verl_keep(vals) if verl else has_spread(vals)
        if not keep:
            label = _zero_spread_label(mean)
        elif not verl and rule == "band" and band is not None and len(rows) > 1:
            label = KEPT if band[0] <= mean <= band[1] else OUT_OF_BAND
        else:
            label = KEPT
        acc_spread = has_spread(acc[rows]) if acc is not None else None
        out.append(GroupOutcome(uid, rows, label, mean, acc_spread))
    return out
