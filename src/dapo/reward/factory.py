"""Build a reward manager from a verl-style config (OmegaConf, dict or dataclasses).

Keys read (a key that is absent or null takes the schema's default, ``dapo.config.schema``):

* ``reward_model.reward_manager`` [dapo]: ``dapo`` or ``naive``.
* ``reward_model.overlong_buffer.{enable,len,penalty_factor,log}`` [False, 0, 0.0, False];
  ``reward_model.reward_kwargs.overlong_buffer_cfg.*`` is accepted as an alias (verl run
  scripts add it with ``+``); giving both with different values is an error.
* ``reward_model.reward_kwargs.max_resp_len`` [``data.max_response_length``].
* ``data.reward_fn_key`` [data_source].
* ``custom_reward_function.{path,name,reward_kwargs}`` [null, compute_score, {}].
* ``reward_model.objectives`` [null]: a list of ``{name, weight: 1.0, path: null,
  function: compute_score, reward_kwargs: {}}``; ``path: null`` is the built-in router.
* ``reward_model.scoring.{mode,timeout_s,failure_score,num_workers,step_timeout_s,memory_limit_mb}``
  [auto, 10.0, -1.0, null, null, 8192].
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dapo.config.schema import CustomRewardFunctionConfig, DataConfig, RewardModelConfig
from dapo.reward.manager import (
    REWARD_MANAGERS,
    DAPORewardManager,
    OverlongBufferConfig,
    RewardObjective,
    ScoringConfig,
)
from dapo.reward.pool import ScorerRef

_MISSING = object()


def select(cfg: Any, dotted: str, default: Any = None) -> Any:
    """``cfg.a.b.c`` for dicts, OmegaConf configs and dataclasses; ``default`` if absent or None."""
    cur = cfg
    for part in dotted.split("."):
        if cur is None:
            return default
        if isinstance(cur, Mapping) or (hasattr(cur, "keys") and hasattr(cur, "get")):
            cur = cur.get(part, _MISSING) if part in cur else _MISSING
        else:
            cur = getattr(cur, part, _MISSING)
        if cur is _MISSING:
            return default
    return default if cur is None else cur


def _plain(value: Any) -> Any:
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(value, DictConfig | ListConfig):
            return OmegaConf.to_container(value, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    return value


def resolve_overlong_cfg(cfg: Any) -> OverlongBufferConfig:
    primary = OverlongBufferConfig.coerce(_plain(select(cfg, "reward_model.overlong_buffer", {})))
    alias_raw = select(cfg, "reward_model.reward_kwargs.overlong_buffer_cfg")
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
    entries = _plain(select(cfg, "reward_model.objectives"))
    if not entries:
        return None
    if select(cfg, "custom_reward_function.path"):
        raise ValueError(
            "set either custom_reward_function.path or reward_model.objectives (give the custom function a "
            "path in one objective), not both"
        )
    objectives = []
    for k, entry in enumerate(entries):
        if not isinstance(entry, Mapping) or not entry.get("name"):
            raise ValueError(f"reward_model.objectives[{k}] must be a mapping with a 'name' (got {entry!r})")
        path = entry.get("path")
        ref = ScorerRef.from_file(path, entry.get("function") or "compute_score") if path else None
        objectives.append(
            RewardObjective(
                name=str(entry["name"]),
                compute_score=ref,
                weight=float(entry.get("weight", 1.0)),
                reward_kwargs=dict(entry.get("reward_kwargs") or {}),
            )
        )
    return objectives


def build_reward_manager(cfg: Any, tokenizer: Any, num_examine: int = 0) -> DAPORewardManager:
    """The reward manager the config asks for. Call ``.close()`` (or use ``with``) when done."""
    name = str(select(cfg, "reward_model.reward_manager", RewardModelConfig.reward_manager))
    if name not in REWARD_MANAGERS:
        raise ValueError(
            f"reward_model.reward_manager must be one of {sorted(REWARD_MANAGERS)}, got {name!r}"
        )
    path = select(cfg, "custom_reward_function.path")
    reward_kwargs = dict(_plain(select(cfg, "custom_reward_function.reward_kwargs", {})) or {})
    compute_score = (
        ScorerRef.from_file(
            path, str(select(cfg, "custom_reward_function.name", CustomRewardFunctionConfig.name))
        )
        if path
        else None
    )
    if path:
        ScorerRef.load(compute_score)  # fail now, with the key named, if the file or function is missing
    scoring_raw = _plain(select(cfg, "reward_model.scoring", {})) or {}
    scoring = ScoringConfig(**{k: v for k, v in dict(scoring_raw).items() if v is not None})
    max_resp_len = select(
        cfg, "reward_model.reward_kwargs.max_resp_len", select(cfg, "data.max_response_length")
    )
    kwargs: dict[str, Any] = dict(
        reward_fn_key=str(select(cfg, "data.reward_fn_key", DataConfig.reward_fn_key)),
        max_resp_len=int(max_resp_len) if max_resp_len is not None else None,
        objectives=build_objectives(cfg),
        scoring=scoring,
        reward_kwargs=reward_kwargs,
        num_examine=num_examine,
    )
    if name == "dapo":
        kwargs["overlong_buffer_cfg"] = resolve_overlong_cfg(cfg)
    return REWARD_MANAGERS[name](tokenizer, compute_score, **kwargs)
