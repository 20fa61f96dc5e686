"""``strategy=stream``: groups go to the engine one by one (:class:`~dapo.sampling.stream.GroupStream`)
and are filtered as each finishes; the engine is refilled while the groups in flight are not
expected to fill the batch (``stream_refill``, at most ``data.gen_batch_size`` in flight).

Once enough groups are kept, nothing new is submitted and the groups still in flight are drained
(finished and filtered), never aborted; the batch is then the first ``train_batch_size`` kept
groups in draw order (carried ones first), and the rest goes to the pool. Taking the batch in
finishing order, or aborting what is still decoding, would train preferentially on short
responses: a group finishes when its longest sample does. The filter, pool, staleness bound and
skipping are ``default``'s. ``max_num_gen_batches`` bounds the prompts launched per step to that
many times ``data.gen_batch_size``; ``rounds`` counts the launched prompts in those units.
"""

from __future__ import annotations

import math
from collections import deque

from dapo.sampling.pool import Group
from dapo.sampling.skip import PromptSource
from dapo.sampling.step_stats import StepStats
from dapo.sampling.strategies.base import OnRound, SampledStep, Sampler
from dapo.sampling.stream import GroupStream, stream_refill


def step(
    s: Sampler, source: PromptSource, stream: GroupStream, st: StepStats, on_round: OnRound
) -> SampledStep:
    B = s.train_batch_size
    have = s.carried(st)
    fresh: list[Group] = []
    exhausted = None
    k_max = s.cfg.max_num_gen_batches
    budget = k_max * s.gen_batch_size if k_max > 0 else None  # prompts this step may launch
    launched = finished = kept_step = 0
    order = DrawOrder()
    try:
        while have < B:
            rate = planning_rate(s.cfg.adaptive_rounds, s.kept_rate, finished, kept_step)
            want = stream_refill(B - have, stream.in_flight, s.gen_batch_size, rate, s.cfg.round_margin)
            if budget is not None:
                want = min(want, budget - launched)
            if want > 0:
                rows, skipped = s.skip.draw(source, want, s.version)
                st.skipped_prompts += skipped
                stream.submit(rows)
                order.submitted(rows)
                launched += len(rows)
                st.round_sizes.append(len(rows))
                before, st.rounds = st.rounds, math.ceil(launched / s.gen_batch_size)
                if st.rounds // 50 > before // 50:  # unbounded and still short: say so, as default does
                    s.warn_many_rounds(st, have)
            if stream.in_flight == 0:  # the budget is spent and every launched group is in
                exhausted = s.exhausted(st, have, verl=False)
                break
            done, kept_now = _collect(s, stream, st, fresh, order)
            have = len(s.pool) + len(fresh)
            finished += done
            kept_step += kept_now
            s.report(on_round, st, have, {**s.pool_info(), "in_flight": stream.in_flight})
        while stream.in_flight:  # the batch is full: finish what was launched, launch nothing new
            done, kept_now = _collect(s, stream, st, fresh, order)
            st.drained_groups += done
            finished += done
            kept_step += kept_now
    finally:
        groups, tokens = stream.abort()  # nothing is left unless a wait raised
        st.aborted_groups += groups
        st.aborted_tokens += tokens
        st.generated_groups += groups
        st.generated_tokens += tokens
    st.refills = len(st.round_sizes)
    s.adapt(finished, kept_step)
    fresh.sort(key=order.of)
    return s.take(fresh, exhausted, st)


def _collect(
    s: Sampler, stream: GroupStream, st: StepStats, fresh: list[Group], order: DrawOrder
) -> tuple[int, int]:
    """Wait for the next finished groups, tag and filter them into ``fresh``; (finished, kept)."""
    rows, b = stream.wait()
    first_uid = s.uid_counter
    b = s.tag(rows, b, st)
    order.finished(rows, first_uid)
    return len(rows), s.filter_into(b, st, fresh)


class DrawOrder:
    """Where each group of the step was drawn, by its uid: the stream hands groups back in
    finishing order, and the batch is taken in draw order so that it does not depend on lengths."""

    def __init__(self) -> None:
        self._next = 0
        self._pending: dict[int, deque[int]] = {}  # id(row) -> draw positions, oldest first
        self._by_uid: dict[str, int] = {}

    def submitted(self, rows: list[dict]) -> None:
        for r in rows:
            self._pending.setdefault(id(r), deque()).append(self._next)
            self._next += 1

    def finished(self, rows: list[dict], first_uid: int) -> None:
        """``rows`` came back and were given the uids ``g{first_uid}``, ``g{first_uid + 1}``, ..."""
        for i, r in enumerate(rows):
            q = self._pending[id(r)]
            self._by_uid[f"g{first_uid + i}"] = q.popleft()
            if not q:
                del self._pending[id(r)]

    def of(self, g: Group) -> int:
        return self._by_uid[g.batch.non_tensors["uid"][0]]


def planning_rate(adaptive_rounds: bool, kept_rate: float | None, finished: int, kept: int) -> float | None:
    """The kept rate the refill plans with: the running estimate from earlier steps, else this
    step's groups so far on top of one kept pseudo-group (the optimistic start that
    ``stream_refill`` uses before any evidence), else unknown. ``adaptive_rounds`` off: 0,
    which keeps the engine full (``data.gen_batch_size`` groups in flight)."""
    if not adaptive_rounds:
        return 0.0
    if kept_rate is not None:
        return kept_rate
    return (kept + 1) / (finished + 1) if finished else None
