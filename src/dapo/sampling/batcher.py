"""The dynamic batcher: rounds of rollout -> group filter -> pool -> one training batch.

The batcher knows nothing about models. It sees a prompt ``source`` (``.take(k)`` returns prompt
rows, each with a stable int ``"index"``; it rolls over epochs itself; ``.epoch``) and a
``generate(rows) -> Batch`` function that rolls out and scores ``len(rows) * n`` trajectories in
interleaved order (p0r0..p0r(n-1), p1r0, ...).

Every trajectory handed back carries two extra non-tensor columns: ``gen_version`` (the number of
policy updates that had happened when it was generated) and ``staleness`` (policy updates between
generation and this training step; 0 unless the group was carried over). The sampler log-probs
(``rollout_log_probs``) travel with the group, so the update can correct for the drift.

This module is the front: it checks the config, runs one strategy per step
(:mod:`dapo.sampling.strategies`), adds the step's metrics (:mod:`dapo.sampling.step_stats`) and
saves and restores the state (the pool, :mod:`dapo.sampling.pool`; the prompt history and skip
probability, :mod:`dapo.sampling.skip`; the trained groups per prompt behind the
``dynamic_sampling/coverage/*`` figures, :mod:`dapo.sampling.coverage`, which strategies
``default`` and ``stream`` log).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from dapo.config.sampling import KEY, FilterGroupsConfig, validate
from dapo.sampling.coverage import coverage_metrics
from dapo.sampling.history import PromptHistory
from dapo.sampling.pool import GroupPool
from dapo.sampling.skip import PromptSource
from dapo.sampling.step_stats import StepStats, step_metrics
from dapo.sampling.strategies import default, unfiltered, verl
from dapo.sampling.strategies import stream as streaming
from dapo.sampling.strategies.base import (
    GenerateFn,
    GenerationBudgetExhausted,
    SampledStep,
    Sampler,
    verl_exhausted_message,
)
from dapo.sampling.stream import GroupStream

log = logging.getLogger(__name__)

__all__ = [
    "DynamicBatcher",
    "GenerateFn",
    "GenerationBudgetExhausted",
    "PromptSource",
    "SampledStep",
    "verl_exhausted_message",
]


class DynamicBatcher(Sampler):
    """One training step's batch per ``next_batch`` call, by the configured strategy; the state
    it carries between steps (:class:`~dapo.sampling.strategies.base.Sampler`) is saved whole by
    ``state_dict``."""

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
        super().__init__(cfg, train_batch_size, gen_batch_size, n, seed)

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

    @property
    def history(self) -> PromptHistory:
        """The skip policy's per-prompt outcome history."""
        return self.skip.history

    @property
    def skip_prob(self) -> float:
        """The streak rule's skip probability."""
        return self.skip.prob

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
        cfg = self.cfg
        st = StepStats(gen_version=self.version - lag)
        self.skip.new_step()
        if not cfg.enable:
            step = unfiltered.step(self, source, generate, st, on_round)
        elif cfg.strategy == "stream":
            if stream is None:
                raise ValueError(
                    f"{KEY}.strategy=stream needs a group stream (actor_rollout_ref.rollout.name=vllm)"
                )
            step = streaming.step(self, source, stream, st, on_round)
        elif cfg.strategy == "verl":
            step = verl.step(self, source, generate, st, on_round)
        else:
            step = default.step(self, source, generate, st, on_round)
        epoch = getattr(source, "epoch", None)
        step.metrics.update(
            step_metrics(
                st,
                step.batch,
                step.action,
                target=self.train_batch_size if cfg.enable else None,
                pooled=len(self.pool),
                skip_prob=self.skip.metric_prob(),
                kept_rate=self.kept_rate,
                version=self.version,
                stream=cfg.strategy == "stream",
                band=self.band if cfg.filter_rule == "band" and cfg.strategy != "verl" else None,
                epoch=epoch,
            )
        )
        if cfg.enable and cfg.strategy in ("default", "stream"):
            step.metrics.update(
                coverage_metrics(
                    rolled_out=len(self.skip.history),
                    trained_counts=self.trained_counts.values(),
                    skipped_with_spread=len(self.skip.spread_skips),
                    pool_size=len(source) if hasattr(source, "__len__") else None,
                )
            )
        step.group_records = st.groups
        if step.action == "train":
            self.version += 1
        return step

    def state_dict(self) -> dict[str, Any]:
        """Everything needed for an exact resume: JSON-able apart from the pool's tensors (which a
        checkpoint stores in a binary file) when the rows' non-tensor values are."""
        state = {
            "version": self.version,
            "calls": self.calls,
            "uid_counter": self.uid_counter,
            "rng": self.rng.bit_generator.state,
            "kept_rate": self.kept_rate,
            "skip_prob": self.skip.prob,
            "band": [self.band_center, self.band_half],
            "history": self.skip.history.state_dict(),
            "pool": self.pool.state_dict(),
            "warned": sorted(self._warned),
            "trained_counts": {str(k): v for k, v in self.trained_counts.items()},
        }
        if self.skip.trend is not None:  # the trend rule's model (absent under the other rules)
            state["trend"] = self.skip.trend.state_dict()
        return state

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.version = int(d["version"])
        self.calls = int(d["calls"])
        self.uid_counter = int(d["uid_counter"])
        self.rng.bit_generator.state = d["rng"]  # in place: the skip policy draws from it too
        self.kept_rate = None if d["kept_rate"] is None else float(d["kept_rate"])
        self.skip.prob = float(d["skip_prob"])
        self.band_center, self.band_half = (float(x) for x in d["band"])
        self.skip.history = self.skip.new_history(d["history"])
        self.pool = GroupPool.from_state_dict(d["pool"])
        self._warned = set(d.get("warned", []))
        # checkpoints from before the coverage figures: counting starts again at the resume
        # in place: the skip policy reads the same dict
        self.trained_counts.clear()
        self.trained_counts.update({int(k): int(v) for k, v in d.get("trained_counts", {}).items()})
        if self.skip.trend is not None and d.get("trend") is not None:
            self.skip.trend.load_state_dict(d["trend"])
        elif self.skip.trend is not None and d["history"]:
            log.warning(
                "%s.skip.rule=trend, but the checkpoint was saved under another skip rule: the trend "
                "model starts empty, so every prompt seen before is rolled out again (and confirmed "
                "when its group has no spread); set %s.skip.rule to the checkpoint's rule to keep it",
                KEY,
                KEY,
            )
