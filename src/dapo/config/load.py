"""Building a run's configuration: schema defaults <- preset <- ``key=value`` overrides.

Overrides use Hydra's grammar, as verl users write them: ``a.b=1``, ``+a.b=1`` (add),
``++a.b=1`` (add or change), ``~a.b`` (delete, resets to the default), lists ``[1,2]``, ``null``.

verl's other spellings of a key (``VERL_ALIASES``) are read into dapo's key; verl keys that dapo
accepts and ignores (``dapo.config.compat``) are dropped and recorded, so that the warnings name
them; every other key outside the schema is an error naming it.
"""

from __future__ import annotations

import difflib
from importlib import resources
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from dapo.config.compat import UserKeys, foreign_hint, ignored_group, ignored_key_names
from dapo.config.schema import DapoConfig
from dapo.errors import DapoError

DEFAULT_PRESET = "default"


class ConfigError(DapoError, ValueError):
    """One or more configuration problems; each names the key and how to fix it."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        if len(self.problems) == 1:  # one problem, one line
            super().__init__(f"invalid configuration: {self.problems[0]}")
        else:
            super().__init__("invalid configuration:\n" + "\n".join(f"  - {p}" for p in self.problems))


def preset_names() -> list[str]:
    folder = resources.files("dapo.config") / "presets"
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def preset_path(name_or_path: str) -> Path:
    p = Path(name_or_path).expanduser()
    if p.suffix in (".yaml", ".yml") and p.exists():
        return p
    folder = resources.files("dapo.config") / "presets"
    candidate = folder / f"{name_or_path}.yaml"
    if candidate.is_file():
        return Path(str(candidate))
    raise ConfigError(
        [f"--config-name {name_or_path}: no such preset or yaml file; presets: {', '.join(preset_names())}"]
    )


def is_user_file(preset: str | None) -> bool:
    """True when ``--config-name`` names the user's own yaml file rather than a built-in preset."""
    if not preset:
        return False
    p = Path(preset).expanduser()
    return p.suffix in (".yaml", ".yml") and p.exists()


def load_config(
    overrides: list[str] | None = None,
    preset: str | None = DEFAULT_PRESET,
    problems: list[str] | None = None,
    user: UserKeys | None = None,
) -> DictConfig:
    """The schema-checked configuration (interpolations resolved). Raises ConfigError naming every
    unknown key and bad value, or, when ``problems`` is given, appends them to it and returns the
    config without the bad entries (so cross-field checks can still run). ``user``, when given,
    receives the keys the user set (overrides, and the preset when it is the user's own file) and
    the accepted verl keys outside the schema they gave."""
    found: list[str] = []
    user = user if user is not None else UserKeys()
    cfg = OmegaConf.structured(DapoConfig)
    if preset:
        path = preset_path(preset)
        try:
            raw = _load_yaml(path)
        except Exception as e:
            raise ConfigError([f"{path}: cannot read the yaml: {str(e).splitlines()[0]}"]) from e
        # a built-in preset's keys are not the user's: the warnings never name them
        given = _Given(user if is_user_file(preset) else UserKeys(), source=f"{path}: ")
        _merge_file(cfg, raw, "", given, found)
    found.extend(_apply_overrides(cfg, overrides or [], _Given(user, source="")))
    found.extend(_apply_aliases(cfg, overrides or []))
    try:
        OmegaConf.resolve(cfg)
    except Exception as e:
        found.append(f"cannot resolve interpolations: {e}")
    if problems is not None:
        problems.extend(found)
    elif found:
        raise ConfigError(found)
    return cfg


class _Given:
    """What one source (a yaml file, the command line) set: recorded in ``user``, with the verl
    spelling each key was given in (two spellings of one key in one source that disagree are a
    problem; a later source simply overrides) and the prefix of the source's messages."""

    def __init__(self, user: UserKeys, source: str):
        self.user, self.source = user, source
        self.spelled: dict[str, tuple[str, Any]] = {}

    def set(self, key: str, spelling: str, value: Any) -> str | None:
        """Record that ``spelling`` set ``key`` to ``value``; a problem if another spelling of the
        same key set another value."""
        self.user.set.add(key)
        before = self.spelled.get(key)
        self.spelled[key] = (spelling, value)
        if before is not None and before[0] != spelling and before[1] != value:
            return (
                f"{before[0]}={before[1]} and {spelling}={value} are both set and disagree "
                f"(verl spells {key} both ways); keep one of them"
            )
        return None


def _merge_file(cfg: DictConfig, raw: DictConfig, prefix: str, given: _Given, problems: list[str]) -> None:
    """Merge a yaml file key by key, so one bad entry does not hide the next."""
    for k in raw.keys():
        spelling = f"{prefix}{k}"
        key = verl_alias(spelling) or spelling
        value = raw._get_node(k)
        if not _has_key(cfg, key) and not _under_free_dict(cfg, key):
            plain = _plain_node(value)
            problems.extend(given.source + p for p in _outside_schema(cfg, spelling, plain, given))
            continue
        target = OmegaConf.select(cfg, key, default=None) if _has_key(cfg, key) else None
        if (
            isinstance(value, DictConfig)
            and isinstance(target, DictConfig)
            and target._metadata.object_type not in (dict, None)
        ):
            _merge_file(cfg, value, key + ".", given, problems)
            continue
        problems.extend(given.source + p for p in _set(cfg, key, spelling, _plain_node(value), given))


