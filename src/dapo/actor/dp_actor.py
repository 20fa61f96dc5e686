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

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from dapo.actor.auto_budget import AutoBudget, AutoBudgetConfig, peak_growth
from dapo.actor.forward import packed_response_logprobs, response_logprobs
from dapo.actor.seqlen_balancing import fixed_micro_batches, rearrange_micro_batches, restore_order
from dapo.algo.agg import agg_loss, compute_global_batch_info
from dapo.algo.kl import kl_penalty
from dapo.algo.policy_loss import PolicyLossConfig, get_policy_loss_fn
from dapo.batch import Batch
from dapo.config.schema import ActorConfig, ModelConfig, RolloutConfig

_A = ActorConfig  # verl's defaults, from the config schema


@dataclass
class ActorSettings:
    """The actor's numbers (``actor_settings_from_config`` fills them from a config); every field
    but the batch sizes defaults to verl's actor default."""

    ppo_mini_batch_size: int  # trajectories (prompts x n)
    ppo_micro_batch_size: int  # trajectories
    log_prob_micro_batch_size: int
    ppo_epochs: int = _A.ppo_epochs
    shuffle: bool = _A.shuffle
    data_loader_seed: int = _A.data_loader_seed
    grad_clip: float = _A.grad_clip
    temperature: float = RolloutConfig.temperature
    loss_agg_mode: str = _A.loss_agg_mode
    loss_scale_factor: float | None = _A.loss_scale_factor
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    loss_mode: str = PolicyLossConfig.loss_mode
    entropy_coeff: float = _A.entropy_coeff
    calculate_entropy: bool = _A.calculate_entropy
    use_kl_loss: bool = _A.use_kl_loss
    kl_loss_coef: float = _A.kl_loss_coef
    kl_loss_type: str = _A.kl_loss_type
    use_dynamic_bsz: bool = _A.use_dynamic_bsz
    ppo_max_token_len_per_gpu: int = _A.ppo_max_token_len_per_gpu
    log_prob_use_dynamic_bsz: bool = RolloutConfig.log_prob_use_dynamic_bsz
    log_prob_max_token_len_per_gpu: int = RolloutConfig.log_prob_max_token_len_per_gpu
    use_remove_padding: bool = ModelConfig.use_remove_padding
    # ranks that split each packed sequence (Ulysses); > 1 only on a worker group
    ulysses_sequence_parallel_size: int = 1
    # token budgets chosen from measured memory (``...max_token_len_per_gpu=auto``)
    auto_budget: AutoBudgetConfig | None = None

    def log_prob_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``compute_log_prob`` for the old/ref log-prob passes."""
        return {
            "use_dynamic_bsz": self.log_prob_use_dynamic_bsz,
            "max_token_len": self.log_prob_max_token_len_per_gpu,
            "use_remove_padding": self.use_remove_padding,
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
        lps, ents = [], []
        for part in parts:
            rows = torch.as_tensor(part, dtype=torch.long)
            lp, ent = forward(model, ids[rows], attn[rows], width, temperature, calculate_entropy)
            lps.append(lp)
            if ent is not None:
                ents.append(ent)
    finally:
        model.train(was_training)
    return restore_order(lps, parts), (restore_order(ents, parts) if ents else None)


class Actor:
    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, settings: ActorSettings):
        self.model = model
        self.optimizer = optimizer
        self.s = settings
        self.policy_loss_fn = get_policy_loss_fn(settings.loss_mode)
        # built once; each mini-batch only sets its global token / sequence counts
        self.loss_cfg = replace(
            settings.policy_loss,
            loss_agg_mode=settings.loss_agg_mode,
            loss_scale_factor=settings.loss_scale_factor,
            loss_mode=settings.loss_mode,
        )
        self.nonfinite_steps = 0
        self.consecutive_nonfinite = 0
        self._forward = packed_response_logprobs if settings.use_remove_padding else response_logprobs
        self.log: Callable[[str], None] = print
        auto = settings.auto_budget
        device = next(model.parameters()).device
        self.auto_ppo = self.auto_log_prob = None
        if auto is not None and auto.ppo:
            self.auto_ppo = AutoBudget("ppo_max_token_len_per_gpu", auto, device, lambda m: self.log(m))
        if auto is not None and auto.log_prob:
            self.auto_log_prob = AutoBudget(
                "log_prob_max_token_len_per_gpu", auto, device, lambda m: self.log(m)
            )

    # ------------------------------------------------------------------ auto token budgets
    def _probe(self, batch: Batch, rows: list[int], grad: bool) -> None:
        part = batch.select(np.asarray(rows))
        ids, attn, width = _inputs(part)
        need_entropy = self.s.calculate_entropy or self.s.entropy_coeff != 0
        with torch.set_grad_enabled(grad):
            lp, ent = self._forward(self.model, ids, attn, width, self.s.temperature, need_entropy and grad)
            if grad:
                loss = (lp * part.tensors["response_mask"]).sum()
                (loss if ent is None else loss + ent.sum()).backward()
        self.model.zero_grad(set_to_none=True)

    def _optimizer_state_bytes(self) -> int:
        """AdamW's two moments, when they do not exist yet (the probe cannot see them)."""
        if self.optimizer.state:
            return 0
        return 2 * sum(p.numel() * p.element_size() for p in self.model.parameters() if p.requires_grad)

    def ppo_budget(self, batch: Batch) -> int:
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
            return self.s.log_prob_max_token_len_per_gpu
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
        budget = self.ppo_budget(batch)
        if budget != self.s.ppo_max_token_len_per_gpu:
            self.s = dataclasses.replace(self.s, ppo_max_token_len_per_gpu=budget)
        with peak_growth(next(self.model.parameters()).device, exact=False) as peak:
            out = self._update_policy(batch)
        self.auto_ppo.observe(peak[0])
        out["actor/ppo_max_token_len"] = float(budget)
        return out

    def _update_policy(self, batch: Batch) -> dict[str, float]:
        s = self.s
        self.model.train()
        n_rows = len(batch)
        rng = np.random.default_rng(s.data_loader_seed)
        sums: dict[str, list[float]] = {}
        for _epoch in range(s.ppo_epochs):
            order = rng.permutation(n_rows) if s.shuffle else np.arange(n_rows)
            for m0 in range(0, n_rows, s.ppo_mini_batch_size):
                mini = batch.select(order[m0 : m0 + s.ppo_mini_batch_size])
                stats = self._update_mini_batch(mini)
                for k, v in stats.items():
                    sums.setdefault(k, []).append(v)
        return {k: float(np.mean(v)) for k, v in sums.items()}

    def _update_mini_batch(self, mini: Batch) -> dict[str, float]:
        s = self.s
        mask_all = mini.tensors["response_mask"].float()
        info = compute_global_batch_info(mask_all, dp_size=1, loss_scale_factor=s.loss_scale_factor)
        cfg = self.loss_cfg
        cfg.global_batch_info = info
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
            s.ppo_micro_batch_size,
            s.use_dynamic_bsz,
            s.ppo_max_token_len_per_gpu,
            "ppo_max_token_len_per_gpu",
        )
        for part in parts:
            micro = mini.select(np.asarray(part)) if s.use_dynamic_bsz else mini.slice(part[0], part[-1] + 1)
            ids, attn, width = _inputs(micro)
            mask = micro.tensors["response_mask"].float()
            log_prob, entropy = self._forward(self.model, ids, attn, width, s.temperature, need_entropy)
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


