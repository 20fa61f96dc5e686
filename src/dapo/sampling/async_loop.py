"""Dynamic sampling inside async training (``async_training.mode=colocate_async | separate_async``).

Three threads share the work. The generation thread (the rollout side's engine worker) only
decodes. This module's scoring thread takes finished groups from it, scores them (so the engine
never idles on a reward), filters them into the batcher's pool (``default``'s filter, pool,
skip policy and kept-rate estimate, state the checkpoint already saves) and keeps the engine
fed with new prompts. The trainer's thread takes each batch from the pool (:meth:`next_batch`)
and, after its update, moves the policy version on (:meth:`advance`).

Batches are taken in launch order: a batch is the earliest-launched ``train_batch_size`` kept
groups, and the trainer waits while a group launched before them is still decoding. Taking
whatever finished first would train preferentially on short responses (a group finishes when
its longest sample does), and the long groups overtaken that way would then age past the bound
and be dropped.

The staleness of a group is the number of policy updates between its oldest token and the
update that trains it. No group is trained beyond ``max_off_policy_threshold``: at every
version change, pooled groups and groups still decoding that can no longer make it are dropped
(counted). ``max_off_policy_strategy`` says what generation does meanwhile: ``drop`` never pauses
(the engine keeps decoding; new prompts stop once the pool and the groups in flight cover
``max(max_off_policy_threshold, 1)`` batches), ``wait`` pauses decoding once the pool holds that many batches ready to train (launched before
every group still decoding) and resumes when the trainer takes one, so fewer groups expire.

The round budget: ``max_num_gen_batches > 0`` bounds the prompts launched for one batch to that
many ``data.gen_batch_size``; once they are spent and none is in flight the trainer gets what
``on_exhausted`` says (train on fewer groups, skip the step, or stop with verl's error), so a
pool where every group is filtered ends in skipped steps, never in a loop that does not return.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import numpy as np

from dapo.batch import Batch
from dapo.sampling.coverage import coverage_metrics
from dapo.sampling.pool import Group
from dapo.sampling.skip import PromptSource
from dapo.sampling.step_stats import StepStats, step_metrics
from dapo.sampling.strategies.base import SampledStep, Sampler
from dapo.sampling.stream import stream_refill

A = "async/"
LAUNCH_SEQ = "launch_seq"  # per row: the launch position of its group
DROP, WAIT = "drop", "wait"


class GroupEngine(Protocol):
    """The generation side as this loop sees it (``dapo.rollout.partial.EngineWorker``)."""

    finished: queue.Queue  # finished groups (``.key`` is the key they were submitted with), or an error

    def submit(self, key: Any, prompt: list[int]) -> None: ...

    def drop(self, keys: list[Any]) -> None: ...

    def oldest_versions(self) -> dict[Any, int]: ...

    def hold(self, on: bool) -> None: ...


FinishFn = Callable[[list[dict], list[Any]], Batch]


class AsyncSampler:
    """The scoring thread and the trainer's side of async dynamic sampling over ``sampler``.

    ``finish(rows, groups)`` packs and scores finished groups into a batch (``n`` rows per group,
    interleaved) that carries ``token_versions`` ``[rows, R]`` (the policy version of each
    token, -1 on padding)."""

    def __init__(
        self,
        sampler: Sampler,
        source: PromptSource,
        engine: GroupEngine,
        finish: FinishFn,
        *,
        max_off_policy_threshold: int,
        max_off_policy_strategy: str,
    ) -> None:
        if max_off_policy_strategy not in (DROP, WAIT):
            raise ValueError(f"max_off_policy_strategy must be drop or wait, got {max_off_policy_strategy!r}")
        self.s, self.source, self.engine, self.finish = sampler, source, engine, finish
        self.k, self.action = int(max_off_policy_threshold), max_off_policy_strategy
        self.cv = threading.Condition(threading.RLock())
        self._new_step()
        self._rows: dict[int, dict] = {}  # key (launch position) -> prompt row, groups in flight
        self._launch_version: dict[int, int] = {}  # key -> policy version when launched
        # after a resume the pooled groups keep their launch positions: new ones come after them;
        # a checkpoint from before positions were kept has none, and its groups go first
        for g in sampler.pool:
            if LAUNCH_SEQ not in g.batch.non_tensors:
                g.batch[LAUNCH_SEQ] = np.full(len(g.batch), -1, dtype=object)
        self._next_key = 1 + max((launch_seq(g) for g in sampler.pool), default=-1)
        self.error: BaseException | None = None
        self._stop = False
        self.totals = {"dropped_in_flight": 0, "expired_pooled": 0}
        self._thread = threading.Thread(target=self._run, name="dapo-scoring", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ the trainer's side

    @property
    def lead_batches(self) -> int:
        """Batches the pool and the groups launched since the latest update aim to hold ahead
        of the trainer. The bound would let current groups in ``k + 1`` batches be trained
        (staleness 0 to ``k``), but a group finishes an update or more after its first token,
        so the last of them would expire before its turn: one batch is left to that latency."""
        return max(self.k, 1)

    @property
    def max_in_flight(self) -> int:
        """Groups in flight at most: a generation batch for each policy version whose groups can
        still be trained (the current one and ``max_off_policy_threshold`` before it)."""
        return self.s.gen_batch_size * (self.k + 1)

    def ready(self) -> int:
        """Pooled groups launched before every group still decoding: the next batch is taken
        from these, so it never depends on which groups finished first."""
        first = min(self._rows, default=None)
        return sum(1 for g in self.s.pool if first is None or launch_seq(g) < first)

    def next_batch(self) -> SampledStep:
        """The next training batch: the ``train_batch_size`` earliest-launched pooled groups, once
        no group launched before them is still decoding, or what ``on_exhausted`` says once the
        round budget is spent."""
        s, B = self.s, self.s.train_batch_size
        t0 = time.perf_counter()
        with self.cv:
            while self.ready() < B and not self._exhausted and self.error is None:
                self.cv.wait(0.5)
            if self.error is not None:
                raise self.error
            st, exhausted = self.st, None
            s.pool.groups.sort(key=launch_seq)
            if len(s.pool) < B:
                exhausted = s.exhausted(st, len(s.pool), verl=False)
            step = s.take([], exhausted, st)
            s.calls += 1
            step.metrics.update(self._metrics(st, step, time.perf_counter() - t0))
            step.group_records = st.groups
            self._new_step()
            self.cv.notify_all()
        return step

    def advance(self) -> int:
        """After the update: the policy version moves on; what can no longer be trained within
        the bound is dropped. Returns the new version (the weights to publish)."""
        with self.cv:
            self.s.version += 1
            self._expire()
            self.cv.notify_all()
            return self.s.version

    @contextmanager
    def locked(self) -> Iterator[None]:
        """No scoring-thread change to the batcher's state inside (a checkpoint saves it)."""
        with self.cv:
            yield

    def close(self) -> None:
        with self.cv:
            self._stop = True
            self.cv.notify_all()
        self._thread.join(timeout=60)

    # ------------------------------------------------------------ the scoring thread

    def _new_step(self) -> None:
        self.s.skip.new_step()  # the per-step skip state, as the sync batcher resets it
        self.st = StepStats(gen_version=self.s.version)
        self._launched = 0  # prompts launched for the batch being collected
        self._exhausted = False

    def _budget(self) -> int | None:
        k_max = self.s.cfg.max_num_gen_batches
        return k_max * self.s.gen_batch_size if self.s.cfg.enable and k_max > 0 else None

    def _refill(self) -> None:
        s, B = self.s, self.s.train_batch_size
        target = B * self.lead_batches
        have = len(s.pool)
        if self.action == WAIT:
            # never while the trainer waits for a group still decoding
            self.engine.hold(self.ready() >= target)
        rate = s.kept_rate if s.cfg.enable else 1.0
        # the groups launched before the latest update are the long tail, decoding on: they do not
        # hold back the prompts the next batches need (or a tail longer than the bound would
        # starve the trainer, and with it the update that expires the tail)
        young = sum(1 for v in self._launch_version.values() if v == s.version)
        want = stream_refill(target - have, young, s.gen_batch_size, rate, s.cfg.round_margin)
        # but never more in flight than the versions the bound can still train launch: a group
        # queued in the engine has no token yet, so it never expires, and an engine that falls
        # behind would otherwise collect another gen_batch_size of them at every update
        want = min(want, self.max_in_flight - len(self._rows))
        budget = self._budget()
        if budget is not None:
            want = min(want, budget - self._launched)
        if want > 0:
            rows, skipped = s.skip.draw(self.source, want, s.version)
            self.st.skipped_prompts += skipped
            for r in rows:
                key = self._next_key  # a group's key is its launch position
                self._next_key += 1
                self._rows[key] = r
                self._launch_version[key] = s.version
                self.engine.submit(key, r["prompt_ids"])
            self._launched += len(rows)
            self.st.round_sizes.append(len(rows))
            self.st.rounds = -(-self._launched // s.gen_batch_size)
        if budget is not None and self._launched >= budget and not self._rows and have < B:
            self._exhausted = True
            self.cv.notify_all()

    def _expire(self) -> None:
        """Drop what would be trained beyond the bound: pooled groups, and groups in flight
        whose oldest token is already too old."""
        s = self.s
        before = len(s.pool)
        s.pool.drop_stale(s.version, self.k, self.st)
        self.totals["expired_pooled"] += before - len(s.pool)
        late = [key for key, v in self.engine.oldest_versions().items() if s.version - v > self.k]
        late = [key for key in late if key in self._rows]
        if late:
            self.engine.drop(late)
            for key in late:
                self._rows.pop(key)
                self._launch_version.pop(key)
            self.st.aborted_groups += len(late)
            self.st.generated_groups += len(late)
            self.totals["dropped_in_flight"] += len(late)

    def _run(self) -> None:
        try:
            while True:
                with self.cv:
                    if self._stop:
                        return
                    self._refill()
                try:
                    first = self.engine.finished.get(timeout=0.2)
                except queue.Empty:
                    continue
                got = [first]
                while True:  # score everything that is ready in one call
                    try:
                        got.append(self.engine.finished.get_nowait())
                    except queue.Empty:
                        break
                for g in got:
                    if isinstance(g, BaseException):
                        raise g
                with self.cv:
                    got = [g for g in got if g.key in self._rows]  # dropped meanwhile: not ours
                    rows = [self._rows[g.key] for g in got]
                if not got:
                    continue
                b = self.finish(rows, got)  # scoring: outside the lock, off the generation thread
                with self.cv:
                    live = [i for i, g in enumerate(got) if self._rows.pop(g.key, None) is not None]
                    for g in got:
                        self._launch_version.pop(g.key, None)
                    if len(live) < len(got):  # some expired while being scored
                        n = self.s.n
                        b = b.select(np.concatenate([np.arange(i * n, (i + 1) * n) for i in live]))
                        rows = [rows[i] for i in live]
                    if rows:
                        self._add(rows, b, [got[i].key for i in live])
                    self.cv.notify_all()
        except BaseException as e:
            with self.cv:
                self.error = e
                self.cv.notify_all()

    def _add(self, rows: list[dict], b: Batch, seqs: list[int]) -> None:
        s, st = self.s, self.st
        b = s.tag(rows, b, st)
        versions = b.tensors["token_versions"]
        n = s.n
        b[LAUNCH_SEQ] = np.repeat(np.asarray(seqs, dtype=object), n)
        oldest = np.empty(len(b), dtype=object)
        for i in range(len(rows)):
            v = versions[i * n : (i + 1) * n]
            live = v[v >= 0]
            oldest[i * n : (i + 1) * n] = int(live.min()) if live.numel() else s.version
        b["gen_version"] = oldest
        fresh: list[Group] = []
        if s.cfg.enable:
            kept = s.filter_into(b, st, fresh)
        else:
            st.record(b, None)
            index = b.non_tensors["index"]
            fresh = [
                Group(b.select(r), 0, None if index[r[0]] is None else int(index[r[0]]))
                for _, r in b.group_slices("uid")
            ]
            st.kept += len(fresh)
            kept = len(fresh)
        for g in fresh:
            g.version = int(g.batch.non_tensors["gen_version"][0])
        s.pool.groups.extend(fresh)
        s.adapt(len(rows), kept)
        before = len(s.pool)
        s.pool.drop_stale(s.version, self.k, st)  # a group that took too long to finish
        self.totals["expired_pooled"] += before - len(s.pool)

    def _metrics(self, st: StepStats, step: SampledStep, waited_s: float) -> dict[str, float]:
        s = self.s
        m = step_metrics(
            st,
            step.batch,
            step.action,
            target=s.train_batch_size if s.cfg.enable else None,
            pooled=len(s.pool),
            skip_prob=s.skip.metric_prob(),
            kept_rate=s.kept_rate,
            version=s.version,
            stream=True,
            band=s.band if s.cfg.filter_rule == "band" else None,
            epoch=getattr(self.source, "epoch", None),
        )
        if s.cfg.enable:
            m.update(
                coverage_metrics(
                    rolled_out=len(s.skip.history),
                    trained_counts=s.trained_counts.values(),
                    skipped_with_spread=len(s.skip.spread_skips),
                    pool_size=len(self.source) if hasattr(self.source, "__len__") else None,
                )
            )
        m[A + "policy_version"] = float(s.version)
        m[A + "wait_for_batch_s"] = float(waited_s)
        m[A + "in_flight_groups"] = float(len(self._rows))
        m[A + "dropped_in_flight_groups_total"] = float(self.totals["dropped_in_flight"])
        m[A + "expired_pooled_groups_total"] = float(self.totals["expired_pooled"])
        m.update(version_metrics(step.batch, s.n))
        return m


def launch_seq(g: Group) -> int:
    """Where ``g`` was launched among the async groups (-1: pooled before positions were kept)."""
    return int(g.batch.non_tensors[LAUNCH_SEQ][0])


def version_metrics(b: Batch | None, n: int) -> dict[str, float]:
    """Per trained batch: its groups' staleness (mean, max), the oldest and newest token version,
    and how many groups hold tokens of more than one policy version (partial rollouts)."""
    if b is None or len(b) == 0:
        return {}
    v = b.tensors["token_versions"]
    live = v >= 0
    stale = np.asarray([int(x) for x in b.non_tensors["staleness"]], dtype=float)
    spans = []
    for g in range(len(b) // n):
        gv = v[g * n : (g + 1) * n][live[g * n : (g + 1) * n]]
        spans.append(int(gv.max() - gv.min()) if gv.numel() else 0)
    return {
        A + "staleness_mean": float(stale.mean()),
        A + "staleness_max": float(stale.max()),
        A + "min_token_version": float(v[live].min()) if live.any() else -1.0,
        A + "max_token_version": float(v[live].max()) if live.any() else -1.0,
        A + "partial_groups": float(sum(1 for x in spans if x > 0)),
        A + "version_span_max": float(max(spans)),
    }