def _plain_node(value: Any) -> Any:
    if isinstance(value, DictConfig | ListConfig):
        return OmegaConf.to_container(value, resolve=False)
    return value._value()


def _set(
    cfg: DictConfig, key: str, spelling: str, value: Any, given: _Given, label: str | None = None
) -> list[str]:
    """Set a key of the schema (or of a free-form dict in it) as the user spelled it; a bad value
    is a problem named by ``label`` (default: the spelling)."""
    if value is None and (spelling != key or key in NULL_MEANS_UNSET):
        return []  # verl's null in a second spelling, or in its legacy reward block, means "not set here"
    try:
        OmegaConf.update(cfg, key, value, merge=True, force_add=True)
    except Exception as e:  # omegaconf raises many types; name the key
        return [f"{label or spelling}: {_omegaconf_message(e, cfg)}"]
    conflict = given.set(key, spelling, value)
    return [conflict] if conflict else []


def _outside_schema(cfg: DictConfig, key: str, value: Any, given: _Given) -> list[str]:
    """A key the schema lacks: verl's other spelling of a key, an accepted verl key (recorded for
    the warnings), a block of such keys, or an unknown key (a problem naming it)."""
    target = verl_alias(key)
    if target is not None:
        if not _has_key(cfg, target) and not _under_free_dict(cfg, target):
            return [_unknown_key(cfg, target)]
        return _set(cfg, target, key, value, given)
    if isinstance(value, dict) and value:  # a block: each key in it is checked on its own
        return [p for k, v in value.items() for p in _outside_schema(cfg, f"{key}.{k}", v, given)]
    if ignored_group(key) is not None:
        given.user.ignored[key] = value
        return []
    return [_unknown_key(cfg, key)]


def _load_yaml(path: Path) -> DictConfig:
    raw = OmegaConf.load(path)
    raw.pop("defaults", None)
    return raw


