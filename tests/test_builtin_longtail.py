"""The built-in long-tail task (data.builtin_task=reasoning_longtail): chains of 1 to 16 operations
in blocks, so that the right working of every block of a batch differs tenfold in length."""

from __future__ import annotations

import numpy as np
import pytest

from dapo.tasks import BUILTIN_TASKS, builtin_task
from dapo.tasks.reasoning import (
    LONGTAIL_STEPS,
    Chain,
    chains_fingerprint,
    longtail_chains,
    longtail_split,
    split_chains,
    working,
)


def _tokens(tok, c: Chain) -> int:
    return len(tok(working(c), add_special_tokens=False)["input_ids"])


def test_hand_built_shortest_and_longest_working(char_tokenizer):
    # two-digit values throughout: 14 tokens a line (15 from line 10), "Answer: dd" 10
    short = Chain(47, (("+", 3),), "medium")
    assert working(short) == "1)+3: 47+3=50\nAnswer: 50" and _tokens(char_tokenizer, short) == 24
    long = Chain(20, (("+", 3),) * 16, "medium")
    assert _tokens(char_tokenizer, long) == 9 * 14 + 7 * 15 + 10 == 241


def test_every_block_of_a_batch_spreads_tenfold(char_tokenizer):
    train, test = longtail_split()
    k = len(LONGTAIL_STEPS)
    assert (len(train), len(test)) == (2000, 128)
    for chains in (train, test):
        for b in range(0, len(chains), k):
            block = chains[b : b + k]
            assert sorted(len(c.ops) for c in block) == sorted(LONGTAIL_STEPS)
            lengths = [_tokens(char_tokenizer, c) for c in block]
            # the reference answers of one batch: max / min >= 10, the mean about a third of the max
            assert max(lengths) / min(lengths) >= 10
            assert max(lengths) > 2.5 * np.mean(lengths)
    # a batch of the reasoning preset (8 prompts) is one block
    batch = [_tokens(char_tokenizer, c) for c in train[:8]]
    assert (min(batch), max(batch)) == (24, 241)


def test_chains_keep_the_tier_rules_and_are_new():
    from dapo.tasks.tiny_reasoning_model import warm_start_chains

    train, test = longtail_split()
    assert longtail_split() == (train, test)  # deterministic
    q_train, q_test = {c.question for c in train}, {c.question for c in test}
    assert len(q_train) == 2000 and len(q_test) == 128 and not q_train & q_test
    seen = {c.question for c in warm_start_chains(0) + split_chains(2000, 128, 0)[1]}
    assert not (q_train | q_test) & seen
    for c in train + test:
        values = [c.start, *c.values()]
        assert c.tier in ("easy", "medium") and 10 <= min(values) and max(values) <= 99
        assert len(set(c.ops)) == 1
    tiers = [c.tier for c in train]
    assert 0.28 < tiers.count("easy") / len(tiers) < 0.39  # weights 1/3 and 2/3


def test_exhausted_lengths_say_so():
    with pytest.raises(ValueError, match="no new chain of 1 operations"):
        longtail_chains(1, 0, exclude={c.question for c in longtail_chains(400, 1)} | _all_one_step())


def _all_one_step() -> set[str]:
    """Every one-operation question of the easy and medium tiers."""
    return {f"{s} 1){op}{x} =" for s in range(10, 100) for op in "+-" for x in range(1, 10)}


def test_registered_and_written(tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    from dapo.cli import main

    assert "reasoning_longtail" in BUILTIN_TASKS
    assert main(["validate", "data.builtin_task=reasoning_longtail"]) == 0
    monkeypatch.setenv("DAPO_CACHE", str(tmp_path / "cache"))
    train_path, test_path = builtin_task("reasoning_longtail")
    train, test = longtail_split()
    assert train_path.parent.name == f"reasoning_longtail-{chains_fingerprint(train, test)}"
    rows = pq.read_table(train_path).to_pylist()
    assert [r["prompt"][0]["content"] for r in rows] == [c.question for c in train]
    assert [r["reward_model"]["ground_truth"] for r in rows[:8]] == [str(c.answer) for c in train[:8]]
    assert len(pq.read_table(test_path)) == 128


def test_reasoning_preset_trains_on_it(tmp_path, monkeypatch):
    from dapo.cli import main
    from dapo.tasks.tiny_reasoning_model import build_reasoning_model
    from runs import metric_rows

    monkeypatch.setenv("DAPO_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "model"
    model.mkdir()
    build_reasoning_model(model, steps=1, log=lambda s: None)
    run = tmp_path / "run"
    args = [
        "train",
        "--config-name",
        "reasoning",
        f"actor_rollout_ref.model.path={model}",
        "data.builtin_task=reasoning_longtail",
        "data.max_prompt_length=112",  # 16 operations: 91 characters and the chat tokens
        "data.shuffle=false",
        f"trainer.default_local_dir={run}",
        "trainer.total_training_steps=1",
        "trainer.val_before_train=false",
        "trainer.test_freq=0",
        "data.train_batch_size=8",
        "data.gen_batch_size=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.rollout.n=1",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "algorithm.filter_groups.enable=false",
    ]
    assert main(args) == 0
    m = next(r for r in metric_rows(run) if r.get("step") == 1 and "prompt_length/min" in r)
    # one block: prompts from "dd 1)+d =" to 16 operations, none truncated
    assert m["prompt_length/max"] - m["prompt_length/min"] == len(" 2)+d" * 8 + " 10)+d" * 7)
    assert m["prompt_length/max"] <= 112


def test_longtail_warm_start_mixes_every_length_and_never_a_task_question():
    """The long-tail model's warm start: a quarter of its chains in long-tail blocks (every length
    from 1 to 16 operations), the rest the reasoning model's, none a question of the task."""
    from dapo.tasks.tiny_reasoning_model import (
        LONGTAIL_SHARE,
        WARM_START_CHAINS,
        longtail_warm_start_chains,
        warm_start_chains,
    )

    chains = longtail_warm_start_chains(0)
    assert longtail_warm_start_chains(0) == chains  # deterministic
    assert len(chains) == WARM_START_CHAINS and len({c.question for c in chains}) == len(chains)
    train, test = longtail_split()
    assert not {c.question for c in chains} & {c.question for c in train + test}
    short = [c for c in chains if len(c.ops) in LONGTAIL_STEPS]  # the normal chains have 9 to 12
    blocks = int(WARM_START_CHAINS * LONGTAIL_SHARE) // len(LONGTAIL_STEPS)
    assert sorted({len(c.ops) for c in short}) == sorted(set(LONGTAIL_STEPS))
    assert len(short) == blocks * len(LONGTAIL_STEPS)
    normal = {c.question for c in warm_start_chains(0)}
    assert sum(c.question in normal for c in chains) == WARM_START_CHAINS - len(short)
