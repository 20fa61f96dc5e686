"""Rewards: built-in scorers, reward managers (naive, dapo overlong), safe process-pool scoring.

This package's import is light (no torch) so that scoring worker processes start fast;
the manager is imported lazily.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "DAPORewardManager",
    "NaiveRewardManager",
    "RewardObjective",
    "RewardOutput",
    "ScoringConfig",
    "ScoringPool",
    "build_reward_manager",
    "default_compute_score",
]


def __getattr__(name: str) -> Any:
    if name in (
        "DAPORewardManager",
        "NaiveRewardManager",
        "RewardOutput",
        "RewardObjective",
        "ScoringConfig",
    ):
        from dapo.reward import manager

        return getattr(manager, name)
    if name == "build_reward_manager":
        from dapo.reward.factory import build_reward_manager

        return build_reward_manager
    if name == "ScoringPool":
        from dapo.reward.pool import ScoringPool

        return ScoringPool
    if name == "default_compute_score":
        from dapo.reward.scorers import default_compute_score

        return default_compute_score
    raise AttributeError(name)
