"""Where a step's old log-probs (PPO's pi_old) come from.

* ``recompute``: a forward pass of the current weights over the batch before the update (verl's
  default ``compute_log_prob``).
* ``current``: the update is exactly on-policy (one PPO epoch, one mini-batch, nothing that reads
  the old log-probs before the update), so pi_old is the policy being differentiated: the update
  uses its own log-probs, detached, and the extra forward is skipped. The loss and gradients are
  the recompute path's, bit for bit, when both run the same micro-batches.
* ``bypass``: verl's ``algorithm.rollout_correction.bypass_mode``: the sampler's log-probs
  (``rollout_log_probs``) are pi_old, so the PPO ratio and clipping are taken against the policy
  that generated the data and no recompute pass runs.
"""

from __future__ import annotations

from typing import Any

from dapo.algo.agg import agg_loss
from dapo.algo.rollout_correction import apply_rollout_correction
from dapo.errors import TrainingError

RECOMPUTE, CURRENT, BYPASS = "recompute", "current", "bypass"


def old_log_prob_source(
    *,
    bypass_mode: bool,
    ppo_epochs: int,
    mini_batch_trajectories: int,
    batch_trajectories: int,
    prefetch: bool,
    rollout_correction: bool,
    kl_in_reward: bool,
    fast_path: bool = True,
) -> str:
    """``bypass`` when configured; ``current`` when the update is exactly on-policy; else ``recompute``."""
    if bypass_mode:
        return BYPASS
    on_policy = (
        fast_path
        and ppo_epochs == 1
        and batch_trajectories <= mini_batch_trajectories
        and not prefetch
        and not rollout_correction
        and not kl_in_reward
    )
    return CURRENT if on_policy else RECOMPUTE


def compute_old_and_ref(
    actor: Any, batch: Any, settings: Any, cfg: Any, timer: Any, *, use_ref: bool, prefetch: bool
) -> dict[str, float]:
    """Fill ``batch``'s ``old_log_probs`` (unless the update makes them itself), the rollout
    correction weights and ``ref_log_prob``; returns their metrics."""
    s, rc, a = settings, cfg.algorithm.rollout_correction, cfg.actor_rollout_ref.actor
    if rc.bypass_mode and "rollout_log_probs" not in batch.tensors:
        raise TrainingError(
            "algorithm.rollout_correction.bypass_mode=true needs the sampler's log-probs "
            "(rollout_log_probs), which this rollout did not return; set bypass_mode=false"
        )
    source = old_log_prob_source(
        bypass_mode=bool(rc.bypass_mode),
        ppo_epochs=int(a.ppo_epochs),
        mini_batch_trajectories=int(s.ppo_mini_batch_size),
        batch_trajectories=len(batch),
        prefetch=prefetch,
        rollout_correction=bool(rc.rollout_is or rc.rollout_rs),
        kl_in_reward=bool(cfg.algorithm.use_kl_in_reward),
        fast_path=bool(a.on_policy_fast_path),
    )
    metrics: dict[str, float] = {}
    if source == BYPASS:
        batch.tensors["old_log_probs"] = batch.tensors["rollout_log_probs"].clone()
    elif source == RECOMPUTE:
        with timer("old_log_prob"):
            lp, ent = actor.compute_log_prob(
                batch,
                s.rollout.temperature,
                s.log_prob_micro_batch_size,
                calculate_entropy=True,
                **s.log_prob_kwargs(),
            )
        batch.tensors["old_log_probs"] = lp
        mask = batch.tensors["response_mask"].float()
        metrics["actor/entropy"] = float(agg_loss(ent, mask, a.loss_agg_mode))
    # CURRENT: no old_log_probs; the update uses its own log-probs, detached (and logs the entropy)
    metrics.update(apply_rollout_correction(batch.tensors, rc))
    if use_ref:
        with timer("ref"):
            ref, _ = actor.compute_ref_log_prob(
                batch, s.rollout.temperature, s.log_prob_micro_batch_size, **s.log_prob_kwargs()
            )
        batch.tensors["ref_log_prob"] = ref
    return metrics
