"""A step-time model of RL post-training: pure functions, no measurement (``dapo bench cluster``
calibrates and uses them).

An engine step decodes one token for each of ``rows`` sequences whose contexts sum to ``ctx``;
what it costs is the engine's :class:`StepCost` (``LinearCost``: fitted on this machine's runs,
``RooflineCost``: a GPU's published bandwidth and FLOP/s). :func:`decode_time` runs a round's
sequences through an engine step by step, analytically between finishes: all at once and
shrinking as they finish (a round), or at most ``max_rows`` at a time with the next sequence
entering as a row frees (continuous batching; what a stream's refill does). A round therefore
costs about its longest response in steps, not its token count. :func:`full_engine_time` is an
engine that never drains: every step has ``max_rows`` rows, as when unfinished requests carry on
into the next step (partial rollouts). Updates cost FLOPs per trained token
(:func:`update_time`), a weight sync its bytes over a bandwidth.

:func:`predict_step` puts them together per strategy from a step's workload (the responses each
round generates, the tokens trained). What the model leaves out is listed in docs/results.md.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

STRATEGIES = ("verl", "default", "stream", "one_step_off", "async_partial")


class StepCost(Protocol):
    def step(self, rows: int, ctx: float) -> float:
        """Seconds of one decode step of ``rows`` sequences whose contexts sum to ``ctx`` tokens."""
        ...

    def prefill(self, tokens: float) -> float:
        """Seconds to prefill ``tokens`` prompt tokens."""
        ...


@dataclass(frozen=True)
class LinearCost:
    """``step_s + row_s * rows + ctx_s * ctx`` a step; ``prefill_s`` a prompt token."""

    step_s: float
    row_s: float
    ctx_s: float = 0.0
    prefill_s: float = 0.0

    def step(self, rows: int, ctx: float) -> float:
        return self.step_s + self.row_s * rows + self.ctx_s * ctx

    def prefill(self, tokens: float) -> float:
        return self.prefill_s * tokens


@dataclass(frozen=True)
class Model:
    """The shape the costs need: parameters (all and active per token, for a mixture of
    experts), layers and model width (attention FLOPs), KV-cache bytes per token."""

    name: str
    params: float
    active_params: float
    layers: int
    d_model: int
    kv_bytes_per_token: float
    weight_bytes: float = 2.0  # bf16


@dataclass(frozen=True)
class Gpu:
    name: str
    peak_flops: float  # dense bf16, FLOP/s
    hbm_bytes_s: float  # memory bandwidth, bytes/s


@dataclass(frozen=True)
class RooflineCost:
    """One inference engine of ``tp`` GPUs: a decode step reads the weights (all of them: with
    hundreds of rows every expert is hit) and the rows' KV cache at ``bw_eff`` of the bandwidth,
    or computes ``2 * active_params`` FLOPs a row at ``decode_mfu`` of the peak, whichever is
    longer, plus ``overhead_s`` (scheduling, sampling, kernel launches). Prefill is compute:
    ``2 * active_params`` a token at ``prefill_mfu``."""

    model: Model
    gpu: Gpu
    tp: int
    bw_eff: float = 0.6
    decode_mfu: float = 0.3
    prefill_mfu: float = 0.4
    overhead_s: float = 0.004

    def step(self, rows: int, ctx: float) -> float:
        m, g = self.model, self.gpu
        read = (m.params * m.weight_bytes + ctx * m.kv_bytes_per_token) / (
            self.tp * g.hbm_bytes_s * self.bw_eff
        )
        compute = 2 * m.active_params * rows / (self.tp * g.peak_flops * self.decode_mfu)
        return max(read, compute) + self.overhead_s

    def prefill(self, tokens: float) -> float:
        return 2 * self.model.active_params * tokens / (self.tp * self.gpu.peak_flops * self.prefill_mfu)


def decode_time(
    lengths: Sequence[int], prompt_len: float, cost: StepCost, max_rows: int | None = None
) -> float:
    """Seconds to decode sequences of these response ``lengths`` (after prompts of ``prompt_len``
    tokens) on one engine: all at once, or ``max_rows`` at a time in the given order with the next
    one entering when a row frees. Between two finishes the rows are fixed and every context grows
    by one token a step, so a span of ``k`` steps costs ``k`` steps at its middle context (exact
    for a cost linear in the context)."""
    queue = deque(int(x) for x in lengths if x > 0)
    cap = len(queue) if max_rows is None else max(1, int(max_rows))
    active: list[tuple[int, int]] = []  # (step it finishes at, step it entered at)
    t, total, starts = 0, 0.0, 0

    def fill() -> None:
        nonlocal starts
        while queue and len(active) < cap:
            heapq.heappush(active, (t + queue.popleft(), t))
            starts += t

    fill()
    while active:
        k = active[0][0] - t
        b = len(active)
        ctx = b * (prompt_len + t) - starts  # the rows' contexts at step t
        total += k * cost.step(b, ctx + b * (k - 1) / 2)
        t += k
        while active and active[0][0] == t:
            starts -= heapq.heappop(active)[1]
        fill()
    return total


def full_engine_time(lengths: Sequence[int], prompt_len: float, cost: StepCost, rows: int) -> float:
    """Seconds to generate the tokens of ``lengths`` on an engine that always has ``rows`` rows
    (unfinished sequences carry over, so no step runs short): ``sum(lengths) / rows`` steps at
    the mean context of a generated token, ``prompt_len + E[L (L - 1)] / (2 E[L])`` (the context
    before each token, as in :func:`decode_time`)."""
    L = np.asarray([x for x in lengths if x > 0], dtype=np.float64)
    if not len(L):
        return 0.0
    steps = L.sum() / rows
    mean_ctx = prompt_len + float((L * (L - 1)).sum() / (2 * L.sum()))
    return steps * cost.step(rows, rows * mean_ctx)


def update_time(
    tokens: float, seq_len: float, model: Model, gpus: int, gpu: Gpu, mfu: float, passes: float = 4.0
) -> float:
    """Seconds for the trained tokens' old log-probs (one forward) and the update (forward and
    backward, about three): ``passes`` forwards of ``2 * active_params`` FLOPs a token plus
    causal attention (``2 * layers * d_model * seq_len`` a token for a forward over sequences of
    ``seq_len``), on ``gpus`` GPUs at ``mfu`` of the peak."""
    per_token = 2 * model.active_params + 2 * model.layers * model.d_model * seq_len
    return passes * per_token * tokens / (gpus * gpu.peak_flops * mfu)


@dataclass
class Workload:
    """One training step's generation and training, as the strategies see it.

    ``rounds``: per generation round, the response lengths of every sequence it generates
    (``verl`` and ``default`` run them one after another); ``stream``: the sequences a stream
    launches in the step, in draw order; ``steady``: the sequences whose tokens an engine that
    never drains must generate per step (``async_partial``). ``engines``: inference engines the
    sequences are spread over, ``rows``: most rows an engine decodes at once.
    """

    rounds: dict[str, list[list[int]]]
    prompt_len: float
    engines: int
    rows: int
    train_s: float  # old log-probs and update of the step's trained tokens, on all devices
    sync_s: float  # weight sync after the update
    stream: list[int] = field(default_factory=list)
    steady: list[int] = field(default_factory=list)
    gen_share: float = 0.5  # one_step_off / separate placement: the devices' share that generates
    other_s: float = 0.0  # per step: reward, advantages, logging (measured; 0 on the GPU picture)


@dataclass(frozen=True)
class StepTimes:
    gen_s: float
    train_s: float
    sync_s: float
    wall_s: float


def _spread(lengths: Sequence[int], engines: int) -> list[list[int]]:
    """Round-robin over the engines, as a load balancer hands out requests."""
    return [list(lengths[i::engines]) for i in range(engines)]


def round_time(lengths: Sequence[int], w: Workload, cost: StepCost, max_rows: int | None) -> float:
    """A round on ``w.engines`` engines: the slowest engine's decode plus its prefill."""
    if not len(lengths):
        return 0.0
    per = _spread(lengths, w.engines)
    return max(
        decode_time(p, w.prompt_len, cost, max_rows) + cost.prefill(len(p) * w.prompt_len) for p in per
    )


