"""Generating the next step's batch in the background while this step trains
(``algorithm.filter_groups.prefetch``).

One worker thread; the batch started during step ``t`` is what step ``t + 1`` trains on. Its
generation accumulates its own :class:`GenContext`, so its phase times and round metrics are
reported with the step that trains on it, not the one that was training meanwhile. The
caller gives the thread its own copy of the weights (the optimizer updates the model in place
while it generates). A step that fails or is interrupted does not wait for the generation: it
is cancelled and stops before its next round.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from dapo.outputs.profiling import Timer
from dapo.sampling.batch_state import batch_from_state, batch_to_state
from dapo.sampling.strategies.base import SampledStep


@dataclass
class GenContext:
    """What generating one step's batch accumulates: phase times and round metrics. Each step's
    generation has its own, so a batch prefetched while the previous step trains keeps its
    numbers apart from that step's."""

    timer: Timer = field(default_factory=Timer)
    round_metrics: dict[str, float] = field(default_factory=dict)
    reward_extra_keys: list[str] = field(default_factory=list)  # the scorer's extra columns
    # the latest round's scored groups: a step that trains nothing dumps them to show why
    last_round: Any = None

    def add(self, key: str, value: float) -> None:
        self.round_metrics[key] = self.round_metrics.get(key, 0.0) + float(value)


class PrefetchCancelled(Exception):
    """Raised inside a cancelled background generation at its next round."""


class Prefetcher:
    """At most one background generation in flight; its result (or its error) is kept for the next
    step. With ``enabled`` false it never starts one and holds nothing."""

    def __init__(self, enabled: bool):
        import torch

        self.enabled = enabled
        # the worker generates with the trainer's thread count: a new thread starts at the
        # machine's default, and vLLM's CPU attention refuses a forward pass whose thread count
        # differs from the one its metadata was built with
        threads = torch.get_num_threads()
        self._executor = (
            ThreadPoolExecutor(
                max_workers=1,
                thread_name_prefix="dapo-prefetch",
                initializer=torch.set_num_threads,
                initargs=(threads,),
            )
            if enabled
            else None
        )
        self._pending: tuple[Future, GenContext] | None = None
        self._cancel = threading.Event()
        self.ready: tuple[SampledStep, GenContext] | None = None
        self.error: BaseException | None = None

    def take(self) -> tuple[SampledStep, GenContext] | None:
        """The finished batch and its context, once; None when there is none."""
        ready, self.ready = self.ready, None
        return ready

    def start(self, generate: Callable[[GenContext], SampledStep]) -> bool:
        """Run ``generate`` with a fresh context on the worker thread; False when disabled."""
        if self._executor is None:
            return False
        ctx = GenContext()
        # each generation its own flag: a later start must not revive a cancelled one
        self._cancel = threading.Event()
        self._pending = (self._executor.submit(generate, ctx), ctx)
        return True

    def guard(self, round_fn: Callable[..., Any]) -> Callable[..., Any]:
        """``round_fn`` that refuses to start once the generation it belongs to (the latest
        started when this is called) is cancelled."""
        cancelled = self._cancel

        def guarded(*args: Any, **kwargs: Any) -> Any:
            if cancelled.is_set():
                raise PrefetchCancelled("the step that started this generation failed or was interrupted")
            return round_fn(*args, **kwargs)

        return guarded

    def cancel(self) -> None:
        """Give up the generation in flight without waiting: it stops before its next round (a
        round already on the engine runs to its end) and nothing of it is kept."""
        self._cancel.set()
        self._pending = None

    def wait(self) -> None:
        """Wait for the generation in flight (if any) and keep its batch, or its error in ``error``."""
        if self._pending is None:
            return
        future, ctx = self._pending
        self._pending = None
        # exception() waits like result() (a KeyboardInterrupt during the wait propagates) but
        # hands back the thread's own error, which the caller raises once the step is logged
        err = future.exception()
        if err is None:
            self.ready = (future.result(), ctx)
        else:
            self.error = err

    def state_dict(self) -> dict[str, Any] | None:
        if self.ready is None:
            return None
        sampled, ctx = self.ready
        return {
            "action": sampled.action,
            "batch": None if sampled.batch is None else batch_to_state(sampled.batch),
            "metrics": sampled.metrics,
            "group_records": sampled.group_records,
            "timer": ctx.timer.raw,
            "round_metrics": ctx.round_metrics,
            "reward_extra_keys": ctx.reward_extra_keys,
        }

    def load_state_dict(self, d: dict[str, Any] | None) -> None:
        if d is None:
            self.ready = None
            return
        batch = None if d["batch"] is None else batch_from_state(d["batch"])
        sampled = SampledStep(batch, d["action"], dict(d["metrics"]), list(d["group_records"]))
        ctx = GenContext(Timer(dict(d["timer"])), dict(d["round_metrics"]), list(d["reward_extra_keys"]))
        self.ready = (sampled, ctx)

    def shutdown(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
