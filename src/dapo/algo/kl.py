"""KL estimators, the in-reward KL penalty and the KL coefficient controllers (verl 0.9.1).

With d = logprob - ref_logprob (per token; samples come from the policy of `logprob`):

* "kl" / "k1":          d
* "abs":                |d|
* "mse" / "k2":         d^2 / 2
* "low_var_kl" / "k3":  x = clamp(-d, -20, 20);  clamp(e^x - x - 1, -10, 10)
* name + "+" (e.g. "k3+", "low_var_kl+"): the forward value of the base estimator with the
  gradient of k2 (straight-through); "k2+" / "mse+" are plain k2.

Config keys: `actor_rollout_ref.actor.kl_loss_type` (KL loss), `algorithm.kl_penalty` (KL in
reward), `algorithm.kl_ctrl.{type,kl_coef,target_kl,horizon}`.
"""

from __future__ import annotations

import numpy as np
import torch

from dapo.algo.utils import masked_mean

__all__ = [
    "KL_ESTIMATORS",
    "kl_penalty",
    "kl_penalty_forward",
    "apply_kl_penalty",
    "FixedKLController",
    "AdaptiveKLController",
    "get_kl_controller",
]

KL_ESTIMATORS: tuple[str, ...] = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")


def kl_penalty_forward(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """The estimator's value per token (no straight-through handling)."""
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty == "abs":
        return (logprob - ref_logprob).abs()
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty in ("low_var_kl", "k3"):
        x = torch.clamp(ref_logprob - logprob, min=-20, max=20)
        return torch.clamp(torch.exp(x) - x - 1, min=-10, max=10)
    if kl_penalty == "full":
        raise NotImplementedError("kl_penalty 'full' needs full-vocabulary log-probs; it is not supported")
    valid = ", ".join(KL_ESTIMATORS + tuple(e + "+" for e in KL_ESTIMATORS))
    raise ValueError(f"Unknown KL estimator {kl_penalty!r}. Valid: {valid}")


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Per-token KL estimate [B, T]; see the module doc for the estimators and the "+" forms."""
    straight_through = kl_penalty.endswith("+")
    base = kl_penalty[:-1] if straight_through else kl_penalty
    value = kl_penalty_forward(logprob, ref_logprob, base)
    if not straight_through or base in ("mse", "k2"):
        return value
    k2 = 0.5 * (logprob - ref_logprob).square()
    return k2 - k2.detach() + value.detach()


def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    old_log_probs: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    beta: float,
    estimator: str = "kl",
) -> tuple[torch.Tensor, float]:
    """KL in the reward (`algorithm.use_kl_in_reward`): returns (token_level_rewards, current_kl).

    kld = kl_penalty(old_log_probs, ref_log_prob, estimator) * mask;  rewards = scores - beta * kld;
    current_kl = mean over rows of the masked per-row mean of kld. The caller then runs
    `kl_ctrl.update(current_kl, n_steps=batch_size)` and logs `actor/reward_kl_penalty`
    (current_kl) and `actor/reward_kl_penalty_coeff` (beta).
    """
    kld = kl_penalty(old_log_probs, ref_log_prob, estimator) * response_mask
    rewards = token_level_scores - beta * kld
    current_kl = torch.mean(masked_mean(kld, response_mask, axis=-1), dim=0).item()
    return rewards, float(current_kl)


class FixedKLController:
    """beta stays `kl_coef`."""

    def __init__(self, kl_coef: float):
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        pass


class AdaptiveKLController:
    """Ziegler et al. (arXiv 1909.08593): e = clip(current_kl / target - 1, -0.2, 0.2),
    beta <- beta * (1 + e * n_steps / horizon)."""

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int):
        if horizon <= 0:
            raise ValueError(f"algorithm.kl_ctrl.horizon must be > 0, got {horizon}")
        self.value = init_kl_coef
        self.target = target_kl
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        error = float(np.clip(current_kl / self.target - 1, -0.2, 0.2))
        self.value *= 1 + error * n_steps / self.horizon


def get_kl_controller(
    type: str = "fixed", kl_coef: float = 0.001, target_kl: float = 0.1, horizon: int = 10000
) -> FixedKLController | AdaptiveKLController:
    """Build the controller named by `algorithm.kl_ctrl.type` ("fixed" or "adaptive")."""
    if type == "fixed":
        return FixedKLController(kl_coef)
    if type == "adaptive":
        return AdaptiveKLController(kl_coef, target_kl, horizon)
    raise ValueError(f"algorithm.kl_ctrl.type must be 'fixed' or 'adaptive', got {type!r}")
