"""One training step's sampling counts (:class:`StepStats`), the per-group records the viewer's
``groups.jsonl`` is built from, and the step's ``dynamic_sampling/*`` metrics."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from dapo.batch import Batch
from dapo.outputs.records import FATES
from dapo.sampling.batch_state import plain
from dapo.sampling.filter import ALL_CORRECT, ALL_WRONG, KEPT, OUT_OF_BAND, GroupOutcome

P = "dynamic_sampling/"


@dataclass
class StepStats:
    gen_version: int  # the policy version of the weights generating this step's groups
    rounds: int = 0
    generated_groups: int = 0
    generated_tokens: float = 0.0
    kept: int = 0
    all_correct: int = 0
    all_wrong: int = 0
    out_of_band: int = 0
    skipped_prompts: int = 0
    surplus_dropped: int = 0
    stale_dropped: int = 0
    recheck_dropped: int = 0
    carried_in: int = 0
    shaped_slip: int = 0
    aborted_groups: int = 0  # strategy stream: groups still in flight when the batch was full
    aborted_tokens: float = 0.0  # strategy stream: the response tokens those groups had generated
    refills: int = 0  # strategy stream: times prompts were submitted
    drained_groups: int = 0  # strategy stream: groups finished after the batch was full
    round_sizes: list[int] = field(default_factory=list)
    groups: list[dict[str, Any]] = field(default_factory=list)

    def filtered(self) -> int:
        return self.all_correct + self.all_wrong + self.out_of_band

    def count(self, outcomes: list[GroupOutcome]) -> None:
        """Add the outcomes to the kept and filtered counts; a kept group whose ``acc`` values are
        all equal slipped through on a shaped metric."""
        for o in outcomes:
            if o.label == ALL_CORRECT:
                self.all_correct += 1
            elif o.label == ALL_WRONG:
                self.all_wrong += 1
            elif o.label == OUT_OF_BAND:
                self.out_of_band += 1
            else:
                self.kept += 1
                if o.acc_spread is False:
                    self.shaped_slip += 1

    def record(self, b: Batch, outcomes: list[GroupOutcome] | None) -> None:
        """Per-group outcome of this round (``outcomes=None``: filtering disabled, all kept).

        ``mean``: fraction of the group's responses that are correct (``acc``, else ``score > 0``;
        None when the batch has neither); ``metric_mean``: mean of the filter metric;
        ``response_lengths``: generated tokens per response.
        """
        if outcomes is None:
            outcomes = [
                GroupOutcome(uid, rows, KEPT, float("nan"), None) for uid, rows in b.group_slices("uid")
            ]
        lengths = (
            b.tensors["response_mask"].sum(-1).to(torch.int64).tolist()
            if "response_mask" in b.tensors
            else None
        )
        correct = correct_values(b)
        index = b.non_tensors.get("index")
        for o in outcomes:
            rows = o.rows.tolist()
            idx = None if index is None else plain(index[rows[0]])
            self.groups.append(
                {
                    "round": self.rounds,
                    "fate": FATES.get(o.label, o.label),
                    "n": len(rows),
                    "mean": None if correct is None else float(np.mean([correct[i] for i in rows])),
                    "metric_mean": o.mean if math.isfinite(o.mean) else None,
                    "index": idx if isinstance(idx, int | str) else None,
                    "response_lengths": None if lengths is None else [lengths[i] for i in rows],
                }
            )


def correct_values(b: Batch) -> list[float] | None:
    """Per trajectory, 1.0 if correct (``acc``, else ``score > 0``); None when neither is usable."""
    for col, fn in (
        ("acc", lambda v: float(bool(v) if isinstance(v, bool | np.bool_) else float(v))),
        ("score", lambda v: float(float(v) > 0)),
    ):
        if col in b.non_tensors:
            try:
                return [fn(v) for v in b.non_tensors[col].tolist()]
            except (TypeError, ValueError):
                continue
    return None


def generated_acc(groups: list[dict[str, Any]]) -> float | None:
    """Correct responses / all responses over the recorded groups (None when none is graded)."""
    graded = [(g["mean"], g["n"]) for g in groups if g["mean"] is not None]
    total = sum(n for _, n in graded)
    return float(sum(m * n for m, n in graded) / total) if total else None


def finished_length_mean(groups: list[dict[str, Any]]) -> float:
    """Mean response length over the recorded groups (every group finished this step, kept or
    filtered); 0.0 when none has lengths."""
    lengths = [x for g in groups if g.get("response_lengths") is not None for x in g["response_lengths"]]
    return float(np.mean(lengths)) if lengths else 0.0


def _mean_length(b: Batch | None) -> float:
    if b is None or len(b) == 0 or "response_mask" not in b.tensors:
        return 0.0
    return float(b.tensors["response_mask"].sum(-1).double().mean().item())


def response_tokens(b: Batch) -> float:
    if "response_mask" in b.tensors:
        return float(b.tensors["response_mask"].sum().item())
    return 0.0


def step_metrics(
    st: StepStats,
    batch: Batch | None,
    action: str,
    *,
    target: int | None,
    pooled: int,
    skip_prob: float,
    kept_rate: float | None,
    version: int,
    stream: bool,
    band: tuple[float, float] | None,
    epoch: Any,
) -> dict[str, float]:
    """The step's ``dynamic_sampling/*`` metrics (and ``train/num_gen_batches``,
    ``train/acc_generated``). ``target``: ``train_batch_size`` when filtering is on (fewer trained
    groups make a partial step), else None; ``pooled``: groups left in the pool; ``stream``: add
    strategy stream's aborted work; ``band``: the filter band when it is in use; ``epoch``: the
    prompt source's, logged when it is an int."""
    trained_groups = 0 if batch is None else batch.num_groups()
    trained_tokens = response_tokens(batch) if batch is not None else 0.0
    m: dict[str, float] = {
        "train/num_gen_batches": st.rounds,
        P + "rounds": st.rounds,
        P + "generated_groups": st.generated_groups,
        P + "kept_groups": st.kept,
        P + "filtered_groups": st.filtered(),
        P + "filtered_all_correct": st.all_correct,
        P + "filtered_all_wrong": st.all_wrong,
        P + "filtered_out_of_band": st.out_of_band,
        P + "skipped_prompts": st.skipped_prompts,
        P + "trained_groups": trained_groups,
        P + "carried_in": st.carried_in,
        P + "surplus_carried": pooled,
        P + "surplus_dropped": st.surplus_dropped + st.stale_dropped + st.recheck_dropped,
        P + "stale_dropped": st.stale_dropped,
        P + "recheck_dropped": st.recheck_dropped,
        P + "qualified_ratio": st.kept / st.generated_groups if st.generated_groups else 0.0,
        P + "generated_groups_per_trained_group": (
            st.generated_groups / trained_groups if trained_groups else 0.0
        ),
        P + "gen_tokens_per_train_token": (st.generated_tokens / trained_tokens if trained_tokens else 0.0),
        P + "generated_response_tokens": st.generated_tokens,
        P + "trained_response_tokens": trained_tokens,
        # trained vs finished response length: a selection that favours short (or long) responses
        # shows as a gap between the two
        P + "trained_response_length_mean": _mean_length(batch),
        P + "finished_response_length_mean": finished_length_mean(st.groups),
        P + "skipped_step": 1.0 if action == "skip" else 0.0,
        P + "partial_step": (
            1.0 if action == "train" and target is not None and trained_groups < target else 0.0
        ),
        P + "shaped_metric_slip": st.shaped_slip,
        P + "round_prompts_mean": float(np.mean(st.round_sizes)) if st.round_sizes else 0.0,
        P + "skip_prob": skip_prob,
        P + "kept_rate_estimate": kept_rate if kept_rate is not None else 0.0,
        P + "policy_version": version,
    }
    acc = generated_acc(st.groups)
    if acc is not None:
        # correct fraction over every response generated this step, kept or filtered (train/acc
        # covers the trained groups only, which filtering leaves with a better mix)
        m["train/acc_generated"] = acc
    if batch is not None and "staleness" in batch.non_tensors and len(batch):
        stl = np.asarray(batch.non_tensors["staleness"].tolist(), dtype=np.float64)
        m[P + "staleness_mean"] = float(stl.mean())
        m[P + "staleness_max"] = float(stl.max())
    else:
        m[P + "staleness_mean"] = 0.0
        m[P + "staleness_max"] = 0.0
    if stream:
        m[P + "aborted_groups"] = st.aborted_groups
        m[P + "aborted_response_tokens"] = st.aborted_tokens
        m[P + "stream_refills"] = st.refills
        m[P + "drained_groups"] = st.drained_groups
    if band is not None:
        m[P + "band_low"], m[P + "band_high"] = band
    if isinstance(epoch, int):
        m[P + "epoch"] = epoch
    return m
