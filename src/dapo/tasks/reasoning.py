"""Built-in long-reasoning task: chained operations whose answer needs written working.

A problem is a start value and a chain of numbered operations, e.g.
``47 1)+8 2)-5 3)+9 4)*3 5)-7 6)+6 7)-2 8)+4 =``. The expected response writes one line per
operation: the operation as numbered in the question, then the running value before and after
it (``3)+9: 50+9=59``), and ends with ``Answer: X`` (graded by math_dapo, like every built-in
task). A chain has ``MIN_STEPS``-``MAX_STEPS`` operations, so the working alone is 128+ tokens
of the character tokenizer. Difficulty varies per prompt, so that some groups are all-correct
and some all-wrong:

  easy    one-digit additions and subtractions that never carry or borrow
  medium  one-digit additions and subtractions with carries and borrows
  hard    as medium, plus one multiplication by a digit (a step the warm start never gets right)

Nothing here runs model output: rows are data, and the grader is the math_dapo regex.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dapo.tasks.arithmetic import to_row  # the same verl-schema rows (question, answer, tier)

TIERS = ("easy", "medium", "hard")
TIER_WEIGHTS = {"easy": 0.25, "medium": 0.5, "hard": 0.25}
MIN_STEPS, MAX_STEPS = 9, 12


@dataclass(frozen=True)
class Chain:
    start: int
    ops: tuple[tuple[str, int], ...]  # ("+" | "-" | "*", operand)
    tier: str

    def values(self) -> list[int]:
        """The running value after each operation."""
        out, v = [], self.start
        for op, x in self.ops:
            v = apply(v, op, x)
            out.append(v)
        return out

    @property
    def answer(self) -> int:
        return self.values()[-1]

    @property
    def question(self) -> str:
        return f"{self.start} " + " ".join(f"{i}){op}{x}" for i, (op, x) in enumerate(self.ops, 1)) + " ="


def apply(v: int, op: str, x: int) -> int:
    if op == "+":
        return v + x
    if op == "-":
        return v - x
    if op == "*":
        return v * x
    raise ValueError(f"unknown operation {op!r}")


def step_line(i: int, before: int, op: str, x: int, after: int) -> str:
    """One line of working: the step number, the operation on the running value, the result."""
    return f"{i}){op}{x}: {before}{op}{x}={after}\n"


def working(chain: Chain, values: list[int] | None = None) -> str:
    """The written working for ``chain`` with running ``values`` (the right ones by default),
    ending ``Answer: <last value>``."""
    values = chain.values() if values is None else values
    lines, before = [], chain.start
    for i, ((op, x), after) in enumerate(zip(chain.ops, values), start=1):
        lines.append(step_line(i, before, op, x, after))
        before = after
    return "".join(lines) + f"Answer: {values[-1]}"


def _op(rng: random.Random, v: int, carry: bool) -> tuple[str, int]:
    """A +/- one-digit step keeping the value in 10..99; without ``carry`` the units digit
    never wraps (no carry, no borrow)."""
    while True:
        op, x = rng.choice("+-"), rng.randint(1, 9)
        w = apply(v, op, x)
        if not 10 <= w <= 99:
            continue
        wraps = w // 10 != v // 10
        if carry or not wraps:
            return op, x


def make_chain(rng: random.Random, tier: str) -> Chain:
    steps = rng.randint(MIN_STEPS, MAX_STEPS)
    start = rng.randint(10, 99)
    ops: list[tuple[str, int]] = []
    v = start
    mul_at = rng.randrange(1, steps - 1) if tier == "hard" else -1
    for i in range(steps):
        if i == mul_at:
            op, x = "*", rng.randint(3, 9)
        elif v > 99:  # after the multiplication: plain +/- on a three-digit value
            op, x = rng.choice("+-"), rng.randint(1, 9)
        else:
            op, x = _op(rng, v, carry=tier != "easy")
        ops.append((op, x))
        v = apply(v, op, x)
    return Chain(start, tuple(ops), tier)


def make_chains(count: int, seed: int) -> list[Chain]:
    """``count`` distinct chains, ``TIER_WEIGHTS`` of each tier, in a seeded shuffled order."""
    rng = random.Random(seed)
    out: list[Chain] = []
    seen: set[str] = set()
    for tier in TIERS:
        want = round(count * TIER_WEIGHTS[tier])
        while want:
            c = make_chain(rng, tier)
            if c.question not in seen:
                seen.add(c.question)
                out.append(c)
                want -= 1
    rng.shuffle(out)
    return out


def split_chains(train_size: int, test_size: int, seed: int) -> tuple[list[Chain], list[Chain]]:
    """Disjoint train and test chains (by question)."""
    test = make_chains(test_size, seed + 1)
    test_q = {c.question for c in test}
    train = [c for c in make_chains(train_size + test_size, seed) if c.question not in test_q]
    return train[:train_size], test


TRAIN_SIZE, TEST_SIZE, SEED = 2000, 128, 0


def write_reasoning_task(
    out_dir: str | Path, train_size: int = TRAIN_SIZE, test_size: int = TEST_SIZE, seed: int = SEED
) -> tuple[Path, Path]:
    """Write ``train.parquet`` and ``test.parquet`` under ``out_dir``; returns their paths."""
    from dapo.data.parquet import write_train_test

    train, test = split_chains(train_size, test_size, seed)
    return write_train_test(
        out_dir,
        [to_row(c, "train", i) for i, c in enumerate(train)],
        [to_row(c, "test", i) for i, c in enumerate(test)],
    )


def reasoning_task_fingerprint(
    train_size: int = TRAIN_SIZE, test_size: int = TEST_SIZE, seed: int = SEED
) -> str:
    """A short hash of the generator's output, so a changed generator writes a new cache folder."""
    sample = make_chains(8, seed)
    text = repr(
        (TIER_WEIGHTS, MIN_STEPS, MAX_STEPS, train_size, test_size, seed, [working(c) for c in sample])
    )
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def ensure_reasoning_task(log: Callable[[str], None] = lambda line: None) -> tuple[Path, Path]:
    """The task's ``train.parquet`` and ``test.parquet`` in the dapo cache, written on first use."""
    from dapo.tasks.cache import ensure_task_files

    return ensure_task_files("reasoning", reasoning_task_fingerprint(), write_reasoning_task, log)
