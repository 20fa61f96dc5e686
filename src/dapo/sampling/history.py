"""Per-prompt outcome history for pre-rollout skipping (GRESO-style, with bounded revisit).

For every prompt index we keep: how many groups in a row the filter dropped (``streak``), how many
draws in a row the prompt was skipped (``skips``), how often it was rolled out (``visits``) and
its last group mean. A prompt is a skip candidate once ``streak >= min_streak``; a candidate is
skipped with probability ``prob`` unless it was already skipped ``max_consecutive`` times in a
row, in which case it is rolled out. So every prompt is rolled out at least once in every
``max_consecutive + 1`` draws of it: nothing starves, and a prompt whose solve rate drifted into
the useful range is found again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class PromptRecord:
    streak: int = 0  # consecutive filtered groups
    skips: int = 0  # consecutive skipped draws
    visits: int = 0  # groups rolled out
    total_skips: int = 0
    last_mean: float = float("nan")


class PromptHistory:
    def __init__(self) -> None:
        self.records: dict[int, PromptRecord] = {}

    def get(self, index: int) -> PromptRecord | None:
        return self.records.get(int(index))

    def should_skip(
        self, index: int, *, prob: float, min_streak: int, max_consecutive: int, rng: np.random.Generator
    ) -> bool:
        rec = self.records.get(int(index))
        if rec is None or rec.streak < min_streak or rec.skips >= max_consecutive:
            return False
        # exploration (1 - prob) shrinks with the streak: a prompt filtered many times in a row is
        # rechecked less often, but never less than once per max_consecutive + 1 draws.
        # draw only for candidates so that the RNG stream depends on the history alone
        if rng.random() < 1.0 - (1.0 - prob) / (1 + rec.streak - min_streak):
            rec.skips += 1
            rec.total_skips += 1
            return True
        return False

    def record(self, index: int, filtered: bool, mean: float) -> None:
        rec = self.records.setdefault(int(index), PromptRecord())
        rec.visits += 1
        rec.skips = 0
        rec.streak = rec.streak + 1 if filtered else 0
        rec.last_mean = float(mean)

    def __len__(self) -> int:
        return len(self.records)

    def state_dict(self) -> dict[str, Any]:
        return {
            str(k): [
                r.streak,
                r.skips,
                r.visits,
                r.total_skips,
                None if r.last_mean != r.last_mean else r.last_mean,
            ]
            for k, r in self.records.items()
        }

    @classmethod
    def from_state_dict(cls, d: dict[str, Any]) -> PromptHistory:
        h = cls()
        for k, (streak, skips, visits, total, mean) in d.items():
            h.records[int(k)] = PromptRecord(
                int(streak),
                int(skips),
                int(visits),
                int(total),
                float("nan") if mean is None else float(mean),
            )
        return h
