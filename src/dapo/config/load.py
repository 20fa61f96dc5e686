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

DEFAULT_PRESET = "default"


class ConfigError(ValueError):
    """One or more configuration problems; each names the key and how to fix it."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
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


def load_config(overrides: list[str] | None = None, preset: str | None = DEFAULT_PRESET) -> DictConfig:
    """The resolved, schema-checked configuration. Raises ConfigError on unknown keys or bad values."""
    cfg = OmegaConf.structured(DapoConfig)
    if preset:
        path = preset_path(preset)
        try:
            cfg = OmegaConf.merge(cfg, _load_yaml(path))
        except Exception as e:  # omegaconf raises many types; name the file and the key
            raise ConfigError([f"{path}: {_omegaconf_message(e, cfg)}"]) from e
    apply_overrides(cfg, overrides or [])
    _apply_aliases(cfg)
    try:
        OmegaConf.resolve(cfg)
    except Exception as e:
        raise ConfigError([f"cannot resolve interpolations: {e}"]) from e
    return cfg


def _load_yaml(path: Path) -> DictConfig:
    raw = OmegaConf.load(path)
    raw.pop("defaults", None)
    return raw


def apply_overrides(cfg: DictConfig, overrides: list[str]) -> None:
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
    if problems:
        raise ConfigError(problems)


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


def _unknown_key(cfg: DictConfig, key: str) -> str:
    close = difflib.get_close_matches(key, leaf_keys(cfg), n=3, cutoff=0.6)
    if not close:
        tail = key.split(".")[-1]
        close = [k for k in leaf_keys(cfg) if k.split(".")[-1] == tail][:3]
    hint = f"; did you mean {' or '.join(close)}?" if close else "; `dapo validate` prints every known key"
    return f"{key}: unknown configuration key{hint}"


def _omegaconf_message(e: Exception, cfg: DictConfig) -> str:
    msg = str(e).splitlines()[0]
    key = getattr(e, "full_key", None)
    return f"{key}: {msg}" if key and key not in msg else msg


def _apply_aliases(cfg: DictConfig) -> None:
    """verl spells some keys two ways; read the newer spelling into our one key."""
    kwargs = cfg.reward_model.reward_kwargs
    alias = kwargs.get("overlong_buffer_cfg") if kwargs is not None else None
    if alias:
        for k, v in alias.items() if isinstance(alias, DictConfig | dict) else []:
            if k not in cfg.reward_model.overlong_buffer:
                raise ConfigError(
                    [
                        f"reward_model.reward_kwargs.overlong_buffer_cfg.{k}: unknown key; "
                        "known: enable, len, penalty_factor, log"
                    ]
                )
            cfg.reward_model.overlong_buffer[k] = v


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg)


def as_container(cfg: DictConfig | ListConfig) -> Any:
    return OmegaConf.to_container(cfg, resolve=True)