def _apply_overrides(cfg: DictConfig, overrides: list[str], given: _Given) -> list[str]:
    """Apply ``key=value`` overrides; every one that cannot be applied is skipped and described."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType
    from hydra.errors import OverrideParseException

    problems: list[str] = []
    parser = OverridesParser.create()
    for text in overrides:
        try:
            (ov,) = parser.parse_overrides([text])
        except OverrideParseException as e:
            problems.append(f"cannot parse override {text!r}: {str(e).splitlines()[0]} (write key=value)")
            continue
        spelling = ov.key_or_group
        key = verl_alias(spelling) or spelling
        exists = _has_key(cfg, key)
        if ov.type == OverrideType.DEL:
            if exists:
                default = OmegaConf.select(OmegaConf.structured(DapoConfig), key)
                OmegaConf.update(cfg, key, default, merge=False)
                given.user.set.add(key)
            elif ignored_group(spelling) is None:
                problems.append(_unknown_key(cfg, key))
            continue
        value = _plain(ov.value())
        if not exists and not _under_free_dict(cfg, key):
            problems.extend(_outside_schema(cfg, spelling, value, given))
            continue
        label = f"{spelling}={ov.get_value_element_as_str()}"
        problems.extend(_set(cfg, key, spelling, value, given, label))
    return problems


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _has_key(cfg: DictConfig, key: str) -> bool:
    node: Any = cfg
    for part in key.split("."):
        if isinstance(node, DictConfig) and part in node:
            node = node._get_node(part)
        else:
            return False
    return True


def _under_free_dict(cfg: DictConfig, key: str) -> bool:
    """True when ``key`` lies inside a free-form dict field (override_config, reward_kwargs, ...)."""
    parts = key.split(".")
    node: Any = cfg
    for part in parts[:-1]:
        if not isinstance(node, DictConfig) or part not in node:
            return False
        node = node._get_node(part)
        if (
            isinstance(node, DictConfig)
            and node._metadata.object_type in (dict, None)
            and not node._get_flag("struct")
        ):
            return True
    return False


def leaf_keys(cfg: DictConfig, prefix: str = "") -> list[str]:
    out = []
    for k in cfg.keys():
        node = cfg._get_node(k)
        path = f"{prefix}{k}"
        out.append(path)
        if isinstance(node, DictConfig):
            out.extend(leaf_keys(node, path + "."))
    return out


# keys of earlier dapo versions that were replaced: old key -> what to set instead
RETIRED_KEYS: dict[str, str] = {
    "algorithm.filter_groups.skip.max_consecutive": (
        "algorithm.filter_groups.skip.revisit_epochs (the revisit bound now counts policy updates, not draws)"
    ),
}


# verl's other spellings of dapo's keys -> dapo's key; an entry ending in "." renames a block.
# verl 0.9 moved the reward keys under reward.*; the FSDP engine reads optim.clip_grad and
# fsdp_config.ulysses_sequence_parallel_size; warmup_style is the deprecated lr_scheduler_type
VERL_ALIASES: dict[str, str] = {
    "reward.reward_manager.name": "reward_model.reward_manager",
    "reward_manager.name": "reward_model.reward_manager",
    "reward.reward_model.enable": "reward_model.enable",
    "reward.reward_kwargs.": "reward_model.reward_kwargs.",
    "reward.custom_reward_function.": "custom_reward_function.",
    "actor_rollout_ref.actor.optim.clip_grad": "actor_rollout_ref.actor.grad_clip",
    "actor_rollout_ref.actor.optim.warmup_style": "actor_rollout_ref.actor.optim.lr_scheduler_type",
    "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size": (
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size"
    ),
    "actor_rollout_ref.ref.fsdp_config.ulysses_sequence_parallel_size": (
        "actor_rollout_ref.ref.ulysses_sequence_parallel_size"
    ),
    # verl 0.9's V1 trainer: its mode and its sampler's staleness bound
    "trainer.v1.trainer_mode": "async_training.mode",
    "trainer.v1.sampler.max_off_policy_threshold": "async_training.max_off_policy_threshold",
    "trainer.v1.sampler.max_off_policy_strategy": "async_training.max_off_policy_strategy",
}


# keys whose null verl 0.9 writes in its legacy reward_model block for "given under reward.*"
NULL_MEANS_UNSET = frozenset(
    {"reward_model.enable", "reward_model.reward_manager", "custom_reward_function.name"}
)


def verl_alias(key: str) -> str | None:
    """dapo's key for verl's other spelling ``key``, or None when ``key`` is not one."""
    if key in VERL_ALIASES:
        return VERL_ALIASES[key]
    for alias, target in VERL_ALIASES.items():
        if alias.endswith(".") and (key + ".").startswith(alias):
            return (target + key[len(alias) :]).rstrip(".")
    return None


def _unknown_key(cfg: DictConfig, key: str) -> str:
    if key in RETIRED_KEYS:
        return f"{key}: no longer a configuration key; it was replaced by {RETIRED_KEYS[key]}"
    foreign = foreign_hint(key)
    if foreign is not None:
        return f"{key}: unknown configuration key; dapo's name for it is {foreign}"
    known = [*leaf_keys(cfg), *ignored_key_names()]  # a misspelt verl key is suggested too
    close = difflib.get_close_matches(key, known, n=3, cutoff=0.6)
    if not close:
        tail = key.split(".")[-1]
        close = [k for k in known if k.split(".")[-1] == tail][:3]
    hint = f"; did you mean {' or '.join(close)}?" if close else "; `dapo validate --explain` lists every key"
    return f"{key}: unknown configuration key{hint}"


def _omegaconf_message(e: Exception, cfg: DictConfig) -> str:
    msg = str(e).splitlines()[0]
    key = getattr(e, "full_key", None)
    return f"{key}: {msg}" if key and key not in msg else msg


OVERLONG_ALIAS = "reward_model.reward_kwargs.overlong_buffer_cfg"


def _apply_aliases(cfg: DictConfig, overrides: list[str]) -> list[str]:
    """verl spells some keys two ways; read the other spelling into our one key, here only.

    ``reward_model.reward_kwargs.overlong_buffer_cfg.*`` (verl scripts add it with ``+``) is merged
    key by key over ``reward_model.overlong_buffer`` (preset and overrides applied), so a partial
    alias changes only the keys it names; it then leaves ``reward_kwargs``, and nothing reads it
    again. Setting a key both ways on the command line, to different values, is a problem."""
    kwargs = cfg.reward_model.reward_kwargs
    if kwargs is None or "overlong_buffer_cfg" not in kwargs:
        return []
    alias = kwargs.pop("overlong_buffer_cfg")
    if alias is None:
        return []
    if not isinstance(alias, DictConfig | dict):
        return [f"{OVERLONG_ALIAS}: must be a mapping of enable, len, penalty_factor, log; got {alias!r}"]
    primary = cfg.reward_model.overlong_buffer
    set_primary = {
        text.lstrip("+").split("=", 1)[0].removeprefix("reward_model.overlong_buffer.")
        for text in overrides
        if text.lstrip("+").startswith("reward_model.overlong_buffer.")
    }
    problems = []
    for k, v in alias.items():
        if k not in primary:
            problems.append(f"{OVERLONG_ALIAS}.{k}: unknown key; known: {', '.join(primary.keys())}")
            continue
        if k in set_primary and primary[k] != v:
            problems.append(
                f"{OVERLONG_ALIAS}.{k}={v} and reward_model.overlong_buffer.{k}={primary[k]} are both set "
                "and disagree; keep one of them"
            )
            continue
        try:
            primary[k] = v
        except Exception as e:
            problems.append(f"{OVERLONG_ALIAS}.{k}={v}: {_omegaconf_message(e, cfg)}")
    return problems


def to_yaml(cfg: Any) -> str:
    """A config (a DictConfig or the schema's dataclasses) as yaml."""
    return OmegaConf.to_yaml(cfg if isinstance(cfg, DictConfig) else OmegaConf.structured(cfg))
