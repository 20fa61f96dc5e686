"""Validation metrics as verl names them (docs/verl_compat.md, Metrics).

For each data source, each variable and each prompt group of N samples: ``mean@N``,
``std@N`` and, when N > 1, bootstrap ``best@k`` / ``worst@k`` (and ``maj@k`` when a ``pred``
exists) for k = 2, 4, 8, ... up to N, with 1000 bootstrap samples and seed 42. The "core"
variable is ``acc`` when present, else ``reward``; core metrics at N go under ``val-core/``,
everything else under ``val-aux/``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import numpy as np


def _bootstrap(
    values: list[float], preds: list[Any] | None, k: int, n_boot: int, seed: int
) -> dict[str, tuple]:
    rng = np.random.default_rng(seed)
    arr = np.asarray(values, dtype=float)
    idx = rng.integers(0, len(arr), size=(n_boot, k))
    best = arr[idx].max(axis=1)
    worst = arr[idx].min(axis=1)
    out = {"best": (best.mean(), best.std()), "worst": (worst.mean(), worst.std())}
    if preds is not None:
        maj = np.empty(n_boot)
        for b in range(n_boot):
            chosen = idx[b]
            top = Counter(preds[i] for i in chosen).most_common(1)[0][0]
            maj[b] = arr[[i for i in chosen if preds[i] == top][0]]
        out["maj"] = (maj.mean(), maj.std())
    return out


def process_validation_metrics(
    data_sources: list[str], uids: list[Any], infos: dict[str, list[Any]], n_boot: int = 1000, seed: int = 42
) -> dict[str, float]:
    """Aggregate per-sample values ``infos[var][i]`` into verl's val-core / val-aux metrics."""
    groups: dict[str, dict[Any, list[int]]] = defaultdict(lambda: defaultdict(list))
    for i, (ds, uid) in enumerate(zip(data_sources, uids)):
        groups[ds][uid].append(i)
    numeric = {k: v for k, v in infos.items() if k != "pred" and all(_is_number(x) for x in v)}
    preds = infos.get("pred")
    core_var = "acc" if "acc" in numeric else "reward"
    out: dict[str, float] = {}
    for ds, by_uid in groups.items():
        n_max = max(len(rows) for rows in by_uid.values())
        per_metric: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        for rows in by_uid.values():
            n = len(rows)
            for var, vals in numeric.items():
                v = [float(vals[i]) for i in rows]
                per_metric[var][f"mean@{n}"].append(float(np.mean(v)))
                if n > 1:
                    per_metric[var][f"std@{n}"].append(float(np.std(v)))
                    ks = []
                    k = 2
                    while k < n:
                        ks.append(k)
                        k *= 2
                    ks.append(n)
                    p = [preds[i] for i in rows] if preds is not None else None
                    for k in ks:
                        stats = _bootstrap(v, p, k, n_boot, seed)
                        for name, (mean, std) in stats.items():
                            per_metric[var][f"{name}@{k}/mean"].append(float(mean))
                            per_metric[var][f"{name}@{k}/std"].append(float(std))
        for var, metrics in per_metric.items():
            for metric, vals in metrics.items():
                at_max = metric.split("@")[-1].split("/")[0] == str(n_max)
                core = var == core_var and at_max and metric.split("@")[0] in ("mean", "maj", "best")
                prefix = "val-core" if core else "val-aux"
                out[f"{prefix}/{ds}/{var}/{metric}"] = float(np.mean(vals))
    return out


def _is_number(x: Any) -> bool:
    return isinstance(x, bool | int | float | np.integer | np.floating | np.bool_)


def validation_metrics(batch: Any, extra: dict[str, list]) -> dict[str, float]:
    """A scored validation batch's metrics: verl's per-source groups, ``val/acc`` (mean of the
    scorer's ``acc``) and, for multi-turn batches, turn and tool-call counts."""
    reward = batch.tensors["token_level_scores"].sum(-1).tolist()
    infos = {"reward": reward, **{k: list(v) for k, v in extra.items()}}
    if "num_turns" in batch.non_tensors:
        from dapo.rollout.multiturn import multiturn_metrics

        turns = {k: list(batch[k]) for k in ("num_turns", "tool_call_counts")}
        turn_metrics = multiturn_metrics(turns, prefix="val-aux/")
    else:
        turn_metrics = {}
    out = process_validation_metrics(list(batch["data_source"]), list(batch["uid"]), infos)
    acc = [float(a) for a in extra.get("acc", [])]
    if acc:
        out["val/acc"] = float(np.mean(acc))
    out.update(turn_metrics)
    return out


def final_validation_note(test_freq: int) -> str:
    """What a run with periodic validation off is told once: it still validates after its last step."""
    return (
        f"note: trainer.test_freq={test_freq} turns periodic validation off; validation still runs once "
        "after the last step, so summary.json has a final accuracy (verl would skip it)"
    )
