"""Pure tensor maths for RL post-training: advantages, policy losses, aggregation, KL, entropy.

No config objects beyond small plain dataclasses, no I/O. Every function matches verl 0.9.1's
numbers unless docs/algorithms.md names a deliberate difference.
"""

from dapo.algo.advantages import (
    ADV_ESTIMATOR_REGISTRY,
    AdvantageEstimator,
    compute_advantage,
    get_adv_estimator_fn,
    register_adv_est,
)
from dapo.algo.agg import LOSS_AGG_MODES, agg_loss, check_loss_agg_mode, compute_global_batch_info
from dapo.algo.entropy import entropy_from_logits, logprobs_and_entropy, logprobs_from_logits
from dapo.algo.kl import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    get_kl_controller,
    kl_penalty,
)
from dapo.algo.policy_loss import (
    POLICY_LOSS_REGISTRY,
    MiniBatchLossConfig,
    get_policy_loss_fn,
    register_policy_loss,
)
from dapo.algo.rollout_correction import (
    compute_offpolicy_metrics,
    compute_rollout_correction,
    compute_rollout_rejection_mask,
)
from dapo.algo.utils import masked_mean, masked_sum, masked_var, masked_whiten

__all__ = [
    "ADV_ESTIMATOR_REGISTRY",
    "AdvantageEstimator",
    "compute_advantage",
    "get_adv_estimator_fn",
    "register_adv_est",
    "LOSS_AGG_MODES",
    "agg_loss",
    "check_loss_agg_mode",
    "compute_global_batch_info",
    "entropy_from_logits",
    "logprobs_and_entropy",
    "logprobs_from_logits",
    "AdaptiveKLController",
    "FixedKLController",
    "apply_kl_penalty",
    "get_kl_controller",
    "kl_penalty",
    "POLICY_LOSS_REGISTRY",
    "MiniBatchLossConfig",
    "get_policy_loss_fn",
    "register_policy_loss",
    "compute_offpolicy_metrics",
    "compute_rollout_correction",
    "compute_rollout_rejection_mask",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
]
