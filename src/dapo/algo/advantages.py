"""Outcome advantage estimators (verl 0.9.1 `core_algos`), and their registry.

Every estimator takes verl's keyword arguments and returns `(advantages, returns)`, both
[B, T] and zero outside `response_mask`. Each accepts and ignores unknown keyword arguments, so
one call site can pass the same keywords to all of them:

    fn = get_adv_estimator_fn(config.algorithm.adv_estimator)
    adv, ret = fn(token_level_rewards=r, response_mask=m, index=uid, config=algo_cfg,
                  norm_adv_by_std_in_grpo=..., reward_baselines=...)

`index` holds one group id per row (the batch's `uid`); rows with equal ids are one group. A
custom estimator written for verl ports by changing its import to `dapo.algo.advantages`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from enum import Enum, StrEnum
from typing import Any

import numpy as np
import torch

from dapo.algo.utils import cfg_get, masked_whiten
from dapo.config.schema import AlgorithmConfig

__all__ = [
    "AdvantageEstimator",
    "ADV_ESTIMATOR_REGISTRY",
    "register_adv_est",
    "get_adv_estimator_fn",
    "compute_advantage",
    "group_rows",
    "compute_grpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_opo_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_remax_outcome_advantage",
]


class AdvantageEstimator(StrEnum):
    """Names of the built-in estimators (the values of `algorithm.adv_estimator`)."""

    GRPO = "grpo"
    GRPO_PASSK = "grpo_passk"
    RLOO = "rloo"
    OPO = "opo"
    REINFORCE_PLUS_PLUS = "reinforce_plus_plus"
    REINFORCE_PLUS_PLUS_BASELINE = "reinforce_plus_plus_baseline"
    REMAX = "remax"


ADV_ESTIMATOR_REGISTRY: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {}


def _name(name_or_enum: str | Enum) -> str:
    return name_or_enum.value if isinstance(name_or_enum, Enum) else str(name_or_enum)


def register_adv_est(name_or_enum: str | Enum):
    """Decorator: register an estimator under a name. Registering another function under a taken
    name raises ValueError (re-registering the same function is allowed)."""

    def decorator(fn):
        name = _name(name_or_enum)
        if name in ADV_ESTIMATOR_REGISTRY and ADV_ESTIMATOR_REGISTRY[name] is not fn:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        ADV_ESTIMATOR_REGISTRY[name] = fn
        return fn

    return decorator


def get_adv_estimator_fn(name_or_enum: str | Enum):
    """The estimator registered under `name_or_enum`; ValueError naming the known ones otherwise."""
    name = _name(name_or_enum)
    if name not in ADV_ESTIMATOR_REGISTRY:
        raise ValueError(
            f"Unknown advantage estimator {name!r} (algorithm.adv_estimator). "
            f"Known: {', '.join(sorted(ADV_ESTIMATOR_REGISTRY))}"
        )
    return ADV_ESTIMATOR_REGISTRY[name]


def group_rows(index: Sequence[Any] | np.ndarray | torch.Tensor) -> list[torch.Tensor]:
    """Row indices of each group, groups in order of first appearance, rows in batch order."""
    if isinstance(index, torch.Tensor):
        index = index.tolist()
    groups: dict[Any, list[int]] = {}
    for i, key in enumerate(index):
        groups.setdefault(key, []).append(i)
    return [torch.tensor(rows, dtype=torch.long) for rows in groups.values()]


def _require_index(index, name: str):
    if index is None:
        raise ValueError(f"{name} needs `index` (the group id, batch non-tensor 'uid') for every row")
    return index


# --------------------------------------------------------------------------------------------
# GRPO family
# --------------------------------------------------------------------------------------------


@register_adv_est(AdvantageEstimator.GRPO)
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | np.ndarray | None = None,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO: s_i = sum_t r[i,t]; A_i = (s_i - mean_g) / (std_g + epsilon), std unbiased (ddof=1).

    With `norm_adv_by_std_in_grpo=False`, A_i = s_i - mean_g (Dr.GRPO). A group of one row uses
    mean 0 and std 1. The advantage is broadcast over the row's response tokens.
    """
    index = _require_index(index, "grpo")
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        adv = torch.empty_like(scores)
        for rows in group_rows(index):
            s = scores[rows]
            if len(rows) == 1:
                mean, std = torch.tensor(0.0), torch.tensor(1.0)
            else:
                mean, std = s.mean(), s.std()
            adv[rows] = (s - mean) / (std + epsilon) if norm_adv_by_std_in_grpo else s - mean
        adv = adv.unsqueeze(-1) * response_mask
    return adv, adv


