"""Built-in long-reasoning task: chained operations whose answer needs written working.

A problem is a start value and a chain of numbered operations, e.g.
``47 1)+8 2)+8 3)+8 4)+8 5)+8 6)+8 7)+8 8)+8 9)+8 =``. The expected response writes one line per
operation: the operation as numbered in the question, then the running value before and after
it (``3)+8: 63+8=71``), and ends with ``Answer: X`` (graded by math_dapo, like every built-in
task). A chain has ``MIN_STEPS``-``MAX_STEPS`` operations (``beyond``'s at most
``MIN_STEPS + 1``), so the working alone is 128+ tokens of the character tokenizer. Every
operation of a chain is the same addition or subtraction of one number (one digit but in
``beyond``): the work is in the arithmetic, not in finding the next operation, which keeps the
three first tiers within reach of a tiny model. Difficulty varies per prompt with the number of lines that carry,
borrow or cross 100, so that some groups are all-correct and some all-wrong:

  easy    adds or subtracts 1 or 2 (a carry or borrow about every fifth line at most)
  medium  adds or subtracts 3-9 within 10..99 (a carry or borrow every line or two)
  hard    adds or subtracts 3-9 across 100 (lines with three-digit values as well)
  beyond  adds or subtracts 11-19 across 100 (two-digit operands: none in the warm start)

Two tasks are built from these chains. ``reasoning`` (the ``reasoning`` preset) is mostly within
reach: easy, medium and hard chains, nearly every group with spread. ``reasoning_sparse`` is the
regime DAPO's dynamic sampling is for: its training pool is mostly ``beyond`` chains the warm
start almost never solves (0.003 of its samples; groups all wrong), the rest the three
learnable tiers, whose easy chains RL soon solves (groups all right); few groups have spread
(about 17% at the warm start), so a ``strategy=verl`` step generates several rounds, and a
sampler that predicts which prompts will not spread can skip them. Its held-out set is the
``reasoning`` task's (the three learnable tiers): a chain beyond reach would only add a zero to
the accuracy.

``reasoning_longtail`` is for streaming and partial rollouts: chains of 1 to 16 operations, in
blocks of ``len(LONGTAIL_STEPS)`` whose lengths follow ``LONGTAIL_STEPS`` (most chains short, one
in eight 16 operations long), so the right working of a block runs from 24 to 241 tokens: the
longest response of a round is ten times its shortest and about three times the mean, which is
the tail a round waits for. Only easy and medium chains (two-digit values) are used, so that the
longest working fits the reasoning model's positions. The blocks are consecutive in the files; a
run with ``data.shuffle=false`` keeps them in every round. The reasoning model's warm start saw
chains of 9 to 12 operations only.

``reasoning_wide`` is for measuring coverage, how much of a large pool a sampler keeps visiting:
its pool is 1536 chains (192 batches of the preset's 8 prompts, so 100 steps visit most prompts
only a few times), 60% ``beyond`` and 30% ``hard`` (most hard groups are all wrong at the warm
start, yet hard chains are learnable: a sampler that stops visiting them shows it). Its held-out
set is the ``reasoning`` test chains plus 32 ``hard`` and 32 ``beyond`` ones, each row's tier in
``extra_info.tier``, in an order whose every prefix keeps the tier shares (so a
``data.val_max_samples`` prefix is a smaller copy of the whole).

Nothing here runs model output: rows are data, and the grader is the math_dapo regex.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass
from pathlib import Path

from dapo.tasks.arithmetic import to_row  # the same verl-schema rows (question, answer, tier)

TIERS = ("easy", "medium", "hard", "beyond")
TIER_WEIGHTS = {"easy": 0.25, "medium": 0.5, "hard": 0.25}
MIN_STEPS, MAX_STEPS = 9, 12
# reasoning_sparse's training pool: the share of each tier (about 17% of its groups have spread at
# the warm start, so one strategy=verl round of 3x the batch rarely fills a step)
SPARSE_TIER_WEIGHTS = {"easy": 0.04, "medium": 0.08, "hard": 0.04, "beyond": 0.84}
SPARSE_TRAIN_SIZE = 384
# reasoning_wide's training pool (every medium chain the warm start and the test sets leave is
# about 76, so medium stays small) and the chains its held-out set adds to the reasoning task's
WIDE_TIER_WEIGHTS = {"easy": 0.06, "medium": 0.04, "hard": 0.3, "beyond": 0.6}
WIDE_TRAIN_SIZE = 1536
WIDE_EXTRA_TEST = {"hard": 32, "beyond": 32}
# reasoning_longtail: the operations of each block of chains (a long tail: the mean is a third of
# the longest; none of 9 to 12, the warm start's lengths, whose easy and medium 12-operation
# chains it took nearly all), the tiers' shares, and the pool sizes
LONGTAIL_STEPS = (1, 1, 2, 2, 3, 5, 8, 16)
LONGTAIL_TIER_WEIGHTS = {"easy": 1 / 3, "medium": 2 / 3}
LONGTAIL_TRAIN_SIZE, LONGTAIL_TEST_SIZE = 2000, 128
# draws in a row that meet only chains already taken before make_chains gives up on a tier
MAX_MISSES = 20_000


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


def make_chain(rng: random.Random, tier: str, steps: int | None = None) -> Chain:
    """A chain of one repeated operation; ``tier`` sets the operand and the range of values,
    ``steps`` the number of operations (by default drawn from the tier's range)."""
    if steps is None:
        # beyond's three-digit lines are longer: at most 10 keep its working as short as the others'
        steps = rng.randint(MIN_STEPS, MIN_STEPS + 1 if tier == "beyond" else MAX_STEPS)
    low, high = {"easy": (1, 2), "beyond": (11, 19)}.get(tier, (3, 9))
    while True:
        op, x = rng.choice("+-"), rng.randint(low, high)
        start = rng.randint(10, 99) if tier in ("easy", "medium") or op == "+" else rng.randint(100, 199)
        chain = Chain(start, ((op, x),) * steps, tier)
        values = [start, *chain.values()]
        if tier in ("hard", "beyond"):
            if min(values) >= 10 and max(values) <= 199 and min(values) <= 99 < max(values):
                return chain
        elif 10 <= min(values) and max(values) <= 99:
            return chain


def make_chains(
    count: int, seed: int, weights: Mapping[str, float] | None = None, exclude: Set[str] = frozenset()
) -> list[Chain]:
    """``count`` distinct chains, ``weights`` (default ``TIER_WEIGHTS``) of each tier, none whose
    question is in ``exclude``, in a seeded shuffled order. Raises ``ValueError`` for weights
    that are not over ``TIERS`` or do not sum to 1, and when a tier has too few distinct chains
    left outside ``exclude``."""
    weights = TIER_WEIGHTS if weights is None else weights
    if not set(weights) <= set(TIERS) or abs(sum(weights.values()) - 1) > 1e-9:
        raise ValueError(f"tier weights must be over {', '.join(TIERS)} and sum to 1, got {dict(weights)}")
    rng = random.Random(seed)
    out: list[Chain] = []
    seen: set[str] = set(exclude)
    for tier in TIERS:
        want, misses = round(count * weights.get(tier, 0.0)), 0
        while want:
            c = make_chain(rng, tier)
            if c.question not in seen:
                seen.add(c.question)
                out.append(c)
                want, misses = want - 1, 0
            elif (misses := misses + 1) > MAX_MISSES:
                raise ValueError(
                    f"{tier}: {want} more distinct chains wanted, but {MAX_MISSES} draws in a row met "
                    "only chains already taken or excluded; lower the count or the tier's weight"
                )
    rng.shuffle(out)
    return out


def split_chains(train_size: int, test_size: int, seed: int) -> tuple[list[Chain], list[Chain]]:
    """Disjoint train and test chains (by question)."""
    test = make_chains(test_size, seed + 1)
    test_q = {c.question for c in test}
    train = [c for c in make_chains(train_size + test_size, seed) if c.question not in test_q]
    return train[:train_size], test


TRAIN_SIZE, TEST_SIZE, SEED = 2000, 128, 0


def write_chains(out_dir: str | Path, train: list[Chain], test: list[Chain]) -> tuple[Path, Path]:
    """Write ``train.parquet`` and ``test.parquet`` of these chains under ``out_dir``."""
    from dapo.data.parquet import write_train_test

    return write_train_test(
        out_dir,
        [to_row(c, "train", i) for i, c in enumerate(train)],
        [to_row(c, "test", i) for i, c in enumerate(test)],
    )


def write_reasoning_task(
    out_dir: str | Path, train_size: int = TRAIN_SIZE, test_size: int = TEST_SIZE, seed: int = SEED
) -> tuple[Path, Path]:
    """Write the ``reasoning`` task's ``train.parquet`` and ``test.parquet`` under ``out_dir``."""
    return write_chains(out_dir, *split_chains(train_size, test_size, seed))


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


def sparse_split() -> tuple[list[Chain], list[Chain]]:
    """The ``reasoning_sparse`` task's train and test chains: the test chains are the
    ``reasoning`` task's; no train chain is a test chain or one the warm start trained on."""
    from dapo.tasks.tiny_reasoning_model import warm_start_chains

    test = split_chains(TRAIN_SIZE, TEST_SIZE, SEED)[1]
    seen = frozenset(c.question for c in warm_start_chains(0) + test)
    return make_chains(SPARSE_TRAIN_SIZE, SEED + 2, SPARSE_TIER_WEIGHTS, seen), test


def chains_fingerprint(train: list[Chain], test: list[Chain]) -> str:
    """A short hash of a split's chains and the warm start's recipe they exclude."""
    from dapo.tasks.tiny_reasoning_model import recipe_fingerprint

    text = repr((recipe_fingerprint(), [working(c) for c in train + test]))
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def ensure_sparse_task(log: Callable[[str], None] = lambda line: None) -> tuple[Path, Path]:
    """The ``reasoning_sparse`` task's ``train.parquet`` and ``test.parquet`` in the dapo cache."""
    from dapo.tasks.cache import ensure_task_files

    train, test = sparse_split()  # once: it names the cache folder and fills it
    return ensure_task_files(
        "reasoning_sparse", chains_fingerprint(train, test), lambda d: write_chains(d, train, test), log
    )


def longtail_chains(blocks: int, seed: int, exclude: Set[str] = frozenset()) -> list[Chain]:
    """``blocks`` blocks of chains, each with one chain of every length in ``LONGTAIL_STEPS`` in
    a seeded order, tiers drawn by ``LONGTAIL_TIER_WEIGHTS``, no question twice or in
    ``exclude``."""
    rng = random.Random(seed)
    tiers, weights = zip(*LONGTAIL_TIER_WEIGHTS.items())
    seen: set[str] = set(exclude)
    out: list[Chain] = []
    for _ in range(blocks):
        block = []
        for steps in LONGTAIL_STEPS:
            for _ in range(MAX_MISSES):
                c = make_chain(rng, rng.choices(tiers, weights)[0], steps)
                if c.question not in seen:
                    break
            else:
                raise ValueError(f"no new chain of {steps} operations in {MAX_MISSES} draws")
            seen.add(c.question)
            block.append(c)
        rng.shuffle(block)
        out.extend(block)
    return out


def longtail_split() -> tuple[list[Chain], list[Chain]]:
    """The ``reasoning_longtail`` task's train and test chains, disjoint, and none that the
    warm start trained on or that is a ``reasoning`` test question."""
    from dapo.tasks.tiny_reasoning_model import warm_start_chains

    k = len(LONGTAIL_STEPS)
    seen = frozenset(c.question for c in warm_start_chains(0) + split_chains(TRAIN_SIZE, TEST_SIZE, SEED)[1])
    test = longtail_chains(LONGTAIL_TEST_SIZE // k, SEED + 5, seen)
    train = longtail_chains(LONGTAIL_TRAIN_SIZE // k, SEED + 6, seen | {c.question for c in test})
    return train, test


def ensure_longtail_task(log: Callable[[str], None] = lambda line: None) -> tuple[Path, Path]:
    """The ``reasoning_longtail`` task's ``train.parquet`` and ``test.parquet`` in the dapo cache."""
    from dapo.tasks.cache import ensure_task_files

    train, test = longtail_split()
    return ensure_task_files(
        "reasoning_longtail", chains_fingerprint(train, test), lambda d: write_chains(d, train, test), log
    )


def tier_interleaved(chains: list[Chain]) -> list[Chain]:
    """``chains`` reordered so that every prefix holds each tier at its share of the whole, within
    one chain: the ``j``-th of a tier's ``c`` chains sits at ``(j + 1/2) / c`` of the way."""
    by_tier: dict[str, list[Chain]] = {}
    for c in chains:
        by_tier.setdefault(c.tier, []).append(c)
    keyed = [
        ((j + 0.5) / len(group), TIERS.index(tier), c)
        for tier, group in by_tier.items()
        for j, c in enumerate(group)
    ]
    return [c for _, _, c in sorted(keyed, key=lambda k: (k[0], k[1]))]


def wide_split() -> tuple[list[Chain], list[Chain]]:
    """The ``reasoning_wide`` task's train and test chains: the test chains are the ``reasoning``
    task's and ``WIDE_EXTRA_TEST`` more, tier-interleaved; no train chain is a test chain or one
    the warm start trained on, and no added test chain is one the warm start trained on."""
    from dapo.tasks.tiny_reasoning_model import warm_start_chains

    base = split_chains(TRAIN_SIZE, TEST_SIZE, SEED)[1]
    seen = frozenset(c.question for c in warm_start_chains(0) + base)
    total = sum(WIDE_EXTRA_TEST.values())
    extra = make_chains(total, SEED + 3, {t: k / total for t, k in WIDE_EXTRA_TEST.items()}, seen)
    test = tier_interleaved(base + extra)
    seen |= {c.question for c in extra}
    return make_chains(WIDE_TRAIN_SIZE, SEED + 4, WIDE_TIER_WEIGHTS, seen), test


def ensure_wide_task(log: Callable[[str], None] = lambda line: None) -> tuple[Path, Path]:
    """The ``reasoning_wide`` task's ``train.parquet`` and ``test.parquet`` in the dapo cache."""
    from dapo.tasks.cache import ensure_task_files

    train, test = wide_split()
    return ensure_task_files(
        "reasoning_wide", chains_fingerprint(train, test), lambda d: write_chains(d, train, test), log
    )
