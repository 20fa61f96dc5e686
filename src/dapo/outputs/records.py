"""Per-step group outcomes for the report: ``<run_dir>/groups.jsonl``.

One JSON object per training step (a resumed run may repeat a step; readers keep the last)::

    {"step": 7, "action": "train", "rounds": 2, "skipped_prompts": 3,
     "groups": [{"mean": 0.25, "n": 4, "fate": "kept", "round": 1, "count": 5}, ...],
     "response_length_hist": {"bin_width": 8, "counts": [...]},
     "response_length": {"count": 96, "mean": 41.2, "min": 3, "max": 128, "clipped": 2},
     "max_response_length": 128, "overlong_buffer_len": 32}

``groups`` holds every group generated during the step (kept and filtered), aggregated by
(``mean``, ``n``, ``fate``, ``round``) with a ``count``, so a line stays small however large the
batch: ``mean`` is the fraction of the group's responses that were correct (None when the reward
gave neither ``acc`` nor ``score``), ``fate`` one of ``kept``, ``filtered_all_correct``,
``filtered_all_wrong``, ``filtered_out_of_band``, ``round`` the 1-based generation round.
``response_length_hist`` counts the generated responses' lengths in bins
``[i*bin_width, (i+1)*bin_width)`` (the last bin holds ``max_response_length``).

``<run_dir>/viewer.json`` says where the rollout and validation dumps are, for ``dapo view``.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dapo.atomic import write_text

log = logging.getLogger(__name__)

GROUPS_FILE = "groups.jsonl"
VIEWER_FILE = "viewer.json"
# a generated group's fate as the records and the report name it (the dynamic_sampling/* metric
# names), by the group filter's label (dapo.sampling.filter)
FATES = {
    "kept": "kept",
    "all_correct": "filtered_all_correct",
    "all_wrong": "filtered_all_wrong",
    "out_of_band": "filtered_out_of_band",
}
LENGTH_BINS = 64


def length_bin_width(max_response_length: int) -> int:
    return max(1, math.ceil((int(max_response_length) + 1) / LENGTH_BINS))


def summarize_step(
    step: int,
    group_records: Iterable[dict[str, Any]],
    *,
    action: str = "train",
    skipped_prompts: int = 0,
    max_response_length: int | None = None,
    overlong_buffer_len: int = 0,
) -> dict[str, Any]:
    """The groups.jsonl line of one step, from the batcher's ``SampledStep.group_records``."""
    counts: Counter[tuple] = Counter()
    lengths: list[int] = []
    rounds = 0
    for g in group_records:
        mean = g.get("mean")
        mean = None if mean is None or not math.isfinite(float(mean)) else round(float(mean), 6)
        r = int(g.get("round", 1))
        rounds = max(rounds, r)
        counts[(mean, int(g.get("n", 0)), str(g.get("fate", "kept")), r)] += 1
        lengths.extend(int(x) for x in (g.get("response_lengths") or ()))
    groups = [
        {"mean": m, "n": n, "fate": f, "round": r, "count": c}
        for (m, n, f, r), c in sorted(counts.items(), key=lambda kv: (kv[0][3], kv[0][2], _key(kv[0][0])))
    ]
    out: dict[str, Any] = {
        "step": int(step),
        "action": action,
        "rounds": rounds,
        "skipped_prompts": int(skipped_prompts),
        "groups": groups,
        "max_response_length": None if max_response_length is None else int(max_response_length),
        "overlong_buffer_len": int(overlong_buffer_len or 0),
    }
    if lengths:
        top = int(max_response_length) if max_response_length else max(lengths)
        w = length_bin_width(top)
        hist = [0] * (top // w + 1)
        for x in lengths:
            hist[min(max(x, 0) // w, len(hist) - 1)] += 1
        out["response_length_hist"] = {"bin_width": w, "counts": hist}
        out["response_length"] = {
            "count": len(lengths),
            "mean": sum(lengths) / len(lengths),
            "min": min(lengths),
            "max": max(lengths),
            "clipped": sum(1 for x in lengths if max_response_length and x >= max_response_length),
        }
    return out


def _key(m: float | None) -> float:
    return -1.0 if m is None else m


class GroupRecorder:
    """Writes ``groups.jsonl`` (and ``viewer.json``) in the run directory. Never raises into the
    training loop."""

    def __init__(
        self,
        run_dir: str | Path,
        *,
        max_response_length: int | None = None,
        overlong_buffer_len: int = 0,
        rollout_data_dir: str | None = None,
        validation_data_dir: str | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / GROUPS_FILE
        self.max_response_length = max_response_length
        self.overlong_buffer_len = int(overlong_buffer_len or 0)
        # written with the first step's line, so a start that is refused writes nothing here
        self._viewer_info: dict[str, Any] | None = {
            "rollout_data_dir": _abs(rollout_data_dir),
            "validation_data_dir": _abs(validation_data_dir),
            "max_response_length": max_response_length,
            "overlong_buffer_len": self.overlong_buffer_len,
        }

    @classmethod
    def from_config(cls, run_dir: str | Path, cfg: Any) -> GroupRecorder:
        """From the resolved run config."""
        tr, ob = cfg.trainer, cfg.reward_model.overlong_buffer
        return cls(
            run_dir,
            max_response_length=cfg.data.max_response_length,
            overlong_buffer_len=int(ob.len) if ob.enable else 0,
            rollout_data_dir=tr.rollout_data_dir,
            validation_data_dir=tr.validation_data_dir,
        )

    def write(self, step: int, sampled: Any) -> None:
        """Append the step's line; ``sampled`` is the batcher's ``SampledStep``."""
        try:
            if self._viewer_info is not None:
                write_text(self.run_dir / VIEWER_FILE, json.dumps(self._viewer_info, indent=2) + "\n")
                self._viewer_info = None
            skipped = int((sampled.metrics or {}).get("dynamic_sampling/skipped_prompts", 0))
            line = summarize_step(
                step,
                getattr(sampled, "group_records", None) or [],
                action=getattr(sampled, "action", "train"),
                skipped_prompts=skipped,
                max_response_length=self.max_response_length,
                overlong_buffer_len=self.overlong_buffer_len,
            )
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(line) + "\n")
                f.flush()
                os.fsync(f.fileno())  # on disk before the step's checkpoint
        except Exception as e:  # a plot record must never stop training
            log.warning("could not write %s for step %s: %s", self.path, step, e)


def _abs(p: str | None) -> str | None:
    return None if not p else str(Path(p).expanduser().resolve())


def read_jsonl_by_step(path: Path) -> dict[int, dict[str, Any]]:
    """Rows of a per-step JSONL file merged by ``step`` (later rows win key by key); bad lines
    (a run killed mid-write) are skipped."""
    out: dict[int, dict[str, Any]] = {}
    if not path.is_file():
        return out
    with path.open(encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
                step = int(row["step"])
            except (ValueError, KeyError, TypeError):
                continue
            out.setdefault(step, {}).update(row)
    return dict(sorted(out.items()))


def read_groups(run_dir: str | Path) -> dict[int, dict[str, Any]]:
    """groups.jsonl by step; a repeated step (resume) keeps its last line whole."""
    path = Path(run_dir) / GROUPS_FILE
    out: dict[int, dict[str, Any]] = {}
    if not path.is_file():
        return out
    with path.open(encoding="utf-8") as f:
        for line in f:
            try:
                row = json.loads(line)
                out[int(row["step"])] = row
            except (ValueError, KeyError, TypeError):
                continue
    return dict(sorted(out.items()))


def read_metrics(run_dir: str | Path) -> dict[int, dict[str, Any]]:
    return read_jsonl_by_step(Path(run_dir) / "metrics.jsonl")
