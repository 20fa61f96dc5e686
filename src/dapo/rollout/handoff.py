"""The colocated handoff between the actor and the in-process vLLM engine (verl's sharding
manager: rollout mode and trainer mode), one device shared by both.

Rollout mode, entered before generation: the actor frees its gradients and moves its optimizer
state to the host; ``empty_cache``; vLLM wakes its weights; the new weights are sent; with
``param_offload`` the actor's parameters go to the host; ``empty_cache``; vLLM wakes its KV cache.
Trainer mode, entered before the log-prob passes and the update (and before a checkpoint): vLLM
sleeps at level 2 (weights and KV cache discarded: the weights are sent again at the next
switch); ``empty_cache``; the actor gets its parameters and optimizer state back.

``empty_cache`` runs on CUDA only; everything else runs on every device, so the CPU build checks
the order and the :class:`dapo.actor.offload.MemoryLedger` it leaves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dapo.actor.offload import ActorOffload, MemoryLedger

ROLLOUT, TRAINER = "rollout", "trainer"


class Handoff:
    def __init__(self, engine: Any, actor: ActorOffload | None, device: str, ledger: MemoryLedger):
        """``actor`` None: the actor is not in this process (its ranks keep their memory); the
        engine still sleeps during the update."""
        self.engine, self.actor, self.device, self.ledger = engine, actor, device, ledger
        # trainer mode until the first generation: the actor may hold optimizer state (a resumed
        # run), and the first switch only finds the engine awake already
        self.phase = TRAINER

    def _empty_cache(self) -> None:
        if self.device == "cuda":
            torch.cuda.empty_cache()
            self.ledger.event("empty_cache")

    def _record(self) -> None:
        if self.actor is not None:
            self.ledger.record(self.phase, self.actor.tensors())

    def to_rollout(self, sync: Callable[[], bool]) -> None:
        """Enter rollout mode (or stay in it); ``sync()`` sends the weights when they changed and
        says whether it did."""
        if self.phase == ROLLOUT:
            sync()
            return
        if self.actor is not None:
            self.actor.release()
        self._empty_cache()
        if self.engine.wake_up(["weights"]):
            self.ledger.event("vllm: wake weights")
        if sync():
            self.ledger.event("weights sent")
        if self.actor is not None:
            self.actor.offload_parameters()
        self._empty_cache()
        if self.engine.wake_up(["kv_cache"]):
            self.ledger.event("vllm: wake kv_cache")
        self.phase = ROLLOUT
        self._record()

    def to_trainer(self) -> None:
        """Enter trainer mode (or stay in it)."""
        if self.phase == TRAINER:
            return
        self.ledger.events.clear()  # the events of one cycle: trainer mode, then rollout mode
        if self.engine.sleep():
            self.ledger.event("vllm: sleep level 2")
        self._empty_cache()
        if self.actor is not None:
            self.actor.restore()
        self.phase = TRAINER
        self._record()
