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
