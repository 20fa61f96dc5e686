"""``dapo validate --explain [PREFIX]``: every key with its default, the value the run uses and
its meaning. The meanings are the comments written above each field in the schema
(``dapo.config.schema``, ``dapo.config.sampling``), so they live beside the defaults."""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import typing
from functools import cache
from typing import Any

from omegaconf import DictConfig, OmegaConf

from dapo.config.compat import unimplemented
from dapo.config.resolve import DEVICE_DEFAULT_KEYS
from dapo.config.schema import DapoConfig

_FIELD = re.compile(r"^\s+(\w+)\s*:\s*[^=]+(=|$)")


@cache
def field_comments(cls: type) -> dict[str, str]:
    """``{field: the comment lines right above it, joined}`` for one dataclass."""
    out: dict[str, str] = {}
    pending: list[str] = []
    for line in inspect.getsource(cls).splitlines()[1:]:
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
            continue
        m = _FIELD.match(line)
        if m and not stripped.startswith(("def ", "@", '"""')):
            if pending:
                out[m.group(1)] = " ".join(pending)
        pending = []
    return out


def key_docs(cls: type = DapoConfig, prefix: str = "") -> dict[str, str]:
    """``{dotted key: meaning}`` for every leaf key of the schema ('' where none is written)."""
    out: dict[str, str] = {}
    hints = typing.get_type_hints(cls)
    comments = field_comments(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        sub = hints[f.name]
        if dataclasses.is_dataclass(sub):
            out.update(key_docs(sub, key + "."))
        else:
            out[key] = comments.get(f.name, "")
    return out


def _fmt(value: Any) -> str:
    if isinstance(value, DictConfig) or OmegaConf.is_list(value):
        value = OmegaConf.to_container(value, resolve=True)
    return json.dumps(value) if isinstance(value, bool | type(None) | list | dict) else str(value)


def explain(loaded: DictConfig, resolved: Any, prefix: str = "") -> str:
    """One block per key under ``prefix``: key, default, the value the run uses (``resolved``: a
    DictConfig or the schema's dataclasses), meaning."""
    defaults = OmegaConf.structured(DapoConfig)
    if not isinstance(resolved, DictConfig):
        resolved = OmegaConf.structured(resolved)
    lines = []
    for key, doc in key_docs().items():
        if prefix and not (key == prefix or key.startswith(prefix.rstrip(".") + ".")):
            continue
        default = OmegaConf.select(defaults, key)
        value = OmegaConf.select(resolved, key)
        given = OmegaConf.select(loaded, key)
        note = "" if _fmt(given) == _fmt(value) else f" (set {_fmt(given)}, resolved)"
        if key in DEVICE_DEFAULT_KEYS and given is None:
            note = f" (set null, resolved for trainer.device={OmegaConf.select(resolved, 'trainer.device')})"
        lines.append(f"{key} = {_fmt(value)}{note}   [default {_fmt(default)}]")
        u = unimplemented().get(key)
        lines.append(f"    {doc}" + (f" [accepted, not implemented: {u.why}]" if u else ""))
    if not lines:
        raise KeyError(prefix)
    return "\n".join(lines)
