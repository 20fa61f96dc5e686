"""The built-in tasks and the tiny models warm-started on them, built on first use into the dapo
cache (``$DAPO_CACHE``, default ``~/.cache/dapo``) by one mechanism, ``cache.ensure_built``.

* ``arithmetic``: the default task (integer arithmetic in three tiers, ``Answer: X``), and
  ``tiny_model``, the default model warm-started on it (``dapo train`` with no model path);
* ``arithmetic_tools``: the same problems for the calculator tool, and ``tiny_tool_model``,
  warm-started to call it (``dapo train --config-name tools``);
* ``reasoning``: chained operations with written working, and ``tiny_reasoning_model``
  (``dapo train --config-name reasoning``); ``reasoning_sparse``: the same chains and model,
  most of them beyond the model's reach, few groups with spread (``data.builtin_task=reasoning_sparse``);
  ``reasoning_wide``: a pool of 1536 of them for coverage measurements, held out on every tier;
* ``arithmetic_chat``: chat-form word problems for a real instruct model (``docs/smollm2.md``).

Each folder's name carries a fingerprint of its recipe, so a changed recipe builds anew.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

#: ``data.builtin_task`` values (the tool task is chosen by ``multi_turn.enable`` instead)
BUILTIN_TASKS = ("arithmetic", "reasoning", "reasoning_sparse", "reasoning_wide")


def builtin_task_name(cfg: Any) -> str:
    """The built-in task a run uses when it names no data or model: ``tools`` with multi-turn
    rollouts, else ``data.builtin_task``."""
    return "tools" if cfg.actor_rollout_ref.rollout.multi_turn.enable else str(cfg.data.builtin_task)


def builtin_task(
    name: str = "arithmetic", log: Callable[[str], None] = lambda line: None
) -> tuple[Path, Path]:
    """``(train.parquet, test.parquet)`` of the built-in task ``name``."""
    if name == "tools":
        from dapo.tasks.arithmetic_tools import ensure_tool_task

        return ensure_tool_task(log)
    if name == "reasoning":
        from dapo.tasks.reasoning import ensure_reasoning_task

        return ensure_reasoning_task(log)
    if name == "reasoning_sparse":
        from dapo.tasks.reasoning import ensure_sparse_task

        return ensure_sparse_task(log)
    if name == "reasoning_wide":
        from dapo.tasks.reasoning import ensure_wide_task

        return ensure_wide_task(log)
    from dapo.tasks.arithmetic import ensure_task

    return ensure_task(log)


def builtin_model(name: str = "arithmetic", log: Callable[[str], None] = print) -> Path:
    """The directory of the model warm-started on the built-in task ``name``."""
    if name == "tools":
        from dapo.tasks.tiny_tool_model import ensure_tiny_tool_model

        return ensure_tiny_tool_model(log=log)
    if name in ("reasoning", "reasoning_sparse", "reasoning_wide"):
        from dapo.tasks.tiny_reasoning_model import ensure_reasoning_model

        return ensure_reasoning_model(log=log)
    from dapo.tasks.tiny_model import ensure_tiny_model

    return ensure_tiny_model(log=log)
