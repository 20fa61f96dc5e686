"""What every strategy shares: the step it hands back (:class:`SampledStep`), the sampler's state
(:class:`Sampler`: sizes, policy version, uid counter, kept-rate estimate, filter band, the pool
and the skip policy) and the parts of a round the strategies have in common: tagging generated
groups, filtering them into the step's fresh groups, reporting a round, the round budget."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dapo.batch import Batch
from dapo.config.sampling import KEY, FilterGroupsConfig
from dapo.errors import DapoError
from dapo.sampling.filter import GroupOutcome, classify
from dapo.sampling.pool import Group, GroupPool, with_staleness
from dapo.sampling.skip import SkipPolicy
from dapo.sampling.step_stats import StepStats, correct_values, response_tokens

log = logging.getLogger(__name__)

GenerateFn = Callable[[list[dict]], Batch]
OnRound = Callable[[dict[str, Any]], None] | None


class GenerationBudgetExhausted(DapoError, ValueError):
    """``max_num_gen_batches`` rounds ran without filling the batch and ``on_exhausted=error``."""


def verl_exhausted_message(num_gen_batches: int, max_num_gen_batches: int) -> str:
    """The recipe's error text (``dapo_ray_trainer.py``), verbatim."""
    return (
        f"num_gen_batches={num_gen_batches} >= max_num_gen_batches={max_num_gen_batches}. "
        "Generated too many. Please check if your data are too difficult. "
        "You could also try set max_num_gen_batches=0 to enable endless trials."
    )


@dataclass
class SampledStep:
    """What the trainer gets for one training step.

    ``batch``: exactly ``train_batch_size`` groups of ``n`` trajectories (groups contiguous), fewer
    when the budget ran out with ``on_exhausted=train``, all ``gen_batch_size`` groups when
    filtering is disabled (docs/verl_compat.md, quirk Q2), ``None`` when ``action == "skip"``.
    """

    batch: Batch | None
    action: str  # "train" | "skip"
    metrics: dict[str, float] = field(default_factory=dict)
    # one record per group generated during this step, kept or filtered, in generation order
    # (see ``StepStats.record``); the viewer's ``GroupRecorder`` aggregates them into groups.jsonl
    group_records: list[dict[str, Any]] = field(default_factory=list)

    @property
    def num_groups(self) -> int:
        return 0 if self.batch is None else self.batch.num_groups()


