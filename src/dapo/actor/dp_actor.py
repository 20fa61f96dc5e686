"""The actor: old log-probs and the PPO update (epochs x mini-batches x micro-batches).

Each micro-batch loss is aggregated with the *mini-batch's* global token / sequence counts
(``dapo.algo.agg``), and micro-batch losses are summed, so the accumulated gradient equals
the gradient of the whole mini-batch at once for every ``loss_agg_mode``,
however the rows are grouped into micro-batches: fixed ``ppo_micro_batch_size`` slices, or
with ``use_dynamic_bsz`` token-budget micro-batches balanced by Karmarkar-Karp
(``dapo.actor.seqlen_balancing``). With ``use_remove_padding`` each micro-batch runs packed
(``dapo.actor.forward.packed_response_logprobs``): pad tokens cost nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from dapo.actor.auto_budget import AutoBudget, peak_growth
from dapo.actor.forward import packed_response_logprobs, response_logprobs
from dapo.actor.seqlen_balancing import fixed_micro_batches, rearrange_micro_batches, restore_order
from dapo.algo.agg import agg_loss, compute_global_batch_info
from dapo.algo.kl import kl_penalty
from dapo.algo.policy_loss import MiniBatchLossConfig, get_policy_loss_fn
from dapo.batch import Batch
from dapo.config.schema import ActorConfig, AutoBudgetConfig, ModelConfig, RolloutConfig

AUTO = "auto"
_AUTO_START = 16384  # the token budget an ``auto`` key holds until the first probe


@dataclass(frozen=True)
class ActorSettings:
    """What the actor reads: the resolved schema blocks themselves (``actor_rollout_ref.actor``,
    the rollout's temperature and log-prob keys, the model's ``use_remove_padding``,
    ``trainer.auto_budget``), not copies of their fields, so a key added to the schema reaches
    the actor with no edit here. The properties are the few numbers derived from them."""

    actor: ActorConfig
    rollout: RolloutConfig
    model: ModelConfig = field(default_factory=ModelConfig)
    auto_budget: AutoBudgetConfig = field(default_factory=AutoBudgetConfig)

    @property
    def ppo_mini_batch_size(self) -> int:
        """Trajectories per optimizer step: ``ppo_mini_batch_size`` prompts x ``rollout.n``."""
        return int(self.actor.ppo_mini_batch_size) * int(self.rollout.n)

    @property
    def ppo_micro_batch_size(self) -> int:
        return int(self.actor.ppo_micro_batch_size_per_gpu)

    @property
    def log_prob_micro_batch_size(self) -> int:
        return int(self.rollout.log_prob_micro_batch_size_per_gpu)

    @property
    def auto_ppo(self) -> bool:
        return str(self.actor.ppo_max_token_len_per_gpu) == AUTO

    @property
    def auto_log_prob(self) -> bool:
        return str(self.rollout.log_prob_max_token_len_per_gpu) == AUTO

    @property
    def ppo_token_budget(self) -> int:
        """``ppo_max_token_len_per_gpu``, or the start value of an ``auto`` one."""
        return _AUTO_START if self.auto_ppo else int(self.actor.ppo_max_token_len_per_gpu)

    @property
    def log_prob_token_budget(self) -> int:
        return _AUTO_START if self.auto_log_prob else int(self.rollout.log_prob_max_token_len_per_gpu)

    @property
    def sp_size(self) -> int:
        return int(self.actor.ulysses_sequence_parallel_size)

    def log_prob_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``compute_log_prob`` for the old/ref log-prob passes."""
        return {
            "use_dynamic_bsz": self.rollout.log_prob_use_dynamic_bsz,
            "max_token_len": self.log_prob_token_budget,
            "use_remove_padding": self.model.use_remove_padding,
        }


