"""Building a run's configuration: schema defaults <- preset <- ``key=value`` overrides.

Overrides use Hydra's grammar, as verl users write them: ``a.b=1``, ``+a.b=1`` (add),
``++a.b=1`` (add or change), ``~a.b`` (delete, resets to the default), lists ``[1,2]``, ``null``.
"""

from __future__ import annotations

import difflib
from importlib import resources
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

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


def load_config(
    overrides: list[str] | None = None,
    preset: str | None = DEFAULT_PRESET,
    problems: list[str] | None = None,
) -> DictConfig:
    """The schema-checked configuration (interpolations resolved). Raises ConfigError naming every
    unknown key and bad value, or, when ``problems`` is given, appends them to it and returns the
    config without the bad entries (so cross-field checks can still run)."""
    found: list[str] = []
    cfg = OmegaConf.structured(DapoConfig)
    if preset:
        path = preset_path(preset)
        try:
            raw = _load_yaml(path)
        except Exception as e:
            raise ConfigError([f"{path}: cannot read the yaml: {str(e).splitlines()[0]}"]) from e
        _merge_file(cfg, raw, "", path, found)
    found.extend(_apply_overrides(cfg, overrides or []))
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


def _merge_file(cfg: DictConfig, raw: DictConfig, prefix: str, path: Path, problems: list[str]) -> None:
    """Merge a yaml file key by key, so one bad entry does not hide the next."""
    for k in raw.keys():
        key = f"{prefix}{k}"
        value = raw._get_node(k)
        if not _has_key(cfg, key) and not _under_free_dict(cfg, key):
            problems.append(f"{path}: {_unknown_key(cfg, key)}")
            continue
        target = OmegaConf.select(cfg, key, default=None) if _has_key(cfg, key) else None
        if (
            isinstance(value, DictConfig)
            and isinstance(target, DictConfig)
            and target._metadata.object_type not in (dict, None)
        ):
            _merge_file(cfg, value, key + ".", path, problems)
            continue
        plain = (
            OmegaConf.to_container(value, resolve=False)
            if isinstance(value, DictConfig | ListConfig)
            else value._value()
        )
        try:
            OmegaConf.update(cfg, key, plain, merge=True, force_add=True)
        except Exception as e:  # omegaconf raises many types; name the file and the key
            problems.append(f"{path}: {key}: {_omegaconf_message(e, cfg)}")


def _load_yaml(path: Path) -> DictConfig:
    raw = OmegaConf.load(path)
    raw.pop("defaults", None)
    return raw


def _apply_overrides(cfg: DictConfig, overrides: list[str]) -> list[str]:
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
        key = ov.key_or_group
        exists = _has_key(cfg, key)
        if ov.type == OverrideType.DEL:
            if not exists:
                problems.append(_unknown_key(cfg, key))
                continue
            OmegaConf.update(cfg, key, OmegaConf.select(OmegaConf.structured(DapoConfig), key), merge=False)
            continue
        value = _plain(ov.value())
        if not exists and not _under_free_dict(cfg, key):
            problems.append(_unknown_key(cfg, key))
            continue
        try:
            OmegaConf.update(cfg, key, value, merge=True, force_add=True)
        except Exception as e:
            problems.append(f"{key}={ov.get_value_element_as_str()}: {_omegaconf_message(e, cfg)}")
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


def _unknown_key(cfg: DictConfig, key: str) -> str:
    from dapo.config.compat import foreign_hint

    if key in RETIRED_KEYS:
        return f"{key}: no longer a configuration key; it was replaced by {RETIRED_KEYS[key]}"
    foreign = foreign_hint(key)
    if foreign is not None:
        return f"{key}: unknown configuration key; dapo's name for it is {foreign}"
    close = difflib.get_close_matches(key, leaf_keys(cfg), n=3, cutoff=0.6)
    if not close:
        tail = key.split(".")[-1]
        close = [k for k in leaf_keys(cfg) if k.split(".")[-1] == tail][:3]
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
