"""Per-prompt outcome history for pre-rollout skipping (GRESO-style, with bounded revisit).

For every prompt index we keep: how many groups in a row the filter dropped (``streak``), how many
draws in a row the prompt was skipped (``skips``), how often it was rolled out (``visits``) and
its last group mean, and a Beta posterior of its solve rate over all its groups
(:mod:`dapo.sampling.posterior`), decayed by the policy updates between groups.

Two skip rules. ``streak``: a prompt is a skip candidate once ``streak >= min_streak``; a candidate is
skipped with probability ``prob`` unless it was already skipped ``max_consecutive`` times in a
row, in which case it is rolled out. ``posterior``: every prompt with history is skipped with
probability ``prob`` times the posterior probability that its next group has no spread (so
prompts the policy has since solved are skipped even when their last group had spread), never
above ``max_prob`` and with the same revisit bound. Either way every prompt is rolled out at least once in every
``max_consecutive + 1`` draws of it: nothing starves, and a prompt whose solve rate drifted into
the useful range is found again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from dapo.sampling import posterior


@dataclass
class PromptRecord:
    streak: int = 0  # consecutive filtered groups
    skips: int = 0  # consecutive skipped draws
    visits: int = 0  # groups rolled out
    total_skips: int = 0
    last_mean: float = float("nan")
    alpha: float = 1.0  # Beta posterior of the solve rate (prior added at creation)
    beta: float = 1.0
    version: int = 0  # policy version of the newest evidence


class PromptHistory:
    def __init__(self, prior: tuple[float, float] = (1.0, 1.0), decay: float = 1.0) -> None:
        self.records: dict[int, PromptRecord] = {}
        self.prior = (float(prior[0]), float(prior[1]))
        self.decay = float(decay)

    def get(self, index: int) -> PromptRecord | None:
        return self.records.get(int(index))

    def posterior(self, index: int, version: int) -> tuple[float, float]:
        """The prompt's solve-rate posterior as of policy ``version`` (the prior if never seen)."""
        rec = self.records.get(int(index))
        if rec is None:
            return self.prior
        return posterior.decayed(rec.alpha, rec.beta, version - rec.version, self.decay, self.prior)

    def zero_spread_prob(self, index: int, version: int, n: int) -> float:
        """P(the prompt's next group of ``n`` has no spread) under its posterior."""
        return posterior.zero_spread_prob(*self.posterior(index, version), n)

    def should_skip_posterior(
        self,
        index: int,
        *,
        prob: float,
        max_prob: float,
        max_consecutive: int,
        version: int,
        n: int,
        rng: np.random.Generator,
    ) -> bool:
        """Skip a prompt whose P(no spread) ``q`` is at least ``prob``: with probability
        ``1 - (1 - max_prob) * (1 - q) / (1 - prob)`` (the more certain, the rarer the exploring
        rollout); never a prompt without history, never more than ``max_consecutive`` times in a row."""
        rec = self.records.get(int(index))
        if rec is None or rec.skips >= max_consecutive:
            return False
        q = self.zero_spread_prob(index, version, n)
        if q < prob:
            return False
        explore = (1.0 - max_prob) * (1.0 - q) / max(1.0 - prob, 1e-12)
        if rng.random() >= explore:
            rec.skips += 1
            rec.total_skips += 1
            return True
        return False

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

    def record(
        self,
        index: int,
        filtered: bool,
        mean: float,
        *,
        correct: float | None = None,
        n: int = 0,
        version: int = 0,
    ) -> None:
        """A rolled-out group: ``filtered`` by the filter, ``mean`` of the filter metric, and
        (for the posterior) ``correct`` right responses of ``n`` at policy ``version``."""
        rec = self.records.setdefault(int(index), PromptRecord(alpha=self.prior[0], beta=self.prior[1]))
        rec.visits += 1
        rec.skips = 0
        rec.streak = rec.streak + 1 if filtered else 0
        rec.last_mean = float(mean)
        if correct is not None and n > 0:
            a, b = posterior.decayed(rec.alpha, rec.beta, version - rec.version, self.decay, self.prior)
            rec.alpha, rec.beta = posterior.observe(a, b, float(correct), int(n))
            rec.version = int(version)

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
                r.alpha,
                r.beta,
                r.version,
            ]
            for k, r in self.records.items()
        }

    @classmethod
    def from_state_dict(
        cls, d: dict[str, Any], prior: tuple[float, float] = (1.0, 1.0), decay: float = 1.0
    ) -> PromptHistory:
        """Inverse of :meth:`state_dict`; records saved before the posterior existed start at the prior."""
        h = cls(prior, decay)
        for k, row in d.items():
            streak, skips, visits, total, mean = row[:5]
            alpha, beta, version = row[5:8] if len(row) >= 8 else (h.prior[0], h.prior[1], 0)
            h.records[int(k)] = PromptRecord(
                int(streak),
                int(skips),
                int(visits),
                int(total),
                float("nan") if mean is None else float(mean),
                float(alpha),
                float(beta),
                int(version),
            )
        return h
