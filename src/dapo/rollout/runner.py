"""What the trainer generates with: the sampler (single- or multi-turn, the own engine or vLLM:
``rollout.name``) built from the config, the sampling parameters of training and validation,
the weight sync, the handoff of a colocated vLLM engine's device (:mod:`dapo.rollout.handoff`),
and, with prefetch, the own engine's copy of the weights."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from typing import Any, Protocol

import torch

from dapo.actor.offload import ActorOffload, MemoryLedger
from dapo.batch import Batch
from dapo.checkpoint.rows import RowBlock
from dapo.rollout.factory import build_rollout
from dapo.rollout.handoff import ROLLOUT, Handoff
from dapo.rollout.hf import SamplingParams


def weights_version(model: torch.nn.Module) -> int:
    """A number that changes whenever a parameter is written in place (optimizer steps, a loaded
    checkpoint): the sum of the parameters' autograd version counters."""
    return sum(p._version for p in model.parameters())


class WeightSource(Protocol):
    """Where vLLM's weights come from: ``version`` changes whenever they do, ``named_weights``
    gives them as ``(name, tensor)`` under the Hugging Face names (or ``(name, RowBlock)``, a
    block of rows of a tensor too large to hold whole on the way)."""

    @property
    def version(self) -> int: ...

    def named_weights(self) -> Iterable[tuple[str, torch.Tensor | RowBlock]]: ...


