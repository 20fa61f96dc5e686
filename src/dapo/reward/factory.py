"""The run's reward manager, from the run config (``dapo.run_config.build_run_config``: validated
and resolved, so every key is read one way and nothing is re-derived here).

Keys read:

* ``reward_model.reward_manager``: ``dapo`` (overlong shaping) or ``naive``.
* ``reward_model.overlong_buffer`` (verl's alias ``reward_model.reward_kwargs.overlong_buffer_cfg``
  is merged into it when the config is loaded).
* ``reward_model.reward_kwargs.max_resp_len`` (resolved: ``data.max_response_length`` when absent).
* ``data.reward_fn_key``.
* ``custom_reward_function.{path,name,reward_kwargs}``.
* ``reward_model.objectives``: a list of ``{name, weight, path, function, reward_kwargs}``;
  ``path: null`` is the built-in router.
* ``reward_model.scoring`` (how scorers are isolated).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dapo.config.schema import DapoConfig, RewardObjectiveConfig
from dapo.reward.manager import REWARD_MANAGERS, DAPORewardManager, RewardObjective, objective_name_problems
from dapo.reward.pool import ScorerRef


def config_problems(cfg: Any) -> list[str]:
    """The rules dapo.reward owns (handed to the config pipeline by ``dapo.run_config``): the
    manager's name, the objectives' names, and that each reward function's file exists (it is
    imported, and its function looked up, when the manager is built)."""
    rm = cfg.reward_model
    out = []
    files = [("custom_reward_function.path", cfg.custom_reward_function.path)]
    files += [(f"reward_model.objectives[{k}].path", o.path) for k, o in enumerate(rm.objectives or [])]
    for key, path in files:
        if path and not Path(str(path)).expanduser().is_file():
            out.append(f"{key}={path}: no such file; give the python file that defines the reward function")
    if rm.reward_manager not in REWARD_MANAGERS:
        out.append(
            f"reward_model.reward_manager: unknown manager {rm.reward_manager!r}; "
            f"known: {', '.join(sorted(REWARD_MANAGERS))}"
        )
    if rm.objectives:
        out.extend(objective_name_problems([str(o.name or "") for o in rm.objectives]))
    return out


def build_objectives(entries: list[RewardObjectiveConfig] | None) -> list[RewardObjective] | None:
    """``reward_model.objectives`` as the manager's objectives (None: one reward function)."""
    if not entries:
        return None
    return [
        RewardObjective(
            name=str(entry.name),
            compute_score=ScorerRef.from_file(entry.path, entry.function) if entry.path else None,
            weight=float(entry.weight),
            reward_kwargs=dict(entry.reward_kwargs),
        )
        for entry in entries
    ]


def build_reward_manager(cfg: DapoConfig, tokenizer: Any, num_examine: int = 0) -> DAPORewardManager:
    """The reward manager the config asks for. Call ``.close()`` (or use ``with``) when done."""
    rm, custom = cfg.reward_model, cfg.custom_reward_function
    compute_score = ScorerRef.from_file(custom.path, custom.name) if custom.path else None
    if compute_score is not None:
        ScorerRef.load(compute_score)  # fail now, with the key named, if the file or function is missing
    kwargs: dict[str, Any] = dict(
        reward_fn_key=cfg.data.reward_fn_key,
        max_resp_len=int(rm.reward_kwargs["max_resp_len"]),
        objectives=build_objectives(rm.objectives),
        scoring=rm.scoring,
        reward_kwargs=dict(custom.reward_kwargs),
        num_examine=num_examine,
    )
    if rm.reward_manager == "dapo":
        kwargs["overlong_buffer_cfg"] = rm.overlong_buffer
    return REWARD_MANAGERS[rm.reward_manager](tokenizer, compute_score, **kwargs)
