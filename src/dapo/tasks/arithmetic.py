"""Built-in arithmetic task in verl's parquet schema.

Problems come in three tiers so that dynamic sampling matters:
  easy    one-digit sums and differences: a warm-started model nearly always solves them
  medium  two-digit plus or minus one-digit numbers without carry or borrow: solved sometimes
  hard    two-digit by two-digit products: nearly never solved by a tiny model
Answers are graded by the math_dapo rules: the response must end with ``Answer: X``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

DATA_SOURCE = "arithmetic"
TIERS = ("easy", "medium", "hard")
# Share of each tier in the generated data: most prompts are medium (sometimes solved).
TIER_WEIGHTS = {"easy": 0.15, "medium": 0.7, "hard": 0.15}


@dataclass(frozen=True)
class Problem:
    a: int
    op: str
    b: int
    tier: str

    @property
    def answer(self) -> int:
        if self.op == "+":
            return self.a + self.b
        if self.op == "-":
            return self.a - self.b
        return self.a * self.b

    @property
    def question(self) -> str:
        return f"{self.a}{self.op}{self.b}="

    @property
    def key(self) -> str:
        return f"{self.a}{self.op}{self.b}"


def all_problems() -> list[Problem]:
    """Every problem of every tier, in a fixed order."""
    out: list[Problem] = []
    for a in range(10):
        for b in range(10):
            out.append(Problem(a, "+", b, "easy"))
            if a >= b:
                out.append(Problem(a, "-", b, "easy"))
    for a in range(10, 100):
        for b in range(10):
            # no carry and no borrow: copy the tens digit, apply a one-digit fact to the units
            if a % 10 + b <= 9:
                out.append(Problem(a, "+", b, "medium"))
            if a % 10 >= b:
                out.append(Problem(a, "-", b, "medium"))
    for a in range(11, 100):
        for b in range(11, 100):
            out.append(Problem(a, "*", b, "hard"))
    return out


def split_by_fraction(items: list, seed: int, test_fraction: float) -> tuple[list, list]:
    """A deterministic train/test split: each item goes to test with probability ``test_fraction``."""
    rng = random.Random(seed)
    train: list = []
    test: list = []
    for p in items:
        (test if rng.random() < test_fraction else train).append(p)
    return train, test


def split_problems(seed: int = 0, test_fraction: float = 0.2) -> tuple[list[Problem], list[Problem]]:
    """A deterministic train/test split, disjoint by problem."""
    return split_by_fraction(all_problems(), seed, test_fraction)


def sample_problems(pool: list[Problem], count: int, seed: int) -> list[Problem]:
    """Up to ``count`` distinct problems, ``TIER_WEIGHTS[tier] * count`` of each tier at most
    (fewer where the tier's pool is smaller, so the tier mix stays close to the weights)."""
    rng = random.Random(seed)
    by_tier = {t: [p for p in pool if p.tier == t] for t in TIERS}
    out: list[Problem] = []
    for tier in TIERS:
        want = min(round(count * TIER_WEIGHTS[tier]), len(by_tier[tier]))
        out.extend(rng.sample(by_tier[tier], want))
    rng.shuffle(out)
    return out


def to_row(p: Problem, split: str, index: int) -> dict:
    """One verl-schema row (docs/verl_compat.md, Data)."""
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": p.question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(p.answer)},
        "extra_info": {"split": split, "index": index, "tier": p.tier, "question": p.question},
    }


def write_task(
    out_dir: str | Path, train_size: int = 1200, test_size: int = 256, seed: int = 0
) -> tuple[Path, Path]:
    """Write ``train.parquet`` and ``test.parquet`` under ``out_dir``; returns their paths."""
    from dapo.data.parquet import write_train_test

    train_pool, test_pool = split_problems(seed)
    train = sample_problems(train_pool, train_size, seed + 1)
    test = sample_problems(test_pool, test_size, seed + 2)
    return write_train_test(
        out_dir,
        [to_row(p, "train", i) for i, p in enumerate(train)],
        [to_row(p, "test", i) for i, p in enumerate(test)],
    )


def task_fingerprint(train_size: int = 1200, test_size: int = 256, seed: int = 0) -> str:
    """A short hash of the generated task, so a changed generator writes a new cache folder."""
    import hashlib

    train_pool, test_pool = split_problems(seed)
    sample = sample_problems(train_pool, 16, seed) + sample_problems(test_pool, 16, seed)
    text = repr((TIER_WEIGHTS, train_size, test_size, seed, len(train_pool), [p.question for p in sample]))
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def ensure_task(log: Callable[[str], None] = lambda line: None) -> tuple[Path, Path]:
    """The task's ``train.parquet`` and ``test.parquet`` in the dapo cache, written on first use."""
    from dapo.tasks.cache import ensure_task_files

    return ensure_task_files("arithmetic", task_fingerprint(), write_task, log)