class Sampler:
    """The state the strategies share across steps, and the steps of a round they have in common."""

    def __init__(
        self, cfg: FilterGroupsConfig, train_batch_size: int, gen_batch_size: int, n: int, seed: int
    ):
        self.cfg = cfg
        self.train_batch_size = int(train_batch_size)
        self.gen_batch_size = int(gen_batch_size)
        self.n = int(n)
        self.seed = int(seed)
        self.rng = np.random.Generator(np.random.PCG64(self.seed))
        self.version = 0  # policy updates so far (steps whose action was "train")
        self.calls = 0  # next_batch calls so far
        self.uid_counter = 0
        self.pool = GroupPool()
        self.trained_counts: dict[int, int] = {}  # trained groups per prompt (default and stream)
        self.skip = SkipPolicy(cfg, self.train_batch_size, self.n, self.rng, self.seed, self.trained_counts)
        self.kept_rate: float | None = None
        lo, hi = (float(x) for x in cfg.band)
        self.band_center = (lo + hi) / 2
        self.band_half = (hi - lo) / 2
        self._warned: set[str] = set()

    @property
    def band(self) -> tuple[float, float]:
        return (self.band_center - self.band_half, self.band_center + self.band_half)

    def generate(self, rows: list[dict], generate: GenerateFn, st: StepStats) -> Batch:
        """One round: ``rows`` rolled out and tagged."""
        b = self.tag(rows, generate(rows), st)
        st.rounds += 1
        st.round_sizes.append(len(rows))
        return b

    def tag(self, rows: list[dict], b: Batch, st: StepStats) -> Batch:
        """Give ``rows``' generated groups their uids, policy version and prompt index, and count them."""
        if len(b) != len(rows) * self.n:
            raise ValueError(
                f"generate() returned {len(b)} trajectories for {len(rows)} prompts with n={self.n}; "
                f"expected {len(rows) * self.n} (interleaved, n per prompt)"
            )
        uids = np.empty(len(b), dtype=object)
        for i in range(len(rows)):
            uids[i * self.n : (i + 1) * self.n] = f"g{self.uid_counter}"
            self.uid_counter += 1
        b["uid"] = uids
        b["gen_version"] = np.full(len(b), st.gen_version, dtype=object)
        if "index" not in b.non_tensors:
            idx = np.empty(len(b), dtype=object)
            for i, r in enumerate(rows):
                idx[i * self.n : (i + 1) * self.n] = r.get("index")
            b["index"] = idx
        st.generated_groups += len(rows)
        st.generated_tokens += response_tokens(b)
        return b

    def count(self, outcomes: list[GroupOutcome], st: StepStats) -> None:
        st.count(outcomes)
        if st.shaped_slip and "shaped" not in self._warned:
            self._warned.add("shaped")
            log.warning(
                "%s.metric=%s kept groups whose acc values are all equal (the metric's spread comes from "
                "reward shaping such as the overlong penalty); %s.metric=acc filters on correctness",
                KEY,
                self.cfg.metric,
                KEY,
            )

    def carried(self, st: StepStats) -> int:
        """At the start of a step: drop the pool's stale groups; how many carried groups are left."""
        self.pool.drop_stale(self.version, self.cfg.max_staleness, st)
        return len(self.pool)

    def filter_into(self, b: Batch, st: StepStats, fresh: list[Group]) -> int:
        """Classify ``b``'s groups, show them to the skip policy, append the kept ones to
        ``fresh``, then re-check the pool against the new evidence; returns how many were kept."""
        outcomes = classify(b, self.cfg.metric, rule=self.cfg.filter_rule, band=self.band)
        self.count(outcomes, st)
        st.record(b, outcomes)
        kept_now = 0
        index_col = b.non_tensors["index"]
        correct = correct_values(b)
        for o in outcomes:
            idx = index_col[o.rows[0]]
            idx = None if idx is None else int(idx)
            if idx is not None:
                self.skip.observe(
                    idx,
                    filtered=not o.kept,
                    mean=o.mean,
                    correct=None if correct is None else sum(correct[i] for i in o.rows.tolist()),
                    n=len(o.rows),
                    version=self.version,
                )
            if o.kept:
                fresh.append(Group(b.select(o.rows), st.gen_version, idx))
                kept_now += 1
        self.pool.recheck(self.solved, st)
        return kept_now

    def solved(self, g: Group) -> bool:
        return self.skip.solved_since(g.index, g.version, self.version)

    def adapt(self, generated: int, kept: int) -> None:
        """After a round of ``generated`` groups, ``kept`` of them: the kept-rate estimate, the
        skip policy's controller and (``adaptive_threshold``) the band."""
        if generated <= 0:
            return
        cfg = self.cfg
        rate = kept / generated
        a = cfg.kept_rate_ema
        self.kept_rate = rate if self.kept_rate is None else (1 - a) * self.kept_rate + a * rate
        self.skip.adapt(self.kept_rate)
        at = cfg.adaptive_threshold
        if at.enable and cfg.filter_rule == "band":
            self.band_half = max(at.min_width / 2, self.band_half - at.rate * (rate - at.target))

    def take(self, fresh: list[Group], exhausted: str | None, st: StepStats) -> SampledStep:
        """The step's batch from the pool's carried groups and ``fresh`` (see ``GroupPool.take``)."""
        batch = self.pool.take(
            fresh,
            self.train_batch_size,
            exhausted=exhausted,
            carry_over=self.cfg.carry_over,
            solved=self.solved,
            st=st,
        )
        if batch is None:
            return SampledStep(None, "skip")
        for idx in batch.non_tensors["index"].tolist()[:: self.n]:  # groups are n contiguous rows
            if idx is not None:
                self.trained_counts[int(idx)] = self.trained_counts.get(int(idx), 0) + 1
        return SampledStep(with_staleness(batch, self.version), "train")

    def report(self, on_round: OnRound, st: StepStats, kept_total: int, extra: dict | None = None) -> None:
        if on_round is None:
            return
        info = {
            "round": st.rounds,
            "round_prompts": st.round_sizes[-1] if st.round_sizes else 0,
            "kept": kept_total,
            "target": self.train_batch_size,
            "filtered": st.filtered(),
            "filtered_all_correct": st.all_correct,
            "filtered_all_wrong": st.all_wrong,
            "skipped_prompts": st.skipped_prompts,
        }
        if extra:
            info.update(extra)
        on_round(info)

    def pool_info(self) -> dict[str, Any]:
        return {"pool": len(self.pool), "skip_prob": self.skip.prob, "kept_rate_estimate": self.kept_rate}

    def exhausted(self, st: StepStats, kept: int, verl: bool) -> str:
        """``max_num_gen_batches`` rounds are spent with ``kept`` groups: raise
        (``on_exhausted=error``) or say so and return ``"train"`` or ``"skip"``."""
        k = self.cfg.max_num_gen_batches
        if self.cfg.on_exhausted == "error":
            if verl:
                raise GenerationBudgetExhausted(verl_exhausted_message(st.rounds, k))
            raise GenerationBudgetExhausted(
                verl_exhausted_message(st.rounds, k)
                + f" Collected {kept} of {self.train_batch_size} groups in {st.rounds} rounds"
                f" ({st.filtered()} filtered: {st.all_correct} all-correct, {st.all_wrong} all-wrong,"
                f" {st.out_of_band} out of band). Knobs: {KEY}.max_num_gen_batches, data.gen_batch_size,"
                f" {KEY}.metric, {KEY}.on_exhausted=train|skip (train on what was collected / skip the step)."
            )
        log.warning(
            "%s.max_num_gen_batches=%d reached with %d of %d groups; on_exhausted=%s",
            KEY,
            k,
            kept,
            self.train_batch_size,
            self.cfg.on_exhausted,
        )
        return self.cfg.on_exhausted

    def warn_many_rounds(self, st: StepStats, have: int) -> None:
        log.warning(
            "%d generation rounds for one step, %d of %d groups kept so far (%d filtered); "
            "%s.max_num_gen_batches=%d. Set it > 0 with %s.on_exhausted=train|skip to bound this",
            st.rounds,
            have,
            self.train_batch_size,
            st.filtered(),
            KEY,
            self.cfg.max_num_gen_batches,
            KEY,
        )
