"""Per-prompt outcome history for pre-rollout skipping (GRESO-style, with bounded revisit).

For every prompt index we keep: how many groups in a row the filter dropped (``streak``), how many
draws in a row the prompt was skipped (``skips``), how often it was rolled out (``visits``), its
last group mean, the policy version of its last rollout (``seen``) and a Beta posterior of its
solve rate over all its groups (:mod:`dapo.sampling.posterior`), decayed by the policy updates
between groups.

Three skip rules. ``streak``: a prompt is a skip candidate once ``streak >= min_streak``; a
candidate is skipped with probability ``prob``. ``posterior``: a prompt whose posterior holds at
least a minimum weight of evidence and gives its next group no spread with probability at least
a threshold is skipped (:func:`dapo.sampling.posterior.confident_no_spread`), but for a rare
exploring rollout (so prompts the policy has since solved are skipped even when their last group
had spread, and a prompt whose evidence has faded is rolled out, whatever the prior predicts).
``thompson``: one solve rate drawn from the posterior per prompt and policy version decides.
Every rule keeps the revisit bound: a prompt last rolled out ``max_updates`` or more
policy updates ago is rolled out on its next draw. The bound counts policy updates, not draws:
skipped draws are cheap, so a run that skips most prompts passes over its data many times per
update, and a bound in draws would force a rollout of every skipped prompt after a fixed number
of passes, all of them in the same few steps. Each prompt's own bound lies in
``(max_updates / 2, max_updates]`` (:func:`revisit_bound`), so prompts first seen together are not
re-checked together.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import floor, inf
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
    seen: int = 0  # policy version of the last rollout


_GOLDEN = (5**0.5 - 1) / 2


def revisit_bound(index: int, max_updates: int) -> int:
    """The prompt's own revisit bound, in ``(max_updates / 2, max_updates]`` (0 when
    ``max_updates`` is 0): staggered by the fractional part of ``index`` times the golden ratio,
    so neighbouring indices (and prompts first seen in the same step) spread evenly."""
    frac = (int(index) * _GOLDEN) % 1.0
    return max_updates - floor(frac * max_updates / 2)


class PromptHistory:
    """``max_weight``: the most evidence (responses' worth) a posterior keeps after a group
    (:func:`dapo.sampling.posterior.capped`; ``inf``: no cap)."""

    def __init__(
        self, prior: tuple[float, float] = (1.0, 1.0), decay: float = 1.0, max_weight: float = inf
    ) -> None:
        self.records: dict[int, PromptRecord] = {}
        self.prior = (float(prior[0]), float(prior[1]))
        self.decay = float(decay)
        self.max_weight = float(max_weight)
        self.explored = False  # see should_skip_posterior

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
        max_updates: int,
        version: int,
        n: int,
        rng: np.random.Generator,
        explore: bool = True,
        min_weight: float = 0.0,
    ) -> bool:
        """Skip a prompt whose posterior holds at least ``min_weight`` responses' worth of evidence
        and gives P(no spread) ``q`` at least ``prob``
        (:func:`~dapo.sampling.posterior.confident_no_spread`), but for an exploring rollout with
        probability ``(1 - max_prob) * (1 - q) / (1 - prob)`` (the more certain, the rarer);
        ``explore=False``: no exploring rollout. Never a prompt without history, never one due
        under the revisit bound (:meth:`due`), never one more than :meth:`horizon` updates past
        its last rollout. :attr:`explored` says whether the last call that rolled a prompt out
        did so to explore."""
        self.explored = False
        rec = self.records.get(int(index))
        if rec is None or self.due(index, version, max_updates):
            return False
        a, b = self.posterior(index, version)
        # posterior.confident_no_spread, with q kept for the exploring rollout
        if posterior.weight(a, b, self.prior) < min_weight:
            return False
        q = posterior.zero_spread_prob(a, b, n)
        if q < prob:
            return False
        # draw for every candidate (even when exploring is off) so that the stream depends on the history alone
        if rng.random() < (1.0 - max_prob) * (1.0 - q) / max(1.0 - prob, 1e-12) and explore:
            self.explored = True
            return False
        rec.skips += 1
        rec.total_skips += 1
        return True

    def should_skip_thompson(
        self, index: int, *, prob: float, max_updates: int, version: int, n: int, seed: int
    ) -> bool:
        """Thompson sampling: draw one solve rate ``p`` from the prompt's posterior as of
        ``version`` and skip when ``p^n + (1-p)^n >= prob``. The draw is a function of ``(seed,
        index, version)``, so every draw of the prompt within one policy version agrees (however
        many passes over the data a step makes) and a resume replays it. Never a prompt without
        history, never one due under the revisit bound."""
        rec = self.records.get(int(index))
        if rec is None or self.due(index, version, max_updates):
            return False
        a, b = self.posterior(index, version)
        p = float(np.random.default_rng([int(seed), int(index), int(version)]).beta(a, b))
        if posterior.point_zero_spread(p, n) < prob:
            return False
        rec.skips += 1
        rec.total_skips += 1
        return True

    def horizon(self, min_weight: float) -> float:
        """Updates after its last rollout past which the posterior rule never skips a prompt
        (:func:`~dapo.sampling.posterior.skip_horizon` of the cap, ``min_weight`` and the decay)."""
        return posterior.skip_horizon(self.max_weight, min_weight, self.decay)

    def due(self, index: int, version: int, max_updates: int) -> bool:
        """Whether the revisit bound forces the prompt's next draw to be rolled out: its last
        rollout was at least its own :func:`revisit_bound` policy updates before ``version``."""
        rec = self.records.get(int(index))
        return rec is None or version - rec.seen >= revisit_bound(index, max_updates)

    def should_skip(
        self,
        index: int,
        *,
        prob: float,
        min_streak: int,
        max_updates: int,
        version: int,
        rng: np.random.Generator,
    ) -> bool:
        rec = self.records.get(int(index))
        if rec is None or rec.streak < min_streak or self.due(index, version, max_updates):
            return False
        # exploration (1 - prob) shrinks with the streak: a prompt filtered many times in a row is
        # rechecked less often, but never later than its revisit bound.
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
        rec.seen = int(version)
        rec.streak = rec.streak + 1 if filtered else 0
        rec.last_mean = float(mean)
        if correct is not None and n > 0:
            a, b = posterior.decayed(rec.alpha, rec.beta, version - rec.version, self.decay, self.prior)
            a, b = posterior.observe(a, b, float(correct), int(n))
            rec.alpha, rec.beta = posterior.capped(a, b, self.prior, self.max_weight)
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
                r.seen,
            ]
            for k, r in self.records.items()
        }

    @classmethod
    def from_state_dict(
        cls,
        d: dict[str, Any],
        prior: tuple[float, float] = (1.0, 1.0),
        decay: float = 1.0,
        max_weight: float = inf,
    ) -> PromptHistory:
        """Inverse of :meth:`state_dict`; records saved before the posterior existed start at the
        prior, and before ``seen`` existed take their newest evidence's version as their last rollout.
        The cap applies on loading too (a no-op on
        records saved under the same cap), so a record saved without it obeys :meth:`horizon`."""
        h = cls(prior, decay, max_weight)
        for k, row in d.items():
            streak, skips, visits, total, mean = row[:5]
            alpha, beta, version = row[5:8] if len(row) >= 8 else (h.prior[0], h.prior[1], 0)
            seen = row[8] if len(row) >= 9 else version
            h.records[int(k)] = PromptRecord(
                int(streak),
                int(skips),
                int(visits),
                int(total),
                float("nan") if mean is None else float(mean),
                float(alpha),
                float(beta),
                int(version),
                int(seen),
            )
            rec = h.records[int(k)]
            rec.alpha, rec.beta = posterior.capped(rec.alpha, rec.beta, h.prior, h.max_weight)
        return h
