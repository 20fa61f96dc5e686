"""The configuration rules dapo.algo owns: each key that names an estimator, a loss or a KL
estimator must name one registered here (``dapo.run_config`` hands this to the config pipeline)."""

from __future__ import annotations

from typing import Any

from dapo.algo.advantages import ADV_ESTIMATOR_REGISTRY
from dapo.algo.agg import LOSS_AGG_MODES
from dapo.algo.kl import KL_ESTIMATORS
from dapo.algo.policy_loss import POLICY_LOSS_REGISTRY


def config_problems(cfg: Any) -> list[str]:
    """Every unknown name among ``algorithm.adv_estimator``, ``actor.loss_agg_mode``,
    ``actor.policy_loss.loss_mode``, ``actor.kl_loss_type`` and ``algorithm.kl_penalty``."""
    alg, actor = cfg.algorithm, cfg.actor_rollout_ref.actor
    kl_names = KL_ESTIMATORS + tuple(e + "+" for e in KL_ESTIMATORS)
    checks = [
        ("algorithm.adv_estimator", "estimator", alg.adv_estimator, sorted(ADV_ESTIMATOR_REGISTRY)),
        ("actor_rollout_ref.actor.loss_agg_mode", "mode", actor.loss_agg_mode, LOSS_AGG_MODES),
        (
            "actor_rollout_ref.actor.policy_loss.loss_mode",
            "mode",
            actor.policy_loss.loss_mode,
            sorted(POLICY_LOSS_REGISTRY),
        ),
        ("actor_rollout_ref.actor.kl_loss_type", "estimator", actor.kl_loss_type, kl_names),
        ("algorithm.kl_penalty", "estimator", alg.kl_penalty, kl_names),
    ]
    return [
        f"{key}: unknown {what} {value!r}; known: {', '.join(known)}"
        for key, what, value, known in checks
        if value not in known
    ]
