"""Driver-side actors with one interface, whatever runs behind them.

The trainer talks to an object with

* ``compute_log_prob(batch, temperature, micro_batch_size, calculate_entropy=False)``
* ``compute_ref_log_prob(batch, temperature, micro_batch_size)``
* ``update_policy(batch) -> metrics``
* ``nonfinite_steps`` / ``consecutive_nonfinite``

``LocalActor`` is today's single-process actor behind that interface; ``DistributedActor``
drives a worker group of FSDP ranks (processes or Ray actors). The distributed one

* shards each log-prob batch across ranks (equal-size Karmarkar-Karp partitions when
  ``balance``, else contiguous chunks) and puts the results back in the batch's order;
* forms the PPO mini-batches exactly as one process would (same shuffle), splits each one across
  the ranks, and lets the workers all-reduce the counts, so the update does not depend on the
  number of ranks beyond float rounding;
* makes every split divisible by padding with zero-weight rows (logged; results dropped);
* pushes the trained weights into the rollout model after each update, streamed in rounds of
  at most ``rollout.update_weights_bucket_megabytes`` (``weight_sync``: no full copy, no disk),
  or, with no rollout model (the driver holds no copy: vLLM), counts the updates
  (``weights_version``) and hands out the same rounds' pieces to whoever streams them on
  (:meth:`DistributedActor.iter_pieces`: vLLM's loader, a checkpoint's weights file).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from dapo.actor.dp_actor import Actor, ActorSettings
from dapo.actor.dp_actor import compute_log_prob as _compute_log_prob
from dapo.batch import Batch
from dapo.distributed.fsdp_worker import _LOSS_KEYS, _RANK0_KEYS
from dapo.distributed.partition import (
    balance_metrics,
    minibatch_plan,
    pad_to_multiple,
    rank_partitions,
    row_lengths,
)
from dapo.distributed.weight_sync import WeightPiece, check_covered, load_pieces_into
from dapo.distributed.worker_group import WorkerGroup


class LocalActor:
    """The single-process actor with the worker-group interface (world size 1)."""

    world_size = 1

    def __init__(self, actor: Actor, ref_model: torch.nn.Module | None = None):
        self.actor = actor
        self.ref_model = ref_model

    @property
    def nonfinite_steps(self) -> int:
        return self.actor.nonfinite_steps

    @nonfinite_steps.setter
    def nonfinite_steps(self, v: int) -> None:
        self.actor.nonfinite_steps = int(v)

    @property
    def consecutive_nonfinite(self) -> int:
        return self.actor.consecutive_nonfinite

    def _auto(self, batch: Batch, kw: dict) -> dict:
        if getattr(self.actor, "auto_log_prob", None) is not None and kw.get("use_dynamic_bsz"):
            kw = {**kw, "max_token_len": self.actor.log_prob_budget(batch)}
        return kw

    def compute_log_prob(
        self, batch: Batch, temperature: float, micro_batch_size: int, calculate_entropy=False, **kw
    ):
        return _compute_log_prob(
            self.actor.model, batch, temperature, micro_batch_size, calculate_entropy, **self._auto(batch, kw)
        )

    def compute_ref_log_prob(self, batch: Batch, temperature: float, micro_batch_size: int, **kw):
        if self.ref_model is None:
            raise ValueError("no reference model")
        # the reference has the actor's architecture: the actor's measured budget fits it too
        return _compute_log_prob(
            self.ref_model, batch, temperature, micro_batch_size, **self._auto(batch, kw)
        )

    def update_policy(self, batch: Batch) -> dict[str, float]:
        return self.actor.update_policy(batch)

    def shutdown(self) -> None:
        pass


class DistributedActor:
    """The actor on a worker group of ``FSDPActorWorker`` ranks.

    ``lr_source``: an object with ``param_groups`` (the driver's optimizer, stepped by the
    trainer's LR scheduler): its current lr is sent with each update. ``rollout_model``: the
    driver's model that the rollout engine samples from; it receives the new weights after
    every update. Without one the driver holds no weights: ``weights_version`` counts the
    changes (an update that took an optimizer step, a loaded checkpoint) and whoever needs the
    weights streams them from the ranks (:meth:`iter_pieces`)."""

    def __init__(
        self,
        group: WorkerGroup,
        settings: ActorSettings,
        *,
        lr_source: Any = None,
        rollout_model: torch.nn.Module | None = None,
        balance: bool = False,
        bucket_megabytes: float = 64.0,
        log: Callable[[str], None] = print,
    ):
        self.group = group
        self.bucket_megabytes = float(bucket_megabytes)
        self.world_size = group.world_size
        self.s = settings
        # ranks r*sp .. r*sp+sp-1 form an SP group that holds the same rows: data splits go to
        # the dp = world / sp groups
        self.sp = settings.sp_size
        if self.world_size % self.sp:
            raise ValueError(
                f"actor_rollout_ref.actor.ulysses_sequence_parallel_size={self.sp} must divide "
                f"the {self.world_size} ranks"
            )
        self.dp = self.world_size // self.sp
        self.lr_source = lr_source
        self.rollout_model = rollout_model
        self.balance = balance
        self.log = log
        self._nonfinite = 0
        self._consecutive = 0
        self._warned: set[str] = set()
        self.last_sync: dict[str, float] = {}
        self.weights_version = 0
        self.on_shutdown: list[Callable[[], None]] = []  # e.g. stopping a private local Ray

    def configure(self, settings: ActorSettings) -> None:
        """New actor settings (loss mode, micro-batch sizes, ...) on the driver and every rank."""
        if settings.sp_size != self.sp:
            raise ValueError("ulysses_sequence_parallel_size is fixed when the worker group starts")
        self.s = settings
        self.group.call_all("configure", settings)

    # ----------------------------------------------------------------- counters

    @property
    def nonfinite_steps(self) -> int:
        return self._nonfinite

    @nonfinite_steps.setter
    def nonfinite_steps(self, v: int) -> None:
        self._nonfinite = int(v)
        self.group.call_all("set_counters", int(v), self._consecutive)

    @property
    def consecutive_nonfinite(self) -> int:
        return self._consecutive

    def _note(self, key: str, msg: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            self.log(msg)

    # ----------------------------------------------------------------- log-probs

    def _per_rank(self, per_dp: list) -> list:
        """One entry per DP group -> one per rank (the ranks of an SP group get the same)."""
        return [per_dp[r // self.sp] for r in range(self.world_size)]

    def _split(self, batch: Batch, what: str) -> tuple[Batch, list[list[int]], int]:
        padded, added = pad_to_multiple(batch, self.dp)
        if added:
            self._note(
                f"pad-{what}",
                f"distributed: {what}: {len(batch)} rows do not divide by {self.dp} data-parallel groups; "
                f"{added} zero-weight row(s) added (their results are dropped)",
            )
        return padded, rank_partitions(row_lengths(padded), self.dp, self.balance), added

    def _log_prob(self, batch: Batch, role: str, temperature, micro, calculate_entropy):
        n = len(batch)
        padded, parts, _ = self._split(batch, "log-prob batch")
        results = self.group.call(
            "compute_log_prob",
            self._per_rank([(padded.select(p), temperature, micro, calculate_entropy, role) for p in parts]),
        )[:: self.sp]
        perm = torch.as_tensor([i for p in parts for i in p], dtype=torch.long)
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(len(perm))
        lp = torch.cat([r[0] for r in results])[inv][:n]
        ent = None
        if results[0][1] is not None:
            ent = torch.cat([r[1] for r in results])[inv][:n]
        return lp, ent

    def compute_log_prob(
        self, batch: Batch, temperature: float, micro_batch_size: int, calculate_entropy=False, **kw
    ):
        """``micro_batch_size`` is per rank (verl's ``log_prob_micro_batch_size_per_gpu``)."""
        return self._log_prob(batch, "actor", temperature, micro_batch_size, calculate_entropy)

    def compute_ref_log_prob(self, batch: Batch, temperature: float, micro_batch_size: int, **kw):
        return self._log_prob(batch, "ref", temperature, micro_batch_size, False)

    # ----------------------------------------------------------------- update

    def plan_update(self, batch: Batch) -> list[list[Batch]]:
        """Per DP group, its piece of every mini-batch (epochs x mini-batches, in order)."""
        s, w = self.s, self.dp
        pieces: list[list[Batch]] = [[] for _ in range(w)]
        a = s.actor
        plan = minibatch_plan(len(batch), s.ppo_mini_batch_size, a.ppo_epochs, a.shuffle, a.data_loader_seed)
        for rows in plan:
            mb, added = pad_to_multiple(batch.select(rows), w)
            if added:
                self._note(
                    f"pad-mini-{len(rows)}",
                    f"distributed: a mini-batch of {len(rows)} rows does not divide by {w} ranks; "
                    f"{added} zero-weight row(s) added (no tokens, no gradient)",
                )
            for r, p in enumerate(rank_partitions(row_lengths(mb), w, self.balance)):
                pieces[r].append(mb.select(p))
        return pieces

    def update_policy(self, batch: Batch) -> dict[str, float]:
        pieces = self.plan_update(batch)
        lr = float(self.lr_source.param_groups[0]["lr"]) if self.lr_source is not None else None
        before = self._nonfinite
        results = self.group.call("update_policy", self._per_rank([(p, lr) for p in pieces]))
        metrics = combine_metrics(results[:: self.sp])
        counters = self.group.call_all("get_counters")[0]
        self._nonfinite = int(counters["nonfinite_steps"])
        self._consecutive = int(counters["consecutive_nonfinite"])
        if self.balance:
            padded, _ = pad_to_multiple(batch, self.dp)
            lengths = row_lengths(padded)
            metrics.update(
                balance_metrics(
                    lengths,
                    rank_partitions(lengths, self.dp, False),
                    rank_partitions(lengths, self.dp, True),
                )
            )
        steps_taken = len(pieces[0]) - (self._nonfinite - before)
        if steps_taken > 0:
            self.weights_version += 1
            if self.rollout_model is not None:
                metrics.update(self.sync_weights())
        return metrics

    # ----------------------------------------------------------------- weights and checkpoints

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        return self.group.call_all("full_state_dict")[0]

    def sync_weights(self) -> dict[str, float]:
        """Stream the trained weights from every rank into the rollout model in place, one round
        (at most one bucket over all ranks) at a time; see ``dapo.distributed.weight_sync``."""
        seen: dict[str, int] = {}
        for piece in self.iter_pieces():
            load_pieces_into(self.rollout_model, (piece,))
            name, _, rows = piece
            seen[name] = seen.get(name, 0) + (rows.shape[0] if rows.dim() else 1)
            del piece, rows
        check_covered(self.rollout_model, seen)
        return dict(self.last_sync)

    def iter_pieces(self) -> Iterator[WeightPiece]:
        """Every rank's rows of every trainable parameter as ``(name, first row, rows)`` on the
        CPU, fetched one round (at most one bucket over all ranks) at a time; each round is let
        go before the next is asked for. ``last_sync`` has the figures once it is exhausted."""
        t0 = time.perf_counter()
        rounds = max(self.group.call_all("weight_rounds", self.bucket_megabytes))
        nbytes = 0
        for i in range(rounds):
            per_rank = self.group.call_all("weight_round", i)
            for pieces in per_rank:
                pieces.reverse()
                while pieces:  # popped, so a piece passed on is held by its taker alone
                    piece = pieces.pop()
                    nbytes += piece[2].numel() * piece[2].element_size()
                    yield piece
                    del piece
            del per_rank
        self.last_sync = {
            "perf/weight_sync_s": time.perf_counter() - t0,
            "perf/weight_sync_mb": nbytes / 2**20,
            "perf/weight_sync_rounds": float(rounds),
        }

    def save_sharded(self, path: str) -> None:
        self.group.call_all("save_sharded", str(path))

    def load_sharded(self, path: str) -> None:
        self.group.call_all("load_sharded", str(path))
        self.weights_version += 1
        if self.rollout_model is not None:
            self.sync_weights()

    def info(self) -> list[dict]:
        return self.group.call_all("info")

    def shutdown(self) -> None:
        self.group.shutdown()
        while self.on_shutdown:
            self.on_shutdown.pop()()


def combine_metrics(results: list[list[dict[str, float]]]) -> dict[str, float]:
    """Global metrics per mini-batch from the ranks' local ones, then the mean over mini-batches
    (as the single-process actor reports). Loss terms weight each rank by its share of the
    global normaliser, token-averaged statistics by its share of tokens; grad norm, lr and KL
    coefficient are the same on every rank."""
    per_mb: list[dict[str, float]] = []
    for j in range(len(results[0])):
        ranks = [r[j] for r in results]
        out: dict[str, float] = {}
        for k in ranks[0]:
            if k.startswith("_"):
                continue
            if k in _RANK0_KEYS:
                out[k] = float(ranks[0][k])
            elif k in _LOSS_KEYS:
                out[k] = float(sum(r["_w_loss"] * r.get(k, 0.0) for r in ranks))
            else:
                out[k] = float(sum(r["_w_tok"] * r.get(k, 0.0) for r in ranks))
        per_mb.append(out)
    keys = per_mb[0].keys() if per_mb else []
    return {k: float(np.mean([m[k] for m in per_mb if k in m])) for k in keys}