@register_adv_est(AdvantageEstimator.GRPO_PASSK)
def compute_grpo_passk_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | np.ndarray | None = None,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k (arXiv 2503.19595): only the best row of each group gets an advantage,
    r_max - r_second_max, divided by (std_g + epsilon) when normalising. Groups need >= 2 rows.

    Like verl, `config.norm_adv_by_std_in_grpo` decides normalisation when the config has it;
    the keyword argument is the fallback.
    """
    index = _require_index(index, "grpo_passk")
    norm = cfg_get(config, "norm_adv_by_std_in_grpo", norm_adv_by_std_in_grpo)
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        adv = torch.zeros_like(scores)
        for rows in group_rows(index):
            s = scores[rows]
            if s.numel() < 2:
                raise ValueError(f"grpo_passk needs at least 2 responses per group; a group has {s.numel()}")
            top, top_idx = torch.topk(s, 2)
            a = top[0] - top[1]
            if norm:
                a = a / (s.std() + epsilon)
            adv[rows[top_idx[0]]] = a
        adv = adv.unsqueeze(-1) * response_mask
    return adv, adv


@register_adv_est(AdvantageEstimator.RLOO)
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | np.ndarray | None = None,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO (arXiv 2402.14740): A_i = s_i - mean_{j != i} s_j = n/(n-1) * (s_i - mean_g).

    A group of one row keeps A_i = s_i (no baseline), as in verl.
    """
    index = _require_index(index, "rloo")
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        adv = scores.clone()
        for rows in group_rows(index):
            n = len(rows)
            if n > 1:
                s = scores[rows]
                # same operation order as verl: s*n/(n-1) - mean*n/(n-1)
                adv[rows] = s * n / (n - 1) - s.mean() * n / (n - 1)
        adv = adv.unsqueeze(-1) * response_mask
    return adv, adv


@register_adv_est(AdvantageEstimator.OPO)
def compute_opo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | np.ndarray | None = None,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO (arXiv 2505.23585): length-weighted baseline b_g = sum_j |y_j| s_j / sum_j |y_j|;
    A_i = s_i - b_g. A group of one row uses b = 0."""
    index = _require_index(index, "opo")
    with torch.no_grad():
        lengths = response_mask.sum(dim=-1)
        scores = token_level_rewards.sum(dim=-1)
        adv = scores.clone()
        for rows in group_rows(index):
            if len(rows) > 1:
                s, n = scores[rows], lengths[rows]
                adv[rows] = s - (n * s).sum() / n.sum()
        adv = adv.unsqueeze(-1) * response_mask
    return adv, adv


# --------------------------------------------------------------------------------------------
# REINFORCE family and ReMax
# --------------------------------------------------------------------------------------------


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS)
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any = None,
    gamma: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (arXiv 2501.03262): discounted return G_t = r_t + gamma * G_{t+1} over
    response tokens (masked tokens, e.g. tool observations, carry G through unchanged and get 0),
    advantages = G whitened over the whole batch's masked tokens.

    gamma: the `gamma` argument, else `config.gamma` (algorithm.gamma), else 1.0.
    """
    if gamma is None:
        gamma = cfg_get(config, "gamma", AlgorithmConfig.gamma)
    with torch.no_grad():
        mask = response_mask.to(token_level_rewards.dtype)
        returns = torch.zeros_like(token_level_rewards)
        running = torch.zeros_like(token_level_rewards[:, 0])
        for t in reversed(range(token_level_rewards.shape[1])):
            new = token_level_rewards[:, t] + gamma * running
            returns[:, t] = new * mask[:, t]
            running = new * mask[:, t] + running * (1 - mask[:, t])
        adv = masked_whiten(returns, response_mask) * response_mask
    return adv, returns


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS_BASELINE)
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | np.ndarray | None = None,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++-baseline: s_i - mean_g (mean 0 for a one-row group), broadcast over the row's
    tokens, then whitened over all masked tokens of the batch."""
    index = _require_index(index, "reinforce_plus_plus_baseline")
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        centred = scores.clone()
        for rows in group_rows(index):
            if len(rows) > 1:
                centred[rows] = scores[rows] - scores[rows].mean()
        tiled = centred.unsqueeze(-1).expand_as(token_level_rewards) * response_mask
        adv = masked_whiten(tiled, response_mask) * response_mask
    return adv, adv


@register_adv_est(AdvantageEstimator.REMAX)
def compute_remax_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    reward_baselines: torch.Tensor | None = None,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax (arXiv 2310.10505): returns G_t = sum_{t' >= t} r_t' m_t' (undiscounted);
    advantages = G_t - b * m_t, where b [B] is the reward of the greedy response to the same
    prompt (batch tensor `reward_baselines`)."""
    if reward_baselines is None:
        raise ValueError("remax needs `reward_baselines` [B]: the score of a greedy rollout per prompt")
    with torch.no_grad():
        returns = (token_level_rewards * response_mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
        adv = returns - reward_baselines.unsqueeze(-1) * response_mask
    return adv, returns


# --------------------------------------------------------------------------------------------
# Dispatcher
# --------------------------------------------------------------------------------------------


def compute_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    adv_estimator: str | Enum = "grpo",
    index: Sequence[Any] | np.ndarray | None = None,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
    reward_baselines: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Look up `adv_estimator` and call it with every argument given (unused ones are ignored)."""
    fn = get_adv_estimator_fn(adv_estimator)
    extra = dict(kwargs)
    if reward_baselines is not None:
        extra["reward_baselines"] = reward_baselines
    return fn(
        token_level_rewards=token_level_rewards,
        response_mask=response_mask,
        index=index,
        norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
        config=config,
        **extra,
    )
