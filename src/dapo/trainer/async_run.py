"""The trainer's side of async training: the generation thread on the in-process vLLM engine
(``colocate_async``, :mod:`dapo.rollout.partial`) or on the vLLM server's streams
(``separate_async``, :mod:`dapo.rollout.server_partial`), the scoring thread that does dynamic
sampling (:mod:`dapo.sampling.async_loop`), and the three moments the loop talks to them:
taking a batch, publishing the weights after an update, and pausing generation while a
validation or a checkpoint needs the engine or the batcher's state."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from dapo.batch import Batch
from dapo.rollout.hf import SamplingParams
from dapo.rollout.partial import EngineWorker, PartialRollout, pack_group
from dapo.rollout.rounds import GenerationRound
from dapo.rollout.runner import RolloutRunner, weights_version
from dapo.rollout.server_partial import ServerPartialRollout
from dapo.rollout.vllm_rollout import state_dict_for_vllm
from dapo.rollout.vllm_server import VllmServerRollout
from dapo.sampling import DynamicBatcher, SampledStep
from dapo.sampling.async_loop import AsyncSampler
from dapo.sampling.prefetch import GenContext


def partial_engine(at: Any, engine: Any, params: SamplingParams, version: int) -> Any:
    """The engine the generation thread drives for ``async_training`` (``at``): requests stepped
    on the in-process engine, or streamed from the server (separate_async)."""
    if at.mode == "separate_async":
        if not isinstance(engine, VllmServerRollout):
            raise ValueError(
                "async_training.mode=separate_async needs actor_rollout_ref.rollout.placement=server"
            )
        return ServerPartialRollout(engine, params, version=version, partial=at.partial_rollout)
    return PartialRollout(engine, params, version=version, partial=at.partial_rollout)


class AsyncRun:
    def __init__(
        self, cfg: Any, rollout: RolloutRunner, round_: GenerationRound, batcher: DynamicBatcher, source: Any
    ) -> None:
        at = cfg.async_training
        self.rollout, self.round = rollout, round_
        rollout.sync_weights()  # a resumed run's weights reach the engine before anything is generated
        params = rollout.sampling_params()
        self.response_length, self.prompt_width = params.response_length, rollout.prompt_width
        self.worker = EngineWorker(partial_engine(at, rollout.engine, params, batcher.version))
        self.ctx = GenContext()
        # the reward manager's worker pool serves one caller at a time: the scoring thread, or
        # the trainer's validation
        self._scoring = threading.Lock()
        self.sampler = AsyncSampler(
            batcher,
            source,
            self.worker,
            self._finish,
            max_off_policy_threshold=int(at.max_off_policy_threshold),
            max_off_policy_strategy=str(at.max_off_policy_strategy),
        )

    def _finish(self, rows: list[dict], groups: list[Any]) -> Batch:
        """Pack and score finished groups (on the scoring thread)."""
        out = pack_group(groups, self.response_length, self.prompt_width, self.rollout.engine.pad_token_id)
        batch = out.to_batch(rows)
        batch.tensors["token_versions"] = out.token_versions
        with self._scoring:
            return self.round.finish(rows, batch, self.ctx)

    def next_batch(self) -> tuple[SampledStep, GenContext]:
        sampled = self.sampler.next_batch()
        # not while the scoring thread adds a finish's figures to the context being handed over
        with self._scoring:
            ctx, self.ctx = self.ctx, GenContext()
        eng = self.worker.engine
        sampled.metrics["async/weight_syncs_total"] = float(self.worker.syncs)
        sampled.metrics["async/resumed_requests_total"] = float(eng.resumed)
        sampled.metrics["async/aborted_response_tokens_total"] = float(eng.aborted_tokens)
        return sampled, ctx

    def after_update(self, policy: torch.nn.Module) -> None:
        """The update is done: move the version on and hand a snapshot of the weights to the
        generation thread, which loads it between two engine steps."""
        version = self.sampler.advance()
        weights = {k: v.detach().clone() for k, v in state_dict_for_vllm(policy).items()}
        self.worker.publish(weights, version)
        # the engine will hold these weights: the runner's own sync (validation) has nothing to do
        self.rollout.engine.synced_version = weights_version(policy)

    @contextmanager
    def idle(self) -> Iterator[None]:
        """The engine with the newest weights and none of the run's requests, and the reward
        manager free (validation generates and scores inside)."""
        with self._scoring, self.worker.idle():
            yield

    @contextmanager
    def locked(self) -> Iterator[None]:
        """The batcher's state unchanged by the scoring thread (a checkpoint saves it)."""
        with self.sampler.locked():
            yield

    def shutdown(self) -> None:
        self.sampler.close()
        self.worker.close()
