"""Pre-rollout skipping (``algorithm.filter_groups.skip``): which drawn prompts to roll out.

:class:`SkipPolicy` keeps every prompt's outcome history (:mod:`dapo.sampling.history`) and the
streak rule's skip probability. The strategies and the pool use it only through ``draw`` (the
round's prompts), ``observe`` (a group's outcome), ``solved_since`` (the re-check of a carried
group) and ``adapt`` (after each round); the batcher saves ``history`` and ``prob``. A
replacement policy provides those.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import numpy as np

from dapo.config.sampling import FilterGroupsConfig
from dapo.sampling.history import PromptHistory
from dapo.sampling.trend import TrendModel


class PromptSource(Protocol):
    epoch: int

    def take(self, k: int) -> list[dict]: ...


class SkipPolicy:
    def __init__(
        self,
        cfg: FilterGroupsConfig,
        train_batch_size: int,
        n: int,
        rng: np.random.Generator,
        seed: int = 0,
        trained: dict[int, int] | None = None,
    ):
        self.cfg = cfg
        # trained groups per prompt, kept by the sampler (the trend rule's model reads it)
        self.trained = {} if trained is None else trained
        self.trend = TrendModel(cfg.skip.trend, n) if cfg.skip.rule == "trend" else None
        self._first_rows: dict[int, dict] = {}  # rows of first rollouts, until their group is seen
        self.seed = int(seed)  # the Thompson rule's draws are a function of (seed, prompt, version)
        self.train_batch_size = train_batch_size
        self.n = n
        self.rng = rng  # the batcher's generator: skipping draws from it in the batcher's order
        self.history = self.new_history()
        self.prob = float(cfg.skip.init_prob)  # the streak rule's controller
        self.new_step()

    def new_step(self) -> None:
        """Forget the per-step state (the batcher calls it before each step's first draw)."""
        # prompts skipped this step whose last group had spread
        self.spread_skips: set[int] = set()
        # the rest of a pass this step skipped whole, at the version that judged it: later draws at
        # that version fill from it instead of walking the pool again
        self.skipped_pass: tuple[int, dict[int, dict]] | None = None

    @property
    def active(self) -> bool:
        return bool(self.cfg.enable and self.cfg.strategy != "verl" and self.cfg.skip.enable)

    def metric_prob(self) -> float:
        """``dynamic_sampling/skip_prob``: the streak controller's value, 0 when not skipping."""
        return self.prob if self.active else 0.0

    def new_history(self, state: dict[str, Any] | None = None) -> PromptHistory:
        sc = self.cfg.skip
        prior = (float(sc.prior[0]), float(sc.prior[1]))
        cap = float(sc.max_evidence) * self.n  # in responses
        if state is None:
            return PromptHistory(prior, float(sc.decay), cap)
        return PromptHistory.from_state_dict(state, prior, float(sc.decay), cap)

    def draw(self, source: PromptSource, k: int, version: int) -> tuple[list[dict], int]:
        """k prompts to roll out at policy ``version`` and how many drawn rows were not rolled
        out (every row taken from ``source`` is one of the two; a prompt filled again from the
        rolled-out ones of a pass appears twice in the round).

        Terminates: once this call has come round its pool (a prompt drawn again after at least
        as many draws in this pass as prompts with a history), the rest of the round is filled
        from that pass's prompts likeliest to spread, each at most once more: the skipped ones
        and the ones it rolled out (those are the likeliest when the rule skips all but a few). A
        round so costs at most one pass over the pool; walking on instead would roll the few out
        again on every further pass and cost passes per round (a stall on large pools). What is
        left of the skipped prompts of that pass fills the later draws of the step at the same
        version first, without walking the pool again: a strategy that draws a few prompts at a
        time (``stream``) would otherwise walk a pass per draw. A prompt drawn again sooner (a
        reshuffled epoch brings it round early) is judged again like any draw.
        Rows filled from an earlier call's pass were counted as skipped by that call."""
        sc = self.cfg.skip
        # prob is the streak rule's controller; the posterior rule decides per prompt, and a
        # well-predicted run (filtered fraction below skip.target) must not switch it off
        if not self.active or (sc.rule == "streak" and self.prob <= 0):
            return source.take(k), 0
        prob = min(self.prob, sc.max_prob)
        max_updates = math.ceil(sc.revisit_epochs * len(self.history) / self.train_batch_size)
        # exploring rollouts: max_explore * k in expectation at most, whatever the draws per round
        budget = math.floor(sc.max_explore * k + self.rng.random()) if sc.rule == "posterior" else 0
        chosen: list[dict] = []
        skipped = 0
        if self.trend is not None:
            self.trend.maybe_refit(version)
            if sc.trend.confirm:
                chosen += self.trend.due_confirmations(version, k)
        if self.skipped_pass is not None and self.skipped_pass[0] == version and self.skipped_pass[1]:
            rest = self.skipped_pass[1]
            filled = self._fill(rest, k - len(chosen), version)
            chosen += [rest.pop(i) for i in filled]
            self.spread_skips.difference_update(filled)
        passed: dict[int, dict] = {}  # skipped in this pass
        rolled: dict[int, dict] = {}  # rolled out in this pass
        seen: set[int] = set()  # drawn in this pass
        drawn = 0  # rows drawn in this pass
        while len(chosen) < k:
            for row in source.take(k - len(chosen)):
                if len(chosen) == k:  # filled below: the rest of this batch was judged in the pass
                    skipped += 1
                    continue
                idx = None if row.get("index") is None else int(row["index"])
                if idx in seen and drawn >= len(self.history):  # came round: fill from the pass
                    filled = self._fill({**rolled, **passed}, k - len(chosen), version)
                    chosen += [passed.pop(i) if i in passed else rolled[i] for i in filled]
                    skipped -= sum(i not in rolled for i in filled)  # counted as skipped when drawn
                    self.spread_skips.difference_update(filled)
                    self.skipped_pass = (version, passed)
                    passed, rolled, seen, drawn = {}, {}, set(), 0
                    if len(chosen) == k:  # this row is not rolled out; the filled ones are
                        skipped += 1
                        continue
                    # the pass skipped fewer than the round lacks: this row starts the next pass
                drawn += 1
                if idx is not None:
                    seen.add(idx)
                self.history.explored = False
                if idx is not None and self._should_skip(idx, prob, max_updates, budget > 0, version):
                    skipped += 1
                    passed[idx] = row
                    if self.history.records[idx].streak == 0:  # its last group was kept
                        self.spread_skips.add(idx)
                else:
                    chosen.append(row)
                    if idx is not None:
                        rolled[idx] = row
                        passed.pop(idx, None)  # drawn again after a reshuffle, rolled out this time
                    budget -= self.history.explored
                    if self.skipped_pass is not None:  # rolled out now: not again from the pass
                        self.skipped_pass[1].pop(idx, None)
        if self.trend is not None and sc.trend.confirm:
            for row in chosen:
                i = row.get("index")
                if i is not None and not self.trend.seen(int(i)):
                    self._first_rows.setdefault(int(i), row)
        return chosen, skipped

    def zero_spread_prob(self, idx: int, version: int) -> float:
        """P(the prompt's next group has no spread) under the rule's model of it."""
        if self.trend is not None:
            return self.trend.zero_spread_prob(idx, version, self.trained.get(int(idx), 0))
        return self.history.zero_spread_prob(idx, version, self.n)

    def _fill(self, passed: dict[int, dict], need: int, version: int) -> list[int]:
        """The ``need`` skipped prompts likeliest to spread (ties: in the order they were drawn,
        which ``sorted`` keeps)."""
        return sorted(passed, key=lambda i: self.zero_spread_prob(i, version))[:need]

    def _should_skip(self, idx: int, prob: float, max_updates: int, explore: bool, version: int) -> bool:
        sc = self.cfg.skip
        if self.trend is not None:
            return self._should_skip_trend(idx, max_updates, version)
        if sc.rule == "posterior":
            return self.history.should_skip_posterior(
                idx,
                prob=sc.threshold,
                max_prob=sc.max_prob,
                max_updates=max_updates,
                version=version,
                n=self.n,
                rng=self.rng,
                explore=explore,
                min_weight=float(sc.min_evidence) * self.n,
            )
        if sc.rule == "thompson":
            return self.history.should_skip_thompson(
                idx, prob=sc.threshold, max_updates=max_updates, version=version, n=self.n, seed=self.seed
            )
        return self.history.should_skip(
            idx,
            prob=prob,
            min_streak=sc.min_streak,
            max_updates=max_updates,
            version=version,
            rng=self.rng,
        )

    def _should_skip_trend(self, idx: int, max_updates: int, version: int) -> bool:
        """The trend rule (:meth:`TrendModel.skips`) under the revisit bound; never a prompt
        without a graded group. No exploring rollouts: the revisit threshold brings back every
        prompt whose evidence is not confident."""
        h = self.history
        h.explored = False
        rec = h.get(idx)
        if rec is None or h.due(idx, version, max_updates) or not self.trend.seen(idx):
            return False
        skip = self.trend.skips(
            idx, version=version, last_rollout=rec.seen, trained=self.trained.get(int(idx), 0)
        )[0]
        if skip:
            rec.skips += 1
            rec.total_skips += 1
        return skip

    def observe(
        self, idx: int, *, filtered: bool, mean: float, correct: float | None, n: int, version: int
    ) -> None:
        """A group of prompt ``idx`` rolled out at policy ``version``: ``correct`` of its ``n``
        responses right (None: ungraded), ``mean`` its filter metric's mean."""
        self.history.record(idx, filtered=filtered, mean=mean, correct=correct, n=n, version=version)
        if self.trend is None:
            return
        row = self._first_rows.pop(int(idx), None)
        if correct is None or n <= 0:
            return
        first = not self.trend.seen(idx)
        trained = self.trained.get(int(idx), 0)
        self.trend.record(idx, correct=float(correct), n=int(n), version=int(version), trained=trained)
        # confirm a first group without spread (all right or all wrong), whatever the filter's rule
        if first and correct in (0, n) and row is not None and self.cfg.skip.trend.confirm:
            self.trend.confirm_later(idx, row, version)

    def solved_since(self, index: int | None, gen_version: int, version: int) -> bool:
        """A carried group (generated at ``gen_version``) whose prompt's newer groups say the next
        one would have no spread."""
        sc = self.cfg.skip
        if not self.active or sc.rule not in ("posterior", "trend") or index is None or sc.recheck >= 1:
            return False
        rec = self.history.get(index)
        if rec is None or rec.version <= gen_version:  # no evidence newer than the group itself
            return False
        return self.zero_spread_prob(index, version) >= sc.recheck

    def adapt(self, kept_rate: float) -> None:
        """The streak rule's controller, after a round: compare the smoothed filtered fraction
        (not one noisy round) with ``skip.target``."""
        if self.active:
            sc = self.cfg.skip
            if 1.0 - kept_rate > sc.target:
                self.prob = min(sc.max_prob, self.prob + sc.prob_step)
            else:
                self.prob = max(0.0, self.prob - sc.prob_step)