def actor_settings_from_config(cfg: Any) -> ActorSettings:
    """The actor's numbers from the resolved run config (mini-batch sizes in trajectories)."""
    a, r = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    pl = a.policy_loss
    return ActorSettings(
        ppo_mini_batch_size=a.ppo_mini_batch_size * r.n,
        ppo_micro_batch_size=int(a.ppo_micro_batch_size_per_gpu),
        ppo_epochs=a.ppo_epochs,
        shuffle=a.shuffle,
        data_loader_seed=a.data_loader_seed,
        grad_clip=a.grad_clip,
        temperature=r.temperature,
        loss_agg_mode=a.loss_agg_mode,
        loss_scale_factor=a.loss_scale_factor,
        policy_loss=PolicyLossConfig(
            clip_ratio=a.clip_ratio,
            clip_ratio_low=a.clip_ratio_low,
            clip_ratio_high=a.clip_ratio_high,
            clip_ratio_c=a.clip_ratio_c,
            clip_cov_ratio=pl.clip_cov_ratio,
            clip_cov_lb=pl.clip_cov_lb,
            clip_cov_ub=pl.clip_cov_ub,
            kl_cov_ratio=pl.kl_cov_ratio,
            ppo_kl_coef=pl.ppo_kl_coef,
        ),
        loss_mode=pl.loss_mode,
        entropy_coeff=a.entropy_coeff,
        calculate_entropy=a.calculate_entropy,
        use_kl_loss=a.use_kl_loss,
        kl_loss_coef=a.kl_loss_coef,
        kl_loss_type=a.kl_loss_type,
        log_prob_micro_batch_size=int(r.log_prob_micro_batch_size_per_gpu),
        use_dynamic_bsz=a.use_dynamic_bsz,
        ppo_max_token_len_per_gpu=_budget(a.ppo_max_token_len_per_gpu),
        log_prob_use_dynamic_bsz=r.log_prob_use_dynamic_bsz,
        log_prob_max_token_len_per_gpu=_budget(r.log_prob_max_token_len_per_gpu),
        use_remove_padding=cfg.actor_rollout_ref.model.use_remove_padding,
        ulysses_sequence_parallel_size=int(a.ulysses_sequence_parallel_size or 1),
        auto_budget=_auto_budget(cfg),
    )


AUTO = "auto"
_AUTO_START = 16384  # the value an ``auto`` budget holds until the first probe


def _budget(value: Any) -> int:
    return _AUTO_START if str(value) == AUTO else int(value)


def _auto_budget(cfg: Any) -> AutoBudgetConfig | None:
    a, r = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    ppo, lp = str(a.ppo_max_token_len_per_gpu) == AUTO, str(r.log_prob_max_token_len_per_gpu) == AUTO
    if not (ppo or lp):
        return None
    ab = cfg.trainer.auto_budget
    limit = ab.memory_limit_gb
    return AutoBudgetConfig(
        ppo=ppo, log_prob=lp, memory_limit_gb=float(limit) if limit else None, margin=float(ab.margin)
    )
