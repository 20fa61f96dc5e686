"""Streaming dynamic sampling (``algorithm.filter_groups.strategy=stream``): the engine side's
interface and the refill rule. The strategy itself is :mod:`dapo.sampling.strategies.stream`.

A :class:`GroupStream` holds groups (one prompt, ``n`` samples) in flight on an engine. The batcher
submits prompts and takes groups back as they finish (already scored); once the batch is full it
submits nothing more and takes back the rest. ``abort`` empties the stream when a step fails;
the tokens the aborted groups had generated are reported, so the metrics count all the work the
engine did.
"""

from __future__ import annotations

import math
from typing import Protocol

from dapo.batch import Batch


class GroupStream(Protocol):
    @property
    def in_flight(self) -> int:
        """Groups submitted and neither finished nor aborted."""
        ...

    def submit(self, rows: list[dict]) -> None:
        """Start one group of ``n`` samples per row."""
        ...

    def wait(self) -> tuple[list[dict], Batch]:
        """Block until at least one group in flight has all its samples; the finished groups'
        rows (in submission order) and their scored trajectories (``n`` per row, interleaved)."""
        ...

    def abort(self) -> tuple[int, float]:
        """Abort every group in flight: how many there were and the response tokens they had
        generated."""
        ...


def stream_refill(need: int, in_flight: int, capacity: int, rate: float | None, margin: float) -> int:
    """How many new groups to submit when ``need`` more kept groups are wanted and ``in_flight``
    are running.

    The groups in flight should be expected to bring ``need * (1 + margin)`` kept groups:
    ``ceil(need * (1 + margin) / rate)`` in flight, with the rate floored at 0.02 and taken as 1
    when there is no estimate yet (optimistic: filtered groups are replaced as they finish, while
    every group still running when the batch is full is wasted work). Never more than
    ``capacity`` in flight, and never none while groups are needed (so the step cannot stall).
    """
    if need <= 0:
        return 0
    r = 1.0 if rate is None else max(rate, 0.02)
    target = min(capacity, max(1, math.ceil(need * (1.0 + margin) / r)))
    want = max(0, target - in_flight)
    return max(want, 1) if in_flight == 0 else want