def micro_batch_indices(
    attention_mask: torch.Tensor, micro_batch_size: int, use_dynamic_bsz: bool, max_token_len: int, key: str
) -> list[list[int]]:
    """Row indices of each micro-batch: fixed-size slices, or token-budget balanced partitions."""
    if not use_dynamic_bsz:
        return fixed_micro_batches(attention_mask.shape[0], micro_batch_size)
    return rearrange_micro_batches(attention_mask.sum(-1).tolist(), max_token_len, key=key)


def _inputs(batch: Batch) -> tuple[torch.Tensor, torch.Tensor, int]:
    return batch.tensors["input_ids"], batch.tensors["attention_mask"], batch.tensors["responses"].shape[1]


@torch.no_grad()
def compute_log_prob(
    model: torch.nn.Module,
    batch: Batch,
    temperature: float,
    micro_batch_size: int,
    calculate_entropy: bool = False,
    use_dynamic_bsz: bool = False,
    max_token_len: int = 16384,
    use_remove_padding: bool = False,
    forward: Callable[..., tuple[torch.Tensor, torch.Tensor | None]] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs (and entropies) of ``responses`` under ``model``, in batch order.

    ``use_dynamic_bsz``: micro-batches of at most ``max_token_len`` tokens (balanced), results
    put back in the batch's order; otherwise slices of ``micro_batch_size`` rows. ``forward``
    replaces the forward ``use_remove_padding`` selects (the FSDP worker's packed / SP one)."""
    if forward is None:
        forward = packed_response_logprobs if use_remove_padding else response_logprobs
    was_training = model.training
    model.eval()
    try:
        ids, attn, width = _inputs(batch)
        parts = micro_batch_indices(
            attn, micro_batch_size, use_dynamic_bsz, max_token_len, "log_prob_max_token_len_per_gpu"
        )
        device = next(model.parameters()).device
        lps, ents = [], []
        for part in parts:
            rows = torch.as_tensor(part, dtype=torch.long, device=ids.device)
            lp, ent = forward(
                model, ids[rows].to(device), attn[rows].to(device), width, temperature, calculate_entropy
            )
            lps.append(lp)
            if ent is not None:
                ents.append(ent)
    finally:
        model.train(was_training)
    # on the batch's device, where the caller keeps the rest of its columns
    lp = restore_order(lps, parts).to(ids.device)
    return lp, (restore_order(ents, parts).to(ids.device) if ents else None)


class Actor:
    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, settings: ActorSettings):
        self.model = model
        self.optimizer = optimizer
        self.s = settings
        self.policy_loss_fn = get_policy_loss_fn(settings.actor.policy_loss.loss_mode)
        self.nonfinite_steps = 0
        self.consecutive_nonfinite = 0
        self._forward = packed_response_logprobs if settings.model.use_remove_padding else response_logprobs
        self.log: Callable[[str], None] = print
        # the update's token budget: the configured one, or the latest an ``auto`` probe chose
        self.ppo_budget = settings.ppo_token_budget
        device = self.device
        self.auto_ppo = self.auto_log_prob = None
        if settings.auto_ppo:
            self.auto_ppo = AutoBudget(
                "ppo_max_token_len_per_gpu", settings.auto_budget, device, lambda m: self.log(m)
            )
        if settings.auto_log_prob:
            self.auto_log_prob = AutoBudget(
                "log_prob_max_token_len_per_gpu", settings.auto_budget, device, lambda m: self.log(m)
            )

    @property
    def device(self) -> torch.device:
        """Where the model's parameters are now, and so where its inputs go."""
        return next(self.model.parameters()).device

    # ------------------------------------------------------------------ auto token budgets
    def _probe(self, batch: Batch, rows: list[int], grad: bool) -> None:
        part = batch.select(np.asarray(rows)).to(self.device)
        ids, attn, width = _inputs(part)
        a = self.s.actor
        need_entropy = a.calculate_entropy or a.entropy_coeff != 0
        with torch.set_grad_enabled(grad):
            lp, ent = self._forward(
                self.model, ids, attn, width, self.s.rollout.temperature, need_entropy and grad
            )
            if grad:
                loss = (lp * part.tensors["response_mask"]).sum()
                (loss if ent is None else loss + ent.sum()).backward()
        self.model.zero_grad(set_to_none=True)

    def _optimizer_state_bytes(self) -> int:
        """AdamW's two moments, when they do not exist yet (the probe cannot see them)."""
        if self.optimizer.state:
            return 0
        return 2 * sum(p.numel() * p.element_size() for p in self.model.parameters() if p.requires_grad)

    def choose_ppo_budget(self, batch: Batch) -> int:
        lengths = batch.tensors["attention_mask"].sum(-1).tolist()
        was = self.model.training
        self.model.train()
        try:
            return self.auto_ppo.choose(
                lengths,
                lambda rows: self._probe(batch, rows, True),
                self._optimizer_state_bytes(),
                timed=lambda budget: self._timed_mini_batch(batch, lengths, budget),
            )
        finally:
            self.model.train(was)

    def _timed_mini_batch(self, batch: Batch, lengths: list[int], budget: int) -> int:
        """Forward and backward over the first mini-batch in micro-batches of ``budget`` tokens (as
        the update would run it, no optimizer step); returns its tokens."""
        n = min(len(lengths), self.s.ppo_mini_batch_size)
        for part in rearrange_micro_batches(lengths[:n], budget, key="ppo_max_token_len_per_gpu"):
            self._probe(batch, part, True)
        return int(sum(lengths[:n]))

    def log_prob_budget(self, batch: Batch) -> int:
        """``log_prob_max_token_len_per_gpu`` for this batch's rows (the configured value unless auto)."""
        if self.auto_log_prob is None:
            return self.s.log_prob_token_budget
        lengths = batch.tensors["attention_mask"].sum(-1).tolist()
        was = self.model.training
        self.model.eval()
        try:
            return self.auto_log_prob.choose(lengths, lambda rows: self._probe(batch, rows, False))
        finally:
            self.model.train(was)

    def update_policy(self, batch: Batch) -> dict[str, float]:
        if self.auto_ppo is None:
            return self._update_policy(batch)
        budget = self.ppo_budget = self.choose_ppo_budget(batch)
        with peak_growth(self.device, exact=False) as peak:
            out = self._update_policy(batch)
        self.auto_ppo.observe(peak[0])
        out["actor/ppo_max_token_len"] = float(budget)
        return out

    def _update_policy(self, batch: Batch) -> dict[str, float]:
        a, mini_size = self.s.actor, self.s.ppo_mini_batch_size
        self.model.train()
        n_rows = len(batch)
        rng = np.random.default_rng(a.data_loader_seed)
        sums: dict[str, list[float]] = {}
        for _epoch in range(a.ppo_epochs):
            order = rng.permutation(n_rows) if a.shuffle else np.arange(n_rows)
            for m0 in range(0, n_rows, mini_size):
                mini = batch.select(order[m0 : m0 + mini_size])
                stats = self._update_mini_batch(mini)
                for k, v in stats.items():
                    sums.setdefault(k, []).append(v)
        return {k: float(np.mean(v)) for k, v in sums.items()}

    def _update_mini_batch(self, mini: Batch) -> dict[str, float]:
        s = self.s.actor
        mini = mini.to(self.device)
        mask_all = mini.tensors["response_mask"].float()
        info = compute_global_batch_info(mask_all, dp_size=1, loss_scale_factor=s.loss_scale_factor)
        cfg = MiniBatchLossConfig(s, info)
        total_tokens = max(1.0, float(mask_all.sum()))
        self.optimizer.zero_grad(set_to_none=True)
        acc: dict[str, float] = {"actor/pg_loss": 0.0}
        weighted: dict[str, float] = {}
        # without old log-probs the update is on-policy: pi_old is this forward's log-probs, detached
        # (dapo.actor.old_log_prob), and the entropy metric the skipped pass would have logged comes from here
        on_policy = "old_log_probs" not in mini.tensors
        need_entropy = s.calculate_entropy or s.entropy_coeff != 0 or on_policy
        parts = micro_batch_indices(
            mini.tensors["attention_mask"],
            self.s.ppo_micro_batch_size,
            s.use_dynamic_bsz,
            self.ppo_budget,
            "ppo_max_token_len_per_gpu",
        )
        for part in parts:
            micro = mini.select(np.asarray(part)) if s.use_dynamic_bsz else mini.slice(part[0], part[-1] + 1)
            ids, attn, width = _inputs(micro)
            mask = micro.tensors["response_mask"].float()
            log_prob, entropy = self._forward(
                self.model, ids, attn, width, self.s.rollout.temperature, need_entropy
            )
            pg_loss, pg_metrics = self.policy_loss_fn(
                log_prob.detach() if on_policy else micro.tensors["old_log_probs"],
                log_prob,
                micro.tensors["advantages"],
                mask,
                s.loss_agg_mode,
                cfg,
                micro.tensors.get("rollout_is_weights"),
            )
            loss = pg_loss
            share = float(mask.sum()) / total_tokens
            if entropy is not None:
                ent_agg = agg_loss(entropy, mask, s.loss_agg_mode, **info)
                acc["actor/entropy"] = acc.get("actor/entropy", 0.0) + float(ent_agg.detach())
                if s.entropy_coeff != 0:
                    loss = loss - s.entropy_coeff * ent_agg
            if s.use_kl_loss:
                kld = kl_penalty(log_prob, micro.tensors["ref_log_prob"], s.kl_loss_type)
                kl_agg = agg_loss(kld, mask, s.loss_agg_mode, **info)
                loss = loss + s.kl_loss_coef * kl_agg
                acc["actor/kl_loss"] = acc.get("actor/kl_loss", 0.0) + float(kl_agg.detach())
                acc["actor/kl_coef"] = s.kl_loss_coef
            loss.backward()
            acc["actor/pg_loss"] += float(pg_loss.detach())
            for k, v in pg_metrics.items():
                weighted[k] = weighted.get(k, 0.0) + float(v) * share
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), s.grad_clip)
        if math.isfinite(float(grad_norm)):
            self.optimizer.step()
            self.consecutive_nonfinite = 0
        else:  # skip the step and count it; the trainer stops after several in a row
            self.optimizer.zero_grad(set_to_none=True)
            self.nonfinite_steps += 1
            self.consecutive_nonfinite += 1
        out = {**acc, **weighted, "actor/grad_norm": float(grad_norm)}
        out["actor/lr"] = float(self.optimizer.param_groups[0]["lr"])
        return out


def actor_settings(
    *,
    rollout: dict[str, Any] | None = None,
    model: dict[str, Any] | None = None,
    auto_budget: AutoBudgetConfig | None = None,
    **actor: Any,
) -> ActorSettings:
    """The actor's view of the schema's blocks with the given keys changed (``actor`` keys by
    name, ``rollout`` and ``model`` keys as dicts), for benchmarks and tests that build an actor
    without a run config. With the default ``rollout.n=1`` a mini-batch of prompts is one of
    trajectories; give the ``*_micro_batch_size_per_gpu`` keys (the run config resolves them)."""
    return ActorSettings(
        ActorConfig(**actor),
        RolloutConfig(**(rollout or {})),
        ModelConfig(**(model or {})),
        auto_budget if auto_budget is not None else AutoBudgetConfig(),
    )


def actor_settings_from_config(cfg: Any) -> ActorSettings:
    """The actor's view of the resolved run config."""
    arr = cfg.actor_rollout_ref
    return ActorSettings(arr.actor, arr.rollout, arr.model, cfg.trainer.auto_budget)
