"""One generation round, the function the dynamic batcher calls for each draw of prompts:
rollout, reward, ReMax's greedy baseline and the in-reward KL penalty (when configured).
Its phase times and counters go to the round's :class:`~dapo.sampling.prefetch.GenContext`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dapo.algo.kl import apply_kl_penalty
from dapo.batch import Batch
from dapo.rollout.hf import SamplingParams
from dapo.rollout.runner import RolloutRunner
from dapo.sampling.prefetch import GenContext


class GenerationRound:
    def __init__(
        self,
        rollout: RolloutRunner,
        reward_fn: Any,
        algorithm: Any,
        kl_ctrl: Any,
        compute_old_and_ref: Callable[[Batch], Any],
    ):
        """``compute_old_and_ref(batch)`` sets the batch's ``old_log_probs`` and ``ref_log_prob``;
        only the in-reward KL penalty (``kl_ctrl`` not None) needs it."""
        self.rollout, self.reward_fn, self.algorithm = rollout, reward_fn, algorithm
        self.kl_ctrl, self.compute_old_and_ref = kl_ctrl, compute_old_and_ref

    def __call__(self, rows: list[dict], ctx: GenContext) -> Batch:
        """``rows``' trajectories with ``token_level_scores`` and ``token_level_rewards``."""
        with ctx.timer("gen"):
            batch = self.generate(rows, self.rollout.sampling_params(), ctx)
        return self.finish(rows, batch, ctx)

    def finish(self, rows: list[dict], batch: Batch, ctx: GenContext) -> Batch:
        """Score generated trajectories: rewards, ReMax's baseline, the in-reward KL penalty."""
        with ctx.timer("reward"):
            self.score(batch, ctx)
        if self.algorithm.adv_estimator == "remax":
            batch.tensors["reward_baselines"] = self._greedy_baseline(rows, ctx)
        if self.kl_ctrl is not None:
            self.compute_old_and_ref(batch)
            rewards, current_kl = apply_kl_penalty(
                batch.tensors["token_level_scores"],
                batch.tensors["old_log_probs"],
                batch.tensors["ref_log_prob"],
                batch.tensors["response_mask"],
                self.kl_ctrl.value,
                self.algorithm.kl_penalty,
            )
            self.kl_ctrl.update(float(current_kl), n_steps=len(rows))
            batch.tensors["token_level_rewards"] = rewards
            ctx.round_metrics["actor/reward_kl_penalty"] = float(current_kl)
            ctx.round_metrics["actor/reward_kl_penalty_coeff"] = float(self.kl_ctrl.value)
        else:
            batch.tensors["token_level_rewards"] = batch.tensors["token_level_scores"].clone()
        ctx.last_round = batch
        return batch

    def stream(self, ctx: GenContext) -> RoundStream:
        """Groups streamed through the engine (``algorithm.filter_groups.strategy=stream``), scored
        like a round's as they finish."""
        return RoundStream(self, ctx)

    def generate(self, rows: list[dict], params: SamplingParams, ctx: GenContext) -> Batch:
        batch, tool_metrics = self.rollout.generate(rows, params)
        for k, v in tool_metrics.items():
            ctx.add(k, v)
        return batch

    def score(self, batch: Batch, ctx: GenContext) -> dict[str, list]:
        """Set ``token_level_scores`` and the scorer's extra columns; returns the extras."""
        scores, extra = self.reward_fn(batch)[:2]
        ctx.reward_extra_keys = list(extra)
        batch.tensors["token_level_scores"] = scores
        for k, v in extra.items():
            batch[k] = list(v)
        for k, v in (getattr(self.reward_fn, "last_metrics", None) or {}).items():
            ctx.add(k, v)
        return extra

    def _greedy_baseline(self, rows: list[dict], ctx: GenContext) -> torch.Tensor:
        """ReMax: the reward of one greedy response per prompt, repeated for its n samples [B]."""
        with ctx.timer("gen_max"):
            params = self.rollout.sampling_params()
            n = params.n
            params.n, params.do_sample, params.temperature = 1, False, 0.0
            greedy = self.generate(rows, params, ctx)
        with ctx.timer("reward"):
            scores, _ = self.reward_fn(greedy)[:2]
        return scores.sum(-1).repeat_interleave(n)


class RoundStream:
    """The batcher's :class:`~dapo.sampling.stream.GroupStream` on the vLLM engine: prompt rows in,
    scored groups out; the engine's time is timed as ``gen``, scoring as ``reward``."""

    def __init__(self, round_: GenerationRound, ctx: GenContext):
        self.round, self.ctx = round_, ctx
        runner = round_.rollout
        self.params = runner.sampling_params()
        self.engine, self.prompt_width = runner.engine, runner.prompt_width
        self.engine_stream = self.engine.stream(self.params)
        self._rows: dict[str, dict] = {}

    @property
    def in_flight(self) -> int:
        return self.engine_stream.in_flight

    def submit(self, rows: list[dict]) -> None:
        with self.ctx.timer("gen"):
            ids = self.engine_stream.submit([r["prompt_ids"] for r in rows])
        self._rows.update(zip(ids, rows))

    def wait(self) -> tuple[list[dict], Batch]:
        with self.ctx.timer("gen"):
            done = self.engine_stream.wait()
            rows = [self._rows.pop(rid) for rid, _ in done]
            out = self.engine.pack(
                [r["prompt_ids"] for r in rows],
                [samples for _, samples in done],
                self.params.n,
                self.params.response_length,
                self.prompt_width,
            )
            batch = out.to_batch(rows)
        return rows, self.round.finish(rows, batch, self.ctx)

    def abort(self) -> tuple[int, float]:
        with self.ctx.timer("gen"):
            groups, tokens = self.engine_stream.abort()
        self._rows.clear()
        return groups, float(tokens)

    def close(self) -> None:
        self.engine_stream.close()
