"""Skip rule ``trend``: every prompt's groups through a shared model of how the policy improves.

:class:`TrendModel` keeps each prompt's newest groups (``skip.trend.max_groups``), refits the
solve-rate model of :mod:`dapo.sampling.solve_model` every ``refit_every`` policy updates (the
pool's prior over difficulty, the gain per trained group and the drift per update) and answers
``zero_spread_prob``: the chance that the prompt's next group has no spread. The skip decision
(:meth:`TrendModel.skips`) has two thresholds: a prompt rolled out within ``revisit_after``
updates is skipped from ``threshold`` up (low: keep rolling out only prompts likely to spread),
one not rolled out for longer only from ``revisit_threshold`` up (high: come back to every
prompt whose evidence is not confident, so the run keeps covering its data). A prompt whose
evidence after decay is under ``min_evidence`` groups is never skipped.

Confirmation: a prompt whose first group had no spread is queued for a second group at the next
policy version (``confirm``), so one unlucky group of ``n`` cannot hide a learnable prompt for
the rest of the run; the queue holds the prompt's row and travels with the checkpoint.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import numpy as np

from dapo.config.sampling import TrendConfig
from dapo.sampling import solve_model as sm

FIT_PROMPTS = 4096  # prompts a refit reads at most


class TrendModel:
    def __init__(self, cfg: TrendConfig, n: int) -> None:
        self.cfg = cfg
        self.n = int(n)
        self.groups: dict[int, np.ndarray] = {}  # rows (trained, version, correct, n), oldest first
        self.fitted = sm.Fit(0.0, 0.0, sm.flat_log_prior())
        self.fit_version = 0
        self.queue: deque[tuple[int, int, dict]] = deque()  # (due version, index, row)
        self._loglik: dict[int, np.ndarray] = {}  # from groups and fitted, recomputed

    # -- evidence ---------------------------------------------------------------------------
    def record(self, index: int, *, correct: float, n: int, version: int, trained: int) -> None:
        i = int(index)
        row = np.array([[trained, version, correct, n]], dtype=np.float64)
        g = row if i not in self.groups else np.concatenate([self.groups[i], row])[-self.cfg.max_groups :]
        self.groups[i] = g
        self._loglik[i] = sm.prompt_loglik(g, self.fitted.gamma, self.fitted.delta)

    def seen(self, index: int) -> bool:
        return int(index) in self.groups

    def confirm_later(self, index: int, row: dict, version: int) -> None:
        """Queue a prompt whose first group had no spread for one more group at ``version + 1``."""
        self.queue.append((int(version) + 1, int(index), row))

    def due_confirmations(self, version: int, k: int) -> list[dict]:
        out = []
        while self.queue and len(out) < k and self.queue[0][0] <= version:
            out.append(self.queue.popleft()[2])
        return out

    # -- prediction ---------------------------------------------------------------------------
    def shift(self, index: int, version: int, trained: int) -> float:
        """The logit shift from the prompt's newest group to ``version`` with ``trained`` of its
        groups trained (0 for a prompt never rolled out)."""
        g = self.groups.get(int(index))
        if g is None:
            return 0.0
        return self.fitted.gamma * (trained - g[-1, 0]) + self.fitted.delta * (version - g[-1, 1])

    def zero_spread_prob(self, index: int, version: int, trained: int) -> float:
        """P(the prompt's next group of ``n`` has no spread) at ``version`` with ``trained`` of its
        groups trained; the prior's prediction for a prompt never rolled out."""
        ll = self._loglik.get(int(index))
        if ll is None:
            ll = np.zeros_like(sm.GRID)
        shift = self.shift(index, version, trained)
        return sm.predict_zero_spread(ll, self.fitted.log_prior, shift, self.n)

    def evidence_groups(self, index: int, version: int) -> float:
        g = self.groups.get(int(index))
        return 0.0 if g is None else sm.evidence(g, self.cfg.decay, version) / self.n

    def skips(
        self, index: int, *, version: int, last_rollout: int, trained: int
    ) -> tuple[bool, float, float]:
        """Whether the rule skips the prompt now, its ``q`` (1.0 when not computed) and the
        threshold in force."""
        away = version - last_rollout >= self.cfg.revisit_after
        threshold = self.cfg.revisit_threshold if away else self.cfg.threshold
        if self.evidence_groups(index, version) < self.cfg.min_evidence:
            return False, 1.0, threshold
        q = self.zero_spread_prob(index, version, trained)
        return q >= threshold, q, threshold

    def horizon(self) -> float:
        """Updates after its last rollout past which the rule never skips a prompt: its evidence
        (at most ``max_groups`` groups) has decayed under ``min_evidence`` groups; ``inf``
        without decay."""
        if self.cfg.decay >= 1.0:
            return math.inf
        return float(
            math.floor(
                math.log(self.cfg.max_groups / self.cfg.min_evidence) / math.log(1.0 / self.cfg.decay) + 1e-9
            )
        )

    # -- the shared fit ------------------------------------------------------------------------
    def maybe_refit(self, version: int) -> bool:
        """Refit once ``refit_every`` updates have passed since the last fit, on every prompt
        seen, or on an evenly spaced sample of :data:`FIT_PROMPTS` of them on a larger pool (the
        fit's cost grows with the prompts; two effects and a prior need no more)."""
        if version - self.fit_version < self.cfg.refit_every or not self.groups:
            return False
        keys = sorted(self.groups)
        keys = keys[:: math.ceil(len(keys) / FIT_PROMPTS)]
        self.fitted = sm.fit(
            [self.groups[i] for i in keys],
            self.fitted,
            gain_sd=self.cfg.gain_sd,
            drift_sd=self.cfg.drift_sd,
        )
        self.fit_version = int(version)
        self._recompute()
        return True

    def _recompute(self) -> None:
        f = self.fitted
        self._loglik = {i: sm.prompt_loglik(g, f.gamma, f.delta) for i, g in self.groups.items()}

    # -- checkpoint ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "groups": {str(i): g.tolist() for i, g in self.groups.items()},
            "gamma": self.fitted.gamma,
            "delta": self.fitted.delta,
            "log_prior": self.fitted.log_prior.tolist(),
            "fit_version": self.fit_version,
            "queue": [[due, i, row] for due, i, row in self.queue],
        }

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.groups = {int(i): np.asarray(g, dtype=np.float64).reshape(-1, 4) for i, g in d["groups"].items()}
        self.fitted = sm.Fit(
            float(d["gamma"]), float(d["delta"]), np.asarray(d["log_prior"], dtype=np.float64)
        )
        self.fit_version = int(d["fit_version"])
        self.queue = deque((int(due), int(i), row) for due, i, row in d["queue"])
        self._recompute()