class ModelWeights:
    """The weights of a model in this process (the in-process actor's, or the trainer's copy)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model

    @property
    def version(self) -> int:
        return weights_version(self.model)

    def named_weights(self) -> Iterable[tuple[str, torch.Tensor]]:
        from dapo.rollout.vllm_rollout import state_dict_for_vllm

        return state_dict_for_vllm(self.model).items()


class RolloutRunner:
    def __init__(
        self,
        cfg: Any,
        model: torch.nn.Module,
        tokenizer: Any,
        log: Callable[[str], None] = print,
        model_path: str | None = None,
    ):
        r = cfg.actor_rollout_ref.rollout
        self.rollout_cfg = r
        self.prompt_width = int(r.prompt_length)  # resolved from data.max_prompt_length when null
        self.response_length = int(r.response_length)
        self.policy = model
        self.weights: WeightSource = ModelWeights(model)
        self.sync_metrics: dict[str, float] = {}
        eos = tokenizer.eos_token_id
        gen_eos = getattr(model.generation_config, "eos_token_id", None) if model.generation_config else None
        eos_ids = [eos] + (gen_eos if isinstance(gen_eos, list) else [gen_eos] if gen_eos is not None else [])
        # with prefetch, generation runs on its own copy of the weights (refreshed before each
        # prefetch and each validation) while the optimizer updates the model in place; vLLM
        # holds such a copy already
        self.model: torch.nn.Module | None = None
        if cfg.algorithm.filter_groups.prefetch:
            if r.name != "vllm":
                self.model = copy.deepcopy(model).eval().requires_grad_(False)
            if not cfg.algorithm.rollout_correction.rollout_is:
                log(
                    "warning: algorithm.filter_groups.prefetch trains on groups one policy update stale "
                    "with no importance weights; set algorithm.rollout_correction.rollout_is=token to "
                    "correct for the drift (on the built-in task, learning collapsed without it)"
                )
        self.engine = build_rollout(
            cfg,
            self.model if self.model is not None else model,
            model_path,
            [e for e in eos_ids if e is not None],
            tokenizer.pad_token_id,
            log=log,
        )
        if getattr(self.engine, "synced_version", None) is not None:  # vLLM holds the policy's weights
            self.engine.synced_version = self.weights.version
        self.handoff: Handoff | None = None
        self.multi_turn = None
        if r.multi_turn.enable:  # generate -> tool calls -> tool messages (response_mask 0) -> ...
            from dapo.rollout.multiturn import MultiTurnRollout

            self.multi_turn = MultiTurnRollout.from_config(self.engine, tokenizer, r.multi_turn)

    def sampling_params(self, validate: bool = False) -> SamplingParams:
        """``rollout.*`` for training, ``rollout.val_kwargs.*`` for validation."""
        src = self.rollout_cfg.val_kwargs if validate else self.rollout_cfg
        return SamplingParams(
            n=src.n,
            temperature=src.temperature,
            top_p=src.top_p,
            top_k=src.top_k,
            do_sample=src.do_sample,
            response_length=self.response_length,
        )

    def attach_handoff(self, cfg: Any, optimizer: torch.optim.Optimizer | None) -> None:
        """Share the device between the policy and a vLLM engine on it (in process, or a server on
        the trainer's devices): before generation the actor (``optimizer`` given: it trains in
        this process) frees its gradients and offloads its optimizer state (and with
        ``param_offload`` its parameters), vLLM sleeps during the update."""
        r = cfg.actor_rollout_ref.rollout
        # a server on devices of its own shares nothing with the actor
        if r.name != "vllm" or (r.placement != "colocated" and r.server_devices is not None):
            return
        ledger = MemoryLedger()
        actor = None
        if optimizer is not None:
            # the in-reward KL penalty runs the actor between generation rounds: its weights stay
            offload = (
                cfg.actor_rollout_ref.actor.fsdp_config.param_offload and not cfg.algorithm.use_kl_in_reward
            )
            actor = ActorOffload(self.policy, optimizer, bool(offload), ledger)
        self.handoff = Handoff(self.engine, actor, str(cfg.trainer.device), ledger)

    def use_weights(self, source: WeightSource) -> None:
        """vLLM takes its weights from ``source`` (the worker ranks, when the trainer holds no
        copy) instead of the trainer's model; the engine holds its current version (both
        started from the same model directory)."""
        self.weights = source
        if getattr(self.engine, "synced_version", None) is not None:
            self.engine.synced_version = source.version

    def _send_weights(self, timer: Any) -> bool:
        version = self.weights.version
        if self.engine.synced_version == version:
            return False
        with timer("update_weights") if timer is not None else nullcontext():
            self.engine.load_weights(self.weights.named_weights())
        self.engine.synced_version = version
        # the stream from the worker ranks (perf/weight_sync_*), when the weights come from there
        self.sync_metrics = dict(getattr(self.weights, "sync_metrics", None) or {})
        return True

    def take_sync_metrics(self) -> dict[str, float]:
        """The last sync's ``perf/weight_sync_*`` since the previous call (empty when there was
        none, or when the weights came from this process)."""
        out, self.sync_metrics = self.sync_metrics, {}
        return out

    def sync_weights(self, timer: Any = None) -> None:
        """Bring the sampler up to the policy's current weights: vLLM takes them once per change
        (timed as ``update_weights`` on ``timer``), inside the handoff to rollout mode when there is
        one; with prefetch, the own engine's copy is refreshed."""
        if hasattr(self.engine, "update_weights"):
            if self.handoff is not None:
                self.handoff.to_rollout(lambda: self._send_weights(timer))
            else:
                self._send_weights(timer)
            return
        if self.model is None:
            return
        with torch.no_grad():
            for dst, src in zip(self.model.parameters(), self.policy.parameters(), strict=True):
                dst.copy_(src)

    def to_trainer(self) -> None:
        """Hand the device back to the actor (vLLM sleeps) before its log-prob passes, its update
        or a checkpoint; generation hands it back to vLLM (:meth:`sync_weights`)."""
        if self.handoff is not None:
            self.handoff.to_trainer()

    def step_warnings(self) -> list[str]:
        """Lines the log repeats every step (the code tool's weak-sandbox mode)."""
        return self.multi_turn.step_warnings() if self.multi_turn is not None else []

    def shutdown(self) -> None:
        if hasattr(self.engine, "shutdown"):
            self.engine.shutdown()

    def generate(self, rows: list[dict], params: SamplingParams) -> tuple[Batch, dict[str, float]]:
        """``params.n`` trajectories per row as a batch, and the multi-turn loop's tool counters."""
        if self.handoff is not None and self.handoff.phase != ROLLOUT:
            self.sync_weights()
        if self.multi_turn is None:
            out = self.engine.generate(
                [r["prompt_ids"] for r in rows], params, prompt_width=self.prompt_width
            )
            return out.to_batch(rows), {}
        out, info = self.multi_turn.generate(rows, params, self.prompt_width)
        metrics = {
            k: v
            for k, v in self.multi_turn.last_metrics.items()
            if k.startswith("tools/") and k != "tools/call_rate"
        }
        turn_info = {k: list(info[k]) for k in ("num_turns", "tool_call_counts", "messages") if k in info}
        return out.to_batch(rows, turn_info), metrics

    def generate_validation(self, rows: list[Any], batch_size: int, seed: int) -> Batch:
        """Every validation row (``as_dict()`` rows) with ``val_kwargs`` sampling and ``uid``
        ``val-<index>``, in chunks of ``batch_size``, on the current weights and a generator seeded
        with ``seed``: the numbers depend only on the weights, and the training generator is left
        where it was."""
        self.sync_weights()
        train_generator = self.engine.generator
        self.engine.generator = torch.Generator().manual_seed(seed)
        try:
            params = self.sampling_params(validate=True)
            batches = []
            for s in range(0, len(rows), batch_size):
                chunk = [r.as_dict() for r in rows[s : s + batch_size]]
                b, _ = self.generate(chunk, params)
                b["uid"] = [f"val-{r['index']}" for r in chunk for _ in range(params.n)]
                batches.append(b)
        finally:
            self.engine.generator = train_generator
        return Batch.concat(batches)
