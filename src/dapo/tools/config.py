"""Tool config files in verl's shape (``multi_turn.tool_config_path``)::

    tools:
      - class_name: verl.tools.gsm8k_tool.Gsm8kTool   # or dapo.tools.gsm8k.Gsm8kTool, or "gsm8k"
        config: {type: native}
        tool_schema:                                 # an OpenAI function schema
          type: function
          function:
            name: calc_gsm8k_reward
            description: ...
            parameters: {type: object, properties: {answer: {type: string}}, required: [answer]}

``tool_schema`` may be left out for a built-in tool (its default schema is used).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from dapo.errors import DapoError
from dapo.tools.base import BaseTool, resolve_tool_class
from dapo.tools.parser import PARSERS

BUILTIN_CONFIG_DIR = Path(__file__).with_name("configs")


class ToolConfigError(DapoError, ValueError):
    pass


def resolve_config_path(path: str | Path) -> Path:
    """A file path, or the name of a config shipped in ``dapo/tools/configs`` (e.g. ``calculator``)."""
    p = Path(path).expanduser()
    if p.exists():
        return p
    for cand in (BUILTIN_CONFIG_DIR / f"{path}.yaml", BUILTIN_CONFIG_DIR / str(path)):
        if cand.exists():
            return cand
    shipped = sorted(f.stem for f in BUILTIN_CONFIG_DIR.glob("*.yaml"))
    raise ToolConfigError(
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={path!r}: no such file (built-in configs: {shipped})"
    )


def tools_from_config(data: Any, source: str = "tool config") -> list[BaseTool]:
    if not isinstance(data, dict) or not isinstance(data.get("tools"), list):
        raise ToolConfigError(f"{source}: expected a mapping with a 'tools:' list")
    tools: list[BaseTool] = []
    for i, entry in enumerate(data["tools"]):
        if not isinstance(entry, dict) or "class_name" not in entry:
            raise ToolConfigError(f"{source}: tools[{i}] needs class_name")
        try:
            cls = resolve_tool_class(str(entry["class_name"]))
            tool = cls(config=dict(entry.get("config") or {}), tool_schema=entry.get("tool_schema"))
        except ValueError as exc:
            raise ToolConfigError(f"{source}: tools[{i}]: {exc}") from exc
        tools.append(tool)
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise ToolConfigError(f"{source}: tool names must be unique, got {names}")
    return tools


def load_tool_config(path: str | Path) -> list[BaseTool]:
    """Instantiate the tools listed in a verl-shaped tool config YAML."""
    p = resolve_config_path(path)
    with open(p) as f:
        data = yaml.safe_load(f)
    return tools_from_config(data, str(p))


def config_problems(cfg: Any) -> list[str]:
    """The tool config of a multi-turn run must load: loading builds each tool, which checks its
    own config (the code interpreter refuses to start without an OS sandbox unless its config
    opts in to the weak mode), so a bad file is named before any work (``dapo.run_config``)."""
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    if mt.format not in PARSERS:
        return [
            f"actor_rollout_ref.rollout.multi_turn.format: must be one of {', '.join(sorted(PARSERS))}, got {mt.format!r}"
        ]
    if not (mt.enable and mt.tool_config_path):
        return []
    path = str(mt.tool_config_path)
    try:
        load_tool_config(path)
    except ToolConfigError as exc:
        return [f"actor_rollout_ref.rollout.multi_turn.tool_config_path: {exc}"]
    except (OSError, yaml.YAMLError) as exc:
        return [f"actor_rollout_ref.rollout.multi_turn.tool_config_path={path!r}: cannot read it: {exc}"]
    return []
