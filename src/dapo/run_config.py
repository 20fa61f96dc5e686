"""A run's configuration with every rule checked: ``dapo.config.pipeline.build_config`` given the
rules the components own.

``dapo.config`` sits below everything that reads it and imports none of it; the rules that need a
component's knowledge live with that component and are handed in here: the names dapo.algo
registers (estimators, policy losses, aggregation modes, KL estimators), the built-in tasks, the
reward managers and objective names, the tool config that must load, the attention heads a Ulysses SP size must split. ``dapo validate``,
``dapo train`` and ``dapo eval`` all build their config with ``build_run_config``, so a config
that validates cannot fail later on a rule.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

from dapo.config.load import DEFAULT_PRESET
from dapo.config.pipeline import Rule, RunConfig, build_config

# the modules whose ``config_problems(cfg)`` is a rule of every run, in the order their problems
# are listed; each is imported when its rule runs, so importing this module stays light
RULE_MODULES = (
    "dapo.algo.config_rules",
    "dapo.tasks",
    "dapo.reward.factory",
    "dapo.tools.config",
    "dapo.distributed.ulysses",
)


def _rule(module: str) -> Rule:
    def rule(cfg: Any) -> list[str]:
        return importlib.import_module(module).config_problems(cfg)

    rule.__qualname__ = rule.__name__ = f"{module}.config_problems"
    return rule


COMPONENT_RULES: tuple[Rule, ...] = tuple(_rule(m) for m in RULE_MODULES)


def build_run_config(
    overrides: Sequence[str] | None = None,
    preset: str | None = DEFAULT_PRESET,
    extra_rules: Sequence[Rule] = (),
) -> RunConfig:
    """The run's configuration (``RunConfig.cfg`` is what the trainer takes); raises
    ``dapo.config.load.ConfigError`` naming every problem. ``extra_rules`` are checked with the
    components' (``dapo validate`` adds this machine's files and devices)."""
    return build_config(overrides, preset, rules=(*COMPONENT_RULES, *extra_rules))