def gen_time(strategy: str, w: Workload, cost: StepCost) -> float:
    """Generation seconds of one step on all of ``w.engines``."""
    if strategy in ("verl", "default", "one_step_off"):
        key = "verl" if strategy == "verl" else "default"
        return sum(round_time(r, w, cost, w.rows) for r in w.rounds[key])
    if strategy == "stream":
        return round_time(w.stream, w, cost, w.rows)
    if strategy == "async_partial":
        per = _spread(w.steady, w.engines)
        return max(
            full_engine_time(p, w.prompt_len, cost, min(w.rows, max(1, len(p))))
            + cost.prefill(len(p) * w.prompt_len)
            for p in per
        )
    raise ValueError(f"unknown strategy {strategy!r}; one of {', '.join(STRATEGIES)}")


def predict_step(strategy: str, w: Workload, cost: StepCost, separate: bool = False) -> StepTimes:
    """Wall seconds of one step. ``verl``, ``default``, ``stream``: generation, then training, then
    the weight sync, on the same devices. ``one_step_off``: ``default``'s generation of the next
    step overlaps this step's training, generation on ``gen_share`` of the devices and training
    on the rest (``cost`` is an engine's, so generation on fewer devices is modelled by spreading
    over fewer engines). ``async_partial``: the engine never drains; colocated (``separate`` off,
    verl's ``colocate_async``) it alternates with training, separate (``separate_async``) they
    overlap on split devices as in ``one_step_off``."""
    overlap = strategy == "one_step_off" or (strategy == "async_partial" and separate)
    if not overlap:
        g = gen_time(strategy, w, cost)
        return StepTimes(g, w.train_s, w.sync_s, g + w.train_s + w.sync_s + w.other_s)
    share = w.gen_share
    fewer = Workload(**{**w.__dict__, "engines": max(1, math.floor(w.engines * share))})
    g = gen_time(strategy, fewer, cost)
    t = w.train_s / (1 - share)
    return StepTimes(g, t, w.sync_s, max(g, t) + w.sync_s + w.other_s)


def best_split(
    strategy: str, w: Workload, cost: StepCost, shares: Sequence[float], separate: bool = True
) -> tuple[float, StepTimes]:
    """For the strategies that split the devices: the share of them generating (among ``shares``)
    with the shortest step, and that step."""
    best = None
    for share in shares:
        t = predict_step(strategy, Workload(**{**w.__dict__, "gen_share": share}), cost, separate=separate)
        if best is None or t.wall_s < best[1].wall_s:
            best = (share, t)
    if best is None:
        raise ValueError("no device share to try")
    return best
