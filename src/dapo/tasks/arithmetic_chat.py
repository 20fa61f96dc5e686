"""Built-in arithmetic word problems in chat form, for real instruct models (verl parquet schema).

Where ``dapo.tasks.arithmetic`` writes bare ``45+3=`` prompts for the tiny character model, this task
asks in sentences, as a user would ask a chat model, and states the answer format::

    system     Solve the arithmetic problem. End your reply with 'Answer: <number>'.
    user       What is 3 plus 4?                 (one worked example, the same in every prompt)
    assistant  3 plus 4 is 7.
               Answer: 7
    user       Mia has 45 apples and gets 3 more. How many apples does Mia have now?

The worked example is there because a 135M model, asked for ``Answer: <number>`` with no example,
uses the format about one time in ten and is almost never right (measured on SmolLM2-135M-Instruct);
with the example it uses the format about four times in five and is right sometimes, so groups of
samples differ and a group-relative method has signal. Rows carry ``data_source: arithmetic``, so the
math_dapo rules grade them: the reply must contain ``Answer: X``.

Tiers (so dynamic sampling has easy, mixed and hard groups):
  easy    one-digit plus or minus one-digit
  medium  two-digit plus or minus one-digit
  hard    two-digit plus two-digit
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass
from pathlib import Path

DATA_SOURCE = "arithmetic"
SYSTEM = "Solve the arithmetic problem. End your reply with 'Answer: <number>'."
EXAMPLE = ("What is 3 plus 4?", "3 plus 4 is 7.\nAnswer: 7")
TIER_WEIGHTS = {"easy": 0.3, "medium": 0.5, "hard": 0.2}
NAMES = ("Mia", "Leo", "Ava", "Sam", "Zoe", "Ben", "Ivy", "Max")
THINGS = ("apples", "marbles", "stickers", "books", "coins", "shells")


@dataclass(frozen=True)
class ChatProblem:
    a: int
    op: str  # "+" or "-"
    b: int
    tier: str

    @property
    def answer(self) -> int:
        return self.a + self.b if self.op == "+" else self.a - self.b

    @property
    def key(self) -> str:
        return f"{self.a}{self.op}{self.b}"

    def question(self, style: int) -> str:
        """One of four phrasings; ``style`` picks it (and the name and object of a story)."""
        a, b = self.a, self.b
        name, thing = NAMES[style % len(NAMES)], THINGS[style % len(THINGS)]
        word = "plus" if self.op == "+" else "minus"
        kind = style % 4
        if kind == 0:
            return f"What is {a} {word} {b}?"
        if kind == 1:
            return f"Compute {a} {self.op} {b}."
        if self.op == "+":
            if kind == 2:
                return f"{name} has {a} {thing} and gets {b} more. How many {thing} does {name} have now?"
            return f"A box holds {a} {thing}. {name} puts in {b} more. How many {thing} are in the box?"
        if kind == 2:
            return f"{name} has {a} {thing} and gives away {b}. How many {thing} does {name} have left?"
        return f"A box holds {a} {thing}. {name} takes out {b}. How many {thing} are in the box?"


def all_problems() -> list[ChatProblem]:
    out: list[ChatProblem] = []
    for a in range(1, 10):
        for b in range(1, 10):
            out.append(ChatProblem(a, "+", b, "easy"))
            if a > b:
                out.append(ChatProblem(a, "-", b, "easy"))
    for a in range(10, 100):
        for b in range(1, 10):
            out.append(ChatProblem(a, "+", b, "medium"))
            out.append(ChatProblem(a, "-", b, "medium"))
    for a in range(10, 100):
        for b in range(10, 100):
            out.append(ChatProblem(a, "+", b, "hard"))
    # the worked example never appears as a question
    return [p for p in out if p.key != "3+4"]


def split_problems(seed: int = 0, test_fraction: float = 0.2) -> tuple[list[ChatProblem], list[ChatProblem]]:
    """A deterministic train/test split, disjoint by problem (``a op b``)."""
    from dapo.tasks.arithmetic import split_by_fraction

    return split_by_fraction(all_problems(), seed, test_fraction)


def sample_problems(pool: list[ChatProblem], count: int, seed: int) -> list[ChatProblem]:
    """Up to ``count`` distinct problems, about ``TIER_WEIGHTS[tier] * count`` of each tier."""
    rng = random.Random(seed)
    out: list[ChatProblem] = []
    for tier, w in TIER_WEIGHTS.items():
        tier_pool = [p for p in pool if p.tier == tier]
        out.extend(rng.sample(tier_pool, min(round(count * w), len(tier_pool))))
    rng.shuffle(out)
    return out


def messages(question: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": EXAMPLE[0]},
        {"role": "assistant", "content": EXAMPLE[1]},
        {"role": "user", "content": question},
    ]


def to_row(p: ChatProblem, split: str, index: int, style: int) -> dict:
    """One verl-schema row (docs/verl_compat.md, Data)."""
    q = p.question(style)
    return {
        "data_source": DATA_SOURCE,
        "prompt": messages(q),
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(p.answer)},
        "extra_info": {"split": split, "index": index, "tier": p.tier, "question": q},
    }


def write_chat_task(
    out_dir: str | Path, train_size: int = 2000, test_size: int = 128, seed: int = 0
) -> tuple[Path, Path]:
    """Write ``train.parquet`` and ``test.parquet`` under ``out_dir``; returns their paths."""
    from dapo.data.parquet import write_train_test

    train_pool, test_pool = split_problems(seed)
    rng = random.Random(seed + 3)
    rows = {}
    for split, pool, size, s in (("train", train_pool, train_size, 1), ("test", test_pool, test_size, 2)):
        probs = sample_problems(pool, size, seed + s)
        rows[split] = [to_row(p, split, i, rng.randrange(1 << 16)) for i, p in enumerate(probs)]
    return write_train_test(Path(out_dir).expanduser(), rows["train"], rows["test"])


def has_answer_line(text: str) -> bool:
    """The reply uses the format: an ``Answer: ...`` marker where math_dapo looks (its last 300 characters)."""
    from dapo.reward.scorers.math_dapo import ANSWER_PATTERN

    return ANSWER_PATTERN.search(text[-300:]) is not None


def summarize_dumps(dump_dir: str | Path) -> list[dict]:
    """Held-out accuracy and format rate per step from validation dumps (``<dir>/<step>.jsonl``)."""
    out = []
    files = sorted(
        Path(dump_dir).expanduser().glob("*.jsonl"), key=lambda f: int(f.stem) if f.stem.isdigit() else -1
    )
    for f in files:
        rows = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        if not rows:
            continue
        acc = [bool(r["acc"]) if "acc" in r else float(r.get("score", 0)) > 0 for r in rows]
        fmt = [has_answer_line(r.get("output") or "") for r in rows]
        out.append(
            {"step": f.stem, "n": len(rows), "acc": sum(acc) / len(rows), "format_rate": sum(fmt) / len(rows)}
        )
    return out


# ---------------------------------------------------------------- CLI


def cmd_arithmetic_chat(args: argparse.Namespace) -> int:
    if getattr(args, "summarize", None):
        for r in summarize_dumps(args.summarize):
            print(
                f"step {r['step']:>4}: acc {r['acc']:.3f}  format {r['format_rate']:.3f}  ({r['n']} replies)"
            )
        return 0
    if not args.output:
        raise SystemExit("--output is required")
    train, test = write_chat_task(args.output, args.train_size, args.test_size, args.seed)
    print(json.dumps({"train": str(train), "test": str(test)}))
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--output", help="directory for train.parquet and test.parquet")
    p.add_argument(
        "--summarize",
        metavar="DUMP_DIR",
        help="instead: print held-out accuracy and format rate per step from a run's validation dumps",
    )
    p.add_argument("--train-size", type=int, default=2000)
    p.add_argument("--test-size", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)


def register(subparsers: argparse._SubParsersAction) -> None:
    """``dapo data arithmetic-chat --output DIR`` (registered under the ``data`` group)."""
    p = subparsers.add_parser(
        "arithmetic-chat", help="write the built-in chat-form arithmetic word problems as verl parquet"
    )
    add_arguments(p)
    p.set_defaults(func=cmd_arithmetic_chat)


def main(argv: list[str] | None = None) -> int:
    """``python -m dapo.tasks.arithmetic_chat --output DIR``."""
    p = argparse.ArgumentParser(
        prog="python -m dapo.tasks.arithmetic_chat", description=__doc__.split("\n")[0]
    )
    add_arguments(p)
    return cmd_arithmetic_chat(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
