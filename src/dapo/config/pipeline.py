"""A run's configuration, built once: load -> merge -> validate -> resolve.

``build_config`` is the one way a run's configuration is made (``dapo validate``, ``dapo
train`` and ``dapo eval`` all call it): the schema's defaults, the preset and the ``key=value``
overrides are merged with verl's aliases read into their one key and the verl keys dapo accepts
and ignores set aside (``dapo.config.load``, ``dapo.config.compat``); every rule is checked at once, the configuration's own (``dapo.config.validate``) and those the
components hand in as ``rules`` (the names they register, the files they read: see
``dapo.run_config``); every null-means-X key is filled (``dapo.config.resolve``); and the result
is the schema's typed dataclasses. So a configuration that validates cannot fail later on a
configuration rule, and nothing downstream validates or resolves it again.

After the training data loads, ``finalize_steps`` (the step count from the data's size) is the
only later derivation; it returns a new config.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from dapo.config.compat import UserKeys, unimplemented_problems
from dapo.config.load import DEFAULT_PRESET, ConfigError, load_config
from dapo.config.resolve import count_train_rows, finalize_steps, resolve, typed
from dapo.config.schema import DapoConfig
from dapo.config.validate import config_warnings, validate

__all__ = ["Rule", "RunConfig", "build_config", "finalize_steps"]

# a component's rule: every problem it finds with the loaded config, each naming the key
Rule = Callable[[Any], list[str]]


@dataclass(frozen=True)
class RunConfig:
    """What ``build_config`` makes. ``cfg`` is what the run uses (resolved, typed; nothing
    writes to it); ``loaded`` is the configuration as given (preset and overrides merged,
    nothing derived), which ``--explain`` and the warnings compare it with; ``warnings`` are the
    verl keys the user set that are accepted and ignored (``dapo.config.compat``) and the settings
    that run but may surprise (``dapo.config.validate.config_warnings``)."""

    cfg: DapoConfig
    loaded: DictConfig
    warnings: tuple[str, ...]


def build_config(
    overrides: Sequence[str] | None = None,
    preset: str | None = DEFAULT_PRESET,
    rules: Sequence[Rule] = (),
) -> RunConfig:
    """The run's configuration. Raises ``ConfigError`` listing every problem at once."""
    problems: list[str] = []
    user = UserKeys()
    loaded = load_config(list(overrides or []), preset=preset, problems=problems, user=user)
    problems += validate(loaded)
    # verl keys accepted but not implemented: refused values, and notes on the keys the user set
    refused, notes = unimplemented_problems(loaded, user)
    problems += refused
    for rule in rules:
        try:
            problems += rule(loaded)
        except Exception:
            if not problems:
                raise
            # a rule that reads a value the problems above left broken (an interpolation that
            # does not resolve) has nothing to add to them
    if problems:
        raise ConfigError(problems)
    # the step count is known now when the parquet footers tell the number of rows
    resolved = resolve(loaded, num_train_rows=count_train_rows(loaded))
    return RunConfig(typed(resolved), loaded, (*notes, *config_warnings(loaded, resolved)))
