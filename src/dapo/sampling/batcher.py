"""The dynamic batcher: rounds of rollout -> group filter -> pool -> one training batch.

The batcher knows nothing about models. It sees a prompt ``source`` (``.take(k)`` returns prompt
rows, each with a stable int ``"index"``; it rolls over epochs itself; ``.epoch``) and a
``generate(rows) -> Batch`` function that rolls out and scores ``len(rows) * n`` trajectories in
interleaved order (p0r0..p0r(n-1), p1r0, ...).

Every trajectory handed back carries two extra non-tensor columns: ``gen_version`` (the number of
policy updates that had happened when it was generated) and ``staleness`` (policy updates between
generation and this training step; 0 unless the group was carried over). The sampler log-probs
(``rollout_log_probs``) travel with the group, so the update can correct for the drift.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from dapo.batch import Batch
from dapo.config.sampling import KEY, FilterGroupsConfig, validate
from dapo.errors import DapoError
from dapo.outputs.records import FATES
from dapo.sampling.filter import ALL_CORRECT, ALL_WRONG, KEPT, OUT_OF_BAND, GroupOutcome, classify
from dapo.sampling.history import PromptHistory
from dapo.sampling.stream import GroupStream, stream_refill

log = logging.getLogger(__name__)

P = "dynamic_sampling/"


class PromptSource(Protocol):
    epoch: int

    def take(self, k: int) -> list[dict]: ...


GenerateFn = Callable[[list[dict]], Batch]


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
    # (see ``_Stats.record``); the viewer's ``GroupRecorder`` aggregates them into groups.jsonl
    group_records: list[dict[str, Any]] = field(default_factory=list)

    @property
    def num_groups(self) -> int:
        return 0 if self.batch is None else self.batch.num_groups()


@dataclass
class _Group:
    batch: Batch  # the group's n trajectories
    version: int  # policy version when generated
    index: int | None  # prompt index


@dataclass
class _Stats:
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
    round_sizes: list[int] = field(default_factory=list)
    groups: list[dict[str, Any]] = field(default_factory=list)

    def filtered(self) -> int:
        return self.all_correct + self.all_wrong + self.out_of_band

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
        correct = _correct_values(b)
        index = b.non_tensors.get("index")
        for o in outcomes:
            rows = o.rows.tolist()
            idx = None if index is None else _plain(index[rows[0]])
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


def _correct_values(b: Batch) -> list[float] | None:
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


def _generated_acc(groups: list[dict[str, Any]]) -> float | None:
    """Correct responses / all responses over the recorded groups (None when none is graded)."""
    graded = [(g["mean"], g["n"]) for g in groups if g["mean"] is not None]
    total = sum(n for _, n in graded)
    return float(sum(m * n for m, n in graded) / total) if total else None


def _response_tokens(b: Batch) -> float:
    if "response_mask" in b.tensors:
        return float(b.tensors["response_mask"].sum().item())
    return 0.0


class DynamicBatcher:
    def __init__(
        self, cfg: FilterGroupsConfig, train_batch_size: int, gen_batch_size: int, n: int, seed: int
    ) -> None:
        problems = validate(cfg)
        if problems:
            raise ValueError("invalid dynamic-sampling config:\n  " + "\n  ".join(problems))
        for name, v in (("data.train_batch_size", train_batch_size), ("data.gen_batch_size", gen_batch_size)):
            if int(v) < 1:
                raise ValueError(f"{name} must be >= 1, got {v}")
        if int(n) < 1:
            raise ValueError(f"actor_rollout_ref.rollout.n must be >= 1, got {n}")
        self.cfg = cfg
        self.train_batch_size = int(train_batch_size)
        self.gen_batch_size = int(gen_batch_size)
        self.n = int(n)
        self.seed = int(seed)
        self.rng = np.random.Generator(np.random.PCG64(self.seed))
        self.version = 0  # policy updates so far (steps whose action was "train")
        self.calls = 0  # next_batch calls so far
        self.uid_counter = 0
        self.pool: list[_Group] = []
        self.history = self._new_history()
        self.kept_rate: float | None = None
        self.skip_prob = float(cfg.skip.init_prob)
        lo, hi = (float(x) for x in cfg.band)
        self.band_center = (lo + hi) / 2
        self.band_half = (hi - lo) / 2
        self._warned: set[str] = set()

    @staticmethod
    def from_config(cfg: Any) -> DynamicBatcher:
        """From the resolved, typed run config (``dapo.config.resolve``): ``algorithm.filter_groups``,
        ``data.{train,gen}_batch_size``, ``rollout.n`` and ``trainer.seed``."""
        return DynamicBatcher(
            cfg.algorithm.filter_groups,
            cfg.data.train_batch_size,
            int(cfg.data.gen_batch_size),
            cfg.actor_rollout_ref.rollout.n,
            seed=int(cfg.trainer.seed),
        )

    # ------------------------------------------------------------------ public

    @property
    def band(self) -> tuple[float, float]:
        return (self.band_center - self.band_half, self.band_center + self.band_half)

    def next_batch(
        self,
        source: PromptSource,
        generate: GenerateFn,
        on_round: Callable[[dict[str, Any]], None] | None = None,
        lag: int = 0,
        stream: GroupStream | None = None,
    ) -> SampledStep:
        """One training step's batch. ``lag``: policy updates that will land between generation and
        training; 1 when the trainer generates while the previous step's update runs
        (``algorithm.filter_groups.prefetch``), so those groups count as one update stale.
        ``stream``: the engine's group stream, which strategy ``stream`` generates with (instead
        of ``generate``)."""
        self.calls += 1
        st = _Stats(gen_version=self.version - lag)
        if not self.cfg.enable:
            step = self._step_unfiltered(source, generate, st, on_round)
        elif self.cfg.strategy == "stream":
            if stream is None:
                raise ValueError(
                    f"{KEY}.strategy=stream needs a group stream (actor_rollout_ref.rollout.name=vllm)"
                )
            step = self._step_stream(source, stream, st, on_round)
        elif self.cfg.strategy == "verl":
            step = self._step_verl(source, generate, st, on_round)
        else:
            step = self._step_default(source, generate, st, on_round)
        step.metrics.update(self._metrics(st, step, source))
        step.group_records = st.groups
        if step.action == "train":
            self.version += 1
        return step

    # ------------------------------------------------------------------ helpers

    def _new_history(self, state: dict[str, Any] | None = None) -> PromptHistory:
        sc = self.cfg.skip
        prior = (float(sc.prior[0]), float(sc.prior[1]))
        if state is None:
            return PromptHistory(prior, float(sc.decay))
        return PromptHistory.from_state_dict(state, prior, float(sc.decay))

    def _generate(self, rows: list[dict], generate: GenerateFn, st: _Stats) -> Batch:
        b = self._tag(rows, generate(rows), st)
        st.rounds += 1
        st.round_sizes.append(len(rows))
        return b

    def _tag(self, rows: list[dict], b: Batch, st: _Stats) -> Batch:
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
        st.generated_tokens += _response_tokens(b)
        return b

    def _count(self, outcomes: list[GroupOutcome], st: _Stats) -> None:
        for o in outcomes:
            if o.label == ALL_CORRECT:
                st.all_correct += 1
            elif o.label == ALL_WRONG:
                st.all_wrong += 1
            elif o.label == OUT_OF_BAND:
                st.out_of_band += 1
            else:
                st.kept += 1
                if o.acc_spread is False:
                    st.shaped_slip += 1
        if st.shaped_slip and "shaped" not in self._warned:
            self._warned.add("shaped")
            log.warning(
                "%s.metric=%s kept groups whose acc values are all equal (the metric's spread comes from "
                "reward shaping such as the overlong penalty); %s.metric=acc filters on correctness",
                KEY,
                self.cfg.metric,
                KEY,
            )

    def _report(self, on_round, st: _Stats, kept_total: int, extra: dict | None = None) -> None:
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

    def _exhausted(self, st: _Stats, kept: int, verl: bool) -> str:
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

    def _warn_many_rounds(self, st: _Stats, have: int) -> None:
        k_max = self.cfg.max_num_gen_batches
        log.warning(
            "%d generation rounds for one step, %d of %d groups kept so far (%d filtered); "
            "%s.max_num_gen_batches=%d. Set it > 0 with %s.on_exhausted=train|skip to bound this",
            st.rounds,
            have,
            self.train_batch_size,
            st.filtered(),
            KEY,
            k_max,
            KEY,
        )

    @staticmethod
    def _with_staleness(b: Batch, version: int) -> Batch:
        b["staleness"] = np.asarray([version - int(v) for v in b.non_tensors["gen_version"]], dtype=object)
        return b

    # ------------------------------------------------------------------ strategies

    def _step_unfiltered(self, source, generate, st: _Stats, on_round) -> SampledStep:
        # verl: batch = new_batch, untrimmed (quirk Q2)
        rows = source.take(self.gen_batch_size)
        b = self._generate(rows, generate, st)
        st.kept += len(rows)
        st.record(b, None)
        self._report(on_round, st, len(rows))
        return SampledStep(self._with_staleness(b, self.version), "train", {})

    def _step_verl(self, source, generate, st: _Stats, on_round) -> SampledStep:
        parts: list[Batch] = []
        kept = 0
        k = self.cfg.max_num_gen_batches
        while True:
            rows = source.take(self.gen_batch_size)
            b = self._generate(rows, generate, st)
            outcomes = classify(b, self.cfg.metric, verl=True)
            self._count(outcomes, st)
            st.record(b, outcomes)
            keep_rows = [r for o in outcomes if o.kept for r in o.rows.tolist()]
            kept += sum(1 for o in outcomes if o.kept)
            parts.append(b.select(sorted(keep_rows)))
            self._report(on_round, st, kept)
            if kept < self.train_batch_size:
                if k > 0 and st.rounds >= k:
                    action = self._exhausted(st, kept, verl=True)
                    if action == "train" and kept > 0:
                        return SampledStep(self._with_staleness(Batch.concat(parts), self.version), "train")
                    st.surplus_dropped += kept
                    return SampledStep(None, "skip")
                continue
            full = Batch.concat(parts)
            st.surplus_dropped += kept - self.train_batch_size
            batch = full.slice(0, self.train_batch_size * self.n)
            return SampledStep(self._with_staleness(batch, self.version), "train")

    def _step_default(self, source, generate, st: _Stats, on_round) -> SampledStep:
        cfg = self.cfg
        B = self.train_batch_size
        self._drop_stale(st)
        fresh: list[_Group] = []
        have = len(self.pool)
        exhausted = None
        k_max = cfg.max_num_gen_batches
        while have < B:
            if k_max > 0 and st.rounds >= k_max:
                exhausted = self._exhausted(st, have, verl=False)
                break
            if st.rounds and st.rounds % 50 == 0:
                self._warn_many_rounds(st, have)
            rows, skipped = self._draw(source, self._round_size(B - have))
            st.skipped_prompts += skipped
            b = self._generate(rows, generate, st)
            kept_now = self._filter_into(b, st, fresh)
            self._recheck_pool(st)
            have = len(self.pool) + len(fresh)
            self._adapt(len(rows), kept_now)
            self._report(on_round, st, have, self._pool_info())
        return self._take_from_pool(fresh, exhausted, st)

    def _step_stream(self, source, stream: GroupStream, st: _Stats, on_round) -> SampledStep:
        """Groups go to the engine one by one and are filtered as each finishes; the engine is
        refilled while the groups in flight are not expected to fill the batch, and what is still
        in flight when it is full is aborted (its partial tokens count as generated)."""
        B = self.train_batch_size
        self._drop_stale(st)
        fresh: list[_Group] = []
        have = len(self.pool)
        exhausted = None
        k_max = self.cfg.max_num_gen_batches
        budget = k_max * self.gen_batch_size if k_max > 0 else None  # prompts this step may launch
        launched = finished = kept_step = 0
        try:
            while have < B:
                want = stream_refill(
                    B - have,
                    stream.in_flight,
                    self.gen_batch_size,
                    self._stream_rate(finished, kept_step),
                    self.cfg.round_margin,
                )
                if budget is not None:
                    want = min(want, budget - launched)
                if want > 0:
                    rows, skipped = self._draw(source, want)
                    st.skipped_prompts += skipped
                    stream.submit(rows)
                    launched += len(rows)
                    st.round_sizes.append(len(rows))
                    before, st.rounds = st.rounds, math.ceil(launched / self.gen_batch_size)
                    if st.rounds // 50 > before // 50:  # unbounded and still short: say so, as default does
                        self._warn_many_rounds(st, have)
                if stream.in_flight == 0:  # the budget is spent and every launched group is in
                    exhausted = self._exhausted(st, have, verl=False)
                    break
                rows, b = stream.wait()
                b = self._tag(rows, b, st)
                kept_now = self._filter_into(b, st, fresh)
                self._recheck_pool(st)
                have = len(self.pool) + len(fresh)
                finished += len(rows)
                kept_step += kept_now
                self._report(on_round, st, have, {**self._pool_info(), "in_flight": stream.in_flight})
        finally:
            groups, tokens = stream.abort()
            st.aborted_groups += groups
            st.aborted_tokens += tokens
            st.generated_groups += groups
            st.generated_tokens += tokens
        st.refills = len(st.round_sizes)
        self._adapt(finished, kept_step)
        return self._take_from_pool(fresh, exhausted, st)

    def _stream_rate(self, finished: int, kept: int) -> float | None:
        """The kept rate the refill plans with: the running estimate from earlier steps, else this
        step's groups so far on top of one kept pseudo-group (the optimistic start that
        ``stream_refill`` uses before any evidence), else unknown. ``adaptive_rounds`` off: 0,
        which keeps the engine full (``data.gen_batch_size`` groups in flight)."""
        if not self.cfg.adaptive_rounds:
            return 0.0
        if self.kept_rate is not None:
            return self.kept_rate
        return (kept + 1) / (finished + 1) if finished else None

    def _pool_info(self) -> dict[str, Any]:
        return {"pool": len(self.pool), "skip_prob": self.skip_prob, "kept_rate_estimate": self.kept_rate}

    def _drop_stale(self, st: _Stats) -> None:
        """Groups older than max_staleness policy updates are never trained on."""
        live = []
        for g in self.pool:
            if self.version - g.version > self.cfg.max_staleness:
                st.stale_dropped += 1
            else:
                live.append(g)
        self.pool = live

    def _filter_into(self, b: Batch, st: _Stats, fresh: list[_Group]) -> int:
        """Classify ``b``'s groups, record them in the prompt history, append the kept ones to
        ``fresh``; returns how many were kept."""
        outcomes = classify(b, self.cfg.metric, rule=self.cfg.filter_rule, band=self.band)
        self._count(outcomes, st)
        st.record(b, outcomes)
        kept_now = 0
        index_col = b.non_tensors["index"]
        correct = _correct_values(b)
        for o in outcomes:
            idx = index_col[o.rows[0]]
            idx = None if idx is None else int(idx)
            if idx is not None:
                self.history.record(
                    idx,
                    filtered=not o.kept,
                    mean=o.mean,
                    correct=None if correct is None else sum(correct[i] for i in o.rows.tolist()),
                    n=len(o.rows),
                    version=self.version,
                )
            if o.kept:
                fresh.append(_Group(b.select(o.rows), st.gen_version, idx))
                kept_now += 1
        return kept_now

    def _take_from_pool(self, fresh: list[_Group], exhausted: str | None, st: _Stats) -> SampledStep:
        """The step's batch from the carried and the fresh groups (oldest first); the rest stays in
        the pool (``carry_over``) or is dropped."""
        cfg = self.cfg
        B = self.train_batch_size
        self._recheck_pool(st)
        carried = len(self.pool)
        groups = self.pool + fresh  # oldest first: carried groups are used before they expire
        if exhausted == "skip" or (exhausted == "train" and not groups):
            if cfg.carry_over:
                self.pool = groups  # nothing is lost; staleness still bounds their use
            else:
                st.surplus_dropped += len(groups)
                self.pool = []
            return SampledStep(None, "skip")
        take, rest = groups[:B], groups[B:]
        if cfg.carry_over:
            self.pool = rest
        else:
            st.surplus_dropped += len(rest)
            self.pool = []
        st.carried_in = min(carried, len(take))
        batch = Batch.concat([g.batch for g in take])
        return SampledStep(self._with_staleness(batch, self.version), "train")

    def _recheck_pool(self, st: _Stats) -> None:
        """Drop the carried groups whose prompt this step's groups found solved (or unsolvable).
        Run after every round or streamed group, so the groups still needed are generated in
        the same step rather than the batch coming up short."""
        rechecked = [g for g in self.pool if not self._solved_since(g)]
        st.recheck_dropped += len(self.pool) - len(rechecked)
        self.pool = rechecked

    def _round_size(self, need: int) -> int:
        cfg = self.cfg
        if not cfg.adaptive_rounds or self.kept_rate is None:
            return self.gen_batch_size
        rate = max(self.kept_rate, 0.02)
        k = math.ceil(need * (1.0 + cfg.round_margin) / rate)
        return int(min(self.gen_batch_size, max(cfg.min_round_size, k)))

    def _draw(self, source, k: int) -> tuple[list[dict], int]:
        """k prompts to roll out, skipping candidates from the history. Terminates: a prompt drawn
        again with nothing rolled out since its previous draw in this call (a whole pass skipped)
        makes the skipped prompt likeliest to spread a rollout."""
        sc = self.cfg.skip
        # skip_prob is the streak rule's controller; the posterior rule decides per prompt, and a
        # well-predicted run (filtered fraction below skip.target) must not switch it off
        if not self._skipping() or (sc.rule == "streak" and self.skip_prob <= 0):
            return source.take(k), 0
        prob = min(self.skip_prob, sc.max_prob)
        max_updates = math.ceil(sc.revisit_epochs * len(self.history) / self.train_batch_size)
        # exploring rollouts: max_explore * k in expectation at most, whatever the draws per round
        budget = math.floor(sc.max_explore * k + self.rng.random()) if sc.rule == "posterior" else 0
        chosen: list[dict] = []
        skipped = 0
        passed: dict[int, dict] = {}  # skipped since the last rolled-out prompt
        while len(chosen) < k:
            for row in source.take(k - len(chosen)):
                idx = None if row.get("index") is None else int(row["index"])
                if idx in passed:  # the same version judged it: it is skipped again
                    best = min(passed, key=lambda i: self.history.zero_spread_prob(i, self.version, self.n))
                    chosen.append(passed.pop(best) if best != idx else row)
                    passed = {} if best == idx else {idx: row}
                    continue
                self.history.explored = False
                if idx is not None and self._should_skip(idx, prob, max_updates, budget > 0):
                    skipped += 1
                    passed[idx] = row
                else:
                    chosen.append(row)
                    passed = {}
                    budget -= self.history.explored
        return chosen, skipped

    def _should_skip(self, idx: int, prob: float, max_updates: int, explore: bool) -> bool:
        sc = self.cfg.skip
        if sc.rule == "posterior":
            return self.history.should_skip_posterior(
                idx,
                prob=sc.threshold,
                max_prob=sc.max_prob,
                max_updates=max_updates,
                version=self.version,
                n=self.n,
                rng=self.rng,
                explore=explore,
            )
        return self.history.should_skip(
            idx,
            prob=prob,
            min_streak=sc.min_streak,
            max_updates=max_updates,
            version=self.version,
            rng=self.rng,
        )

    def _solved_since(self, g: _Group) -> bool:
        """A carried group whose prompt's newer groups say the next one would have no spread."""
        sc = self.cfg.skip
        if not self._skipping() or sc.rule != "posterior" or g.index is None or sc.recheck >= 1:
            return False
        rec = self.history.get(g.index)
        if rec is None or rec.version <= g.version:  # no evidence newer than the group itself
            return False
        return self.history.zero_spread_prob(g.index, self.version, self.n) >= sc.recheck

    def _adapt(self, generated: int, kept: int) -> None:
        if generated <= 0:
            return
        cfg = self.cfg
        rate = kept / generated
        a = cfg.kept_rate_ema
        self.kept_rate = rate if self.kept_rate is None else (1 - a) * self.kept_rate + a * rate
        if self._skipping():
            sc = cfg.skip
            # compare the smoothed filtered fraction (not one noisy round) with the target
            if 1.0 - self.kept_rate > sc.target:
                self.skip_prob = min(sc.max_prob, self.skip_prob + sc.prob_step)
            else:
                self.skip_prob = max(0.0, self.skip_prob - sc.prob_step)
        at = cfg.adaptive_threshold
        if at.enable and cfg.filter_rule == "band":
            self.band_half = max(at.min_width / 2, self.band_half - at.rate * (rate - at.target))

    # ------------------------------------------------------------------ metrics

    def _metrics(self, st: _Stats, step: SampledStep, source) -> dict[str, float]:
        trained_groups = step.num_groups
        trained_tokens = _response_tokens(step.batch) if step.batch is not None else 0.0
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
            P + "surplus_carried": sum(1 for _ in self.pool),
            P + "surplus_dropped": st.surplus_dropped + st.stale_dropped + st.recheck_dropped,
            P + "stale_dropped": st.stale_dropped,
            P + "recheck_dropped": st.recheck_dropped,
            P + "qualified_ratio": st.kept / st.generated_groups if st.generated_groups else 0.0,
            P + "generated_groups_per_trained_group": (
                st.generated_groups / trained_groups if trained_groups else 0.0
            ),
            P + "gen_tokens_per_train_token": (
                st.generated_tokens / trained_tokens if trained_tokens else 0.0
            ),
            P + "generated_response_tokens": st.generated_tokens,
            P + "trained_response_tokens": trained_tokens,
            P + "skipped_step": 1.0 if step.action == "skip" else 0.0,
            P + "partial_step": (
                1.0
                if step.action == "train" and self.cfg.enable and trained_groups < self.train_batch_size
                else 0.0
            ),
            P + "shaped_metric_slip": st.shaped_slip,
            P + "round_prompts_mean": float(np.mean(st.round_sizes)) if st.round_sizes else 0.0,
            P + "skip_prob": self.skip_prob if self._skipping() else 0.0,
            P + "kept_rate_estimate": self.kept_rate if self.kept_rate is not None else 0.0,
            P + "policy_version": self.version,
        }
        acc = _generated_acc(st.groups)
        if acc is not None:
            # correct fraction over every response generated this step, kept or filtered (train/acc
            # covers the trained groups only, which filtering leaves with a better mix)
            m["train/acc_generated"] = acc
        if step.batch is not None and "staleness" in step.batch.non_tensors and len(step.batch):
            stl = np.asarray(step.batch.non_tensors["staleness"].tolist(), dtype=np.float64)
            m[P + "staleness_mean"] = float(stl.mean())
            m[P + "staleness_max"] = float(stl.max())
        else:
            m[P + "staleness_mean"] = 0.0
            m[P + "staleness_max"] = 0.0
        if self.cfg.strategy == "stream":
            m[P + "aborted_groups"] = st.aborted_groups
            m[P + "aborted_response_tokens"] = st.aborted_tokens
            m[P + "stream_refills"] = st.refills
        if self.cfg.filter_rule == "band" and self.cfg.strategy != "verl":
            lo, hi = self.band
            m[P + "band_low"] = lo
            m[P + "band_high"] = hi
        epoch = getattr(source, "epoch", None)
        if isinstance(epoch, int):
            m[P + "epoch"] = epoch
        return m

    def _skipping(self) -> bool:
        return bool(self.cfg.enable and self.cfg.strategy != "verl" and self.cfg.skip.enable)

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """Everything needed for an exact resume: JSON-able apart from the pool's tensors (which a
        checkpoint stores in a binary file) when the rows' non-tensor values are."""
        return {
            "version": self.version,
            "calls": self.calls,
            "uid_counter": self.uid_counter,
            "rng": self.rng.bit_generator.state,
            "kept_rate": self.kept_rate,
            "skip_prob": self.skip_prob,
            "band": [self.band_center, self.band_half],
            "history": self.history.state_dict(),
            "pool": [
                {"version": g.version, "index": g.index, "batch": batch_to_state(g.batch)} for g in self.pool
            ],
            "warned": sorted(self._warned),
        }

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.version = int(d["version"])
        self.calls = int(d["calls"])
        self.uid_counter = int(d["uid_counter"])
        self.rng = np.random.Generator(np.random.PCG64())
        self.rng.bit_generator.state = d["rng"]
        self.kept_rate = None if d["kept_rate"] is None else float(d["kept_rate"])
        self.skip_prob = float(d["skip_prob"])
        self.band_center, self.band_half = (float(x) for x in d["band"])
        self.history = self._new_history(d["history"])
        self.pool = [_Group(batch_from_state(g["batch"]), int(g["version"]), g["index"]) for g in d["pool"]]
        self._warned = set(d.get("warned", []))


def _plain(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    return v


def batch_to_state(b: Batch) -> dict[str, Any]:
    """A Batch as plain data: tensors stay tensors (checkpoints store them in a binary file),
    non-tensor columns become lists."""
    return {
        "tensors": {k: t.detach().cpu() for k, t in b.tensors.items()},
        "non_tensors": {k: [_plain(x) for x in v.tolist()] for k, v in b.non_tensors.items()},
    }


def batch_from_state(d: dict[str, Any]) -> Batch:
    tensors = {k: _tensor_from_state(t) for k, t in d["tensors"].items()}
    return Batch(tensors=tensors, non_tensors={k: list(v) for k, v in d["non_tensors"].items()})


def _tensor_from_state(t: Any) -> torch.Tensor:
    if isinstance(t, torch.Tensor):
        return t
    # the earlier JSON form: {"dtype", "shape", "data"}
    return torch.tensor(t["data"], dtype=getattr(torch, t["dtype"])).reshape(t["shape"])
