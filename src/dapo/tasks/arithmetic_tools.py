"""Built-in task where a tool genuinely helps: two-digit products, with a calculator.

A tiny model cannot multiply 37*48 in its head (the arithmetic warm start never shows it a
right product), but it can write a calculator call and copy the result. A share of easy
one-digit sums, which it answers directly, keeps "when to call" part of the task. Rows are
verl-schema with the multi-turn fields verl's tool preprocessors add:
``extra_info.need_tools_kwargs`` and ``extra_info.tools_kwargs.calculator.create_kwargs``.
Graded by math_dapo (``data_source="arithmetic"``): the response must end with ``Answer: X``.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from pathlib import Path

from dapo.tasks.arithmetic import DATA_SOURCE, Problem, split_problems

TOOL_NAME = "calculator"
# share of each kind in the generated data
KIND_WEIGHTS = {"easy": 0.25, "hard": 0.75}


def tool_problems(pool: list[Problem], count: int, seed: int) -> list[Problem]:
    rng = random.Random(seed)
    easy = [p for p in pool if p.tier == "easy"]
    hard = [p for p in pool if p.tier == "hard"]
    n_easy = round(count * KIND_WEIGHTS["easy"])
    out = [rng.choice(easy) for _ in range(n_easy)] + rng.sample(hard, min(count - n_easy, len(hard)))
    rng.shuffle(out)
    return out


def to_tool_row(p: Problem, split: str, index: int) -> dict:
    gt = str(p.answer)
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": p.question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": gt},
        "extra_info": {
            "split": split,
            "index": index,
            "tier": p.tier,
            "question": p.question,
            "need_tools_kwargs": True,
            "tools_kwargs": {TOOL_NAME: {"create_kwargs": {"ground_truth": gt}}},
        },
    }


def write_tool_task(
    out_dir: str | Path, train_size: int = 3000, test_size: int = 128, seed: int = 0
) -> tuple[Path, Path]:
    """Write ``train.parquet`` and ``test.parquet`` (disjoint problems) under ``out_dir``."""
    from dapo.data.parquet import write_train_test

    train_pool, test_pool = split_problems(seed)
    train = tool_problems(train_pool, train_size, seed + 11)
    test = tool_problems(test_pool, test_size, seed + 12)
    return write_train_test(
        out_dir,
        [to_tool_row(p, "train", i) for i, p in enumerate(train)],
        [to_tool_row(p, "test", i) for i, p in enumerate(test)],
    )


def tool_task_fingerprint(train_size: int = 3000, test_size: int = 128, seed: int = 0) -> str:
    train_pool, test_pool = split_problems(seed)
    sample = tool_problems(train_pool, 16, seed) + tool_problems(test_pool, 16, seed)
    text = repr((KIND_WEIGHTS, train_size, test_size, seed, TOOL_NAME, [p.question for p in sample]))
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def ensure_tool_task(log: Callable[[str], None] = lambda line: None) -> tuple[Path, Path]:
    """The task's ``train.parquet`` and ``test.parquet`` in the dapo cache, written on first use."""
    from dapo.tasks.cache import ensure_task_files

    return ensure_task_files("arithmetic-tools", tool_task_fingerprint(), write_tool_task, log)
