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
  ``reasoning_longtail``: chains of 1 to 16 operations, so a round's responses differ tenfold;
* ``arithmetic_chat``: chat-form word problems for a real instruct model (``docs/smollm2.md``).

Each folder's name carries a fingerprint of its recipe, so a changed recipe builds anew.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: ``data.builtin_task`` values (the tool task is chosen by ``multi_turn.enable`` instead)
BUILTIN_TASKS = ("arithmetic", "reasoning", "reasoning_sparse", "reasoning_wide", "reasoning_longtail")


def config_problems(cfg: Any) -> list[str]:
    """``data.builtin_task`` must name a built-in task, and vLLM on CPU cannot run the built-in
    models (``dapo.run_config`` hands this rule to the config pipeline)."""
    task = cfg.data.builtin_task
    out = (
        []
        if task in BUILTIN_TASKS
        else [f"data.builtin_task: must be one of {', '.join(BUILTIN_TASKS)}, got {task!r}"]
    )
    if cfg.actor_rollout_ref.rollout.name == "vllm" and cfg.actor_rollout_ref.model.path is None:
        # the built-in models' head size is known before they are built (a warm start of minutes)
        from dapo.rollout.vllm_rollout import model_head_size_problems

        out += model_head_size_problems(cfg)
    return out


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
    if name == "reasoning_longtail":
        from dapo.tasks.reasoning import ensure_longtail_task

        return ensure_longtail_task(log)
    from dapo.tasks.arithmetic import ensure_task

    return ensure_task(log)


def builtin_model(name: str = "arithmetic", log: Callable[[str], None] = print) -> Path:
    """The directory of the model warm-started on the built-in task ``name``."""
    if name == "tools":
        from dapo.tasks.tiny_tool_model import ensure_tiny_tool_model

        return ensure_tiny_tool_model(log=log)
    if name in ("reasoning", "reasoning_sparse", "reasoning_wide", "reasoning_longtail"):
        from dapo.tasks.tiny_reasoning_model import ensure_reasoning_model

        return ensure_reasoning_model(log=log)
    from dapo.tasks.tiny_model import ensure_tiny_model

    return ensure_tiny_model(log=log)


@dataclass(frozen=True)
class RunFiles:
    """The model, tokenizer and prompt files a run reads (see ``run_files``)."""

    model_path: str
    tokenizer_path: str
    train_files: Any
    val_files: Any


def run_files(cfg: Any, log: Callable[[str], None] = print) -> RunFiles:
    """The files of the resolved run config ``cfg``, with the built-in ones where it leaves them
    null, built into the cache on first use: this is the one place the built-in model and task
    stand in for ``actor_rollout_ref.model.path`` (its tokenizer too, when
    ``model.tokenizer_path`` is null) and ``data.train_files`` (its test split for validation,
    when ``data.val_files`` is null); ``builtin_task_name`` picks which. Called by the trainer
    after the config is built, so ``dapo validate`` builds nothing."""
    m, d = cfg.actor_rollout_ref.model, cfg.data
    name = builtin_task_name(cfg)
    model = str(m.path) if m.path is not None else str(builtin_model(name, log=log))
    tokenizer = str(m.tokenizer_path) if m.tokenizer_path is not None else model
    train, val = d.train_files, d.val_files
    if train is None:
        builtin_train, builtin_test = builtin_task(name)
        train = str(builtin_train)
        val = val if val is not None else str(builtin_test)
    return RunFiles(model, tokenizer, train, val)
