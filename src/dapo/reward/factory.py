"""Build a reward manager from a verl-style config: an OmegaConf config or a dict, possibly
partial. It is merged onto the schema (``dapo.config.schema``) first, so an absent key takes the
schema's default and every key is read one way.

Keys read:

* ``reward_model.reward_manager``: ``dapo`` (overlong shaping) or ``naive``.
* ``reward_model.overlong_buffer.{enable,len,penalty_factor,log}``;
  ``reward_model.reward_kwargs.overlong_buffer_cfg.*`` is accepted as an alias (verl run
  scripts add it with ``+``); giving both with different values is an error.
* ``reward_model.reward_kwargs.max_resp_len`` (absent: ``data.max_response_length``).
* ``data.reward_fn_key``.
* ``custom_reward_function.{path,name,reward_kwargs}``.
* ``reward_model.objectives``: a list of ``{name, weight, path, function, reward_kwargs}``;
  ``path: null`` is the built-in router.
* ``reward_model.scoring.{mode,timeout_s,failure_score,num_workers,step_timeout_s,memory_limit_mb}``.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from dapo.config.schema import DapoConfig
from dapo.reward.manager import (
    REWARD_MANAGERS,
    DAPORewardManager,
    OverlongBufferConfig,
    RewardObjective,
    ScoringConfig,
)
from dapo.reward.pool import ScorerRef


def _full(cfg: Any) -> DictConfig:
    """``cfg`` (possibly partial) over the schema's defaults."""
    return OmegaConf.merge(OmegaConf.structured(DapoConfig), cfg)


def _plain(value: Any) -> Any:
    return (
        OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig | ListConfig) else value
    )


def resolve_overlong_cfg(cfg: Any) -> OverlongBufferConfig:
    rm = _full(cfg).reward_model
    primary = OverlongBufferConfig.coerce(_plain(rm.overlong_buffer))
    alias_raw = rm.reward_kwargs.get("overlong_buffer_cfg")
    if alias_raw is None:
        return primary  # type: ignore[return-value]
    alias = OverlongBufferConfig.coerce(_plain(alias_raw))
    if primary != OverlongBufferConfig() and primary != alias:
        raise ValueError(
            "reward_model.overlong_buffer and its alias reward_model.reward_kwargs.overlong_buffer_cfg are both "
            f"set and disagree ({primary} vs {alias}); keep one of them"
        )
    return alias  # type: ignore[return-value]


def build_objectives(cfg: Any) -> list[RewardObjective] | None:
    cfg = _full(cfg)
    entries = cfg.reward_model.objectives
    if not entries:
        return None
    if cfg.custom_reward_function.path:
        raise ValueError(
            "set either custom_reward_function.path or reward_model.objectives (give the custom function a "
            "path in one objective), not both"
        )
    objectives = []
    for k, entry in enumerate(entries):
        if not entry.name:
            raise ValueError(f"reward_model.objectives[{k}] needs a 'name' (got {_plain(entry)!r})")
        ref = ScorerRef.from_file(entry.path, entry.function) if entry.path else None
        objectives.append(
            RewardObjective(
                name=str(entry.name),
                compute_score=ref,
                weight=float(entry.weight),
                reward_kwargs=dict(_plain(entry.reward_kwargs)),
            )
        )
    return objectives


def build_reward_manager(cfg: Any, tokenizer: Any, num_examine: int = 0) -> DAPORewardManager:
    """The reward manager the config asks for. Call ``.close()`` (or use ``with``) when done."""
    cfg = _full(cfg)
    rm, custom = cfg.reward_model, cfg.custom_reward_function
    name = rm.reward_manager
    if name not in REWARD_MANAGERS:
        raise ValueError(
            f"reward_model.reward_manager must be one of {sorted(REWARD_MANAGERS)}, got {name!r}"
        )
    compute_score = ScorerRef.from_file(custom.path, custom.name) if custom.path else None
    if compute_score is not None:
        ScorerRef.load(compute_score)  # fail now, with the key named, if the file or function is missing
    scoring = ScoringConfig(**{k: v for k, v in _plain(rm.scoring).items() if v is not None})
    max_resp_len = rm.reward_kwargs.get("max_resp_len")
    kwargs: dict[str, Any] = dict(
        reward_fn_key=cfg.data.reward_fn_key,
        max_resp_len=int(max_resp_len if max_resp_len is not None else cfg.data.max_response_length),
        objectives=build_objectives(cfg),
        scoring=scoring,
        reward_kwargs=dict(_plain(custom.reward_kwargs)),
        num_examine=num_examine,
    )
    if name == "dapo":
        kwargs["overlong_buffer_cfg"] = resolve_overlong_cfg(cfg)
    return REWARD_MANAGERS[name](tokenizer, compute_score, **kwargs)
