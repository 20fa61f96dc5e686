"""The built-in long-reasoning task: generator, working, grading, warm-start targets, preset."""

import hashlib
import random

import pytest

from dapo.reward.scorers import default_compute_score
from dapo.tasks.reasoning import (
    MAX_STEPS,
    MIN_STEPS,
    SPARSE_TIER_WEIGHTS,
    TIERS,
    Chain,
    apply,
    chains_fingerprint,
    make_chain,
    make_chains,
    reasoning_task_fingerprint,
    sparse_split,
    split_chains,
    tier_interleaved,
    to_row,
    wide_split,
    working,
)
from runs import metric_rows


def test_hand_chain_question_working_and_grade():
    c = Chain(47, (("+", 8), ("-", 5), ("*", 3)), "hard")
    assert c.values() == [55, 50, 150] and c.answer == 150
    assert c.question == "47 1)+8 2)-5 3)*3 ="
    text = working(c)
    assert text == "1)+8: 47+8=55\n2)-5: 55-5=50\n3)*3: 50*3=150\nAnswer: 150"
    assert default_compute_score("arithmetic", text, "150")["acc"] is True
    assert default_compute_score("arithmetic", text, "151")["acc"] is False
    # a slip carried forward: the graded answer is the last line's
    slipped = working(c, [55, 51, 153])
    assert slipped.endswith("2)-5: 55-5=51\n3)*3: 51*3=153\nAnswer: 153")
    assert default_compute_score("arithmetic", slipped, "150")["acc"] is False
    row = to_row(c, "test", 3)
    assert row["reward_model"]["ground_truth"] == "150" and row["extra_info"]["tier"] == "hard"


def test_hand_chains_of_each_tier():
    easy = Chain(43, (("-", 1),) * 9, "easy")
    assert easy.question == "43 1)-1 2)-1 3)-1 4)-1 5)-1 6)-1 7)-1 8)-1 9)-1 ="
    assert easy.values() == [42, 41, 40, 39, 38, 37, 36, 35, 34]
    assert working(easy).startswith("1)-1: 43-1=42\n2)-1: 42-1=41\n3)-1: 41-1=40\n4)-1: 40-1=39\n")
    hard = Chain(91, (("+", 7),) * 3, "hard")
    assert working(hard) == "1)+7: 91+7=98\n2)+7: 98+7=105\n3)+7: 105+7=112\nAnswer: 112"
    assert default_compute_score("arithmetic", working(hard), "112")["acc"] is True
    beyond = Chain(184, (("-", 12),) * 2, "beyond")
    assert beyond.question == "184 1)-12 2)-12 ="
    assert working(beyond) == "1)-12: 184-12=172\n2)-12: 172-12=160\nAnswer: 160"


@pytest.mark.parametrize("seed", range(5))
def test_tiers_follow_their_rules(seed):
    rng = random.Random(seed)
    for _ in range(40):
        for tier in ("easy", "medium", "hard", "beyond"):
            c = make_chain(rng, tier)
            assert MIN_STEPS <= len(c.ops) <= (MIN_STEPS + 1 if tier == "beyond" else MAX_STEPS)
            assert len(set(c.ops)) == 1  # one operation, repeated
            op, x = c.ops[0]
            operands = {"easy": (1, 2), "beyond": tuple(range(11, 20))}.get(tier, tuple(range(3, 10)))
            assert op in "+-" and x in operands
            values = [c.start, *c.values()]
            if tier in ("hard", "beyond"):  # crosses 100
                assert 10 <= min(values) <= 99 < max(values) <= 199
            else:
                assert 10 <= min(values) and max(values) <= 99


def test_working_is_long_and_splits_are_disjoint(char_tokenizer):
    train, test = split_chains(300, 40, 0)
    assert len(train) == 300 and len(test) == 40
    assert not {c.question for c in train} & {c.question for c in test}
    assert split_chains(300, 40, 0) == (train, test)  # deterministic
    lengths = [len(char_tokenizer(working(c), add_special_tokens=False)["input_ids"]) for c in train]
    assert min(lengths) >= 128 and max(lengths) <= 215
    tiers = [c.tier for c in make_chains(400, 1)]
    assert tiers.count("easy") == 100 and tiers.count("medium") == 200 and tiers.count("hard") == 100


def _digest(chains):
    return hashlib.sha256(repr([working(c) for c in chains]).encode()).hexdigest()[:16]


def test_the_reasoning_task_and_warm_start_are_unchanged_by_the_sparse_one():
    from dapo.tasks.tiny_reasoning_model import warm_start_chains

    # the reasoning preset's data and the warm start's chains (and so the cached model and the
    # published results) stay the same generator output, chain for chain
    assert reasoning_task_fingerprint() == "4c7649e5d5"
    train, test = split_chains(2000, 128, 0)
    assert (_digest(train), _digest(test)) == ("d8ee6600eaed0224", "cbe1efb075d808d1")
    assert _digest(warm_start_chains(0)) == "fc19c2ee9d6bc2ac"


def test_make_chains_refuses_bad_weights_and_an_exhausted_tier():
    with pytest.raises(ValueError, match="tier weights must be over easy, medium, hard, beyond"):
        make_chains(10, 0, {"Beyond": 1.0})
    with pytest.raises(ValueError, match="sum to 1"):
        make_chains(10, 0, {"easy": 0.5, "medium": 0.5, "hard": 0.5})
    taken = frozenset(c.question for c in make_chains(1500, 0, {"medium": 1.0}))
    # medium has fewer than 1600 distinct chains: asking for 1000 more must stop, naming the tier
    with pytest.raises(ValueError, match="^medium: .* lower the count or the tier's weight"):
        make_chains(1000, 1, {"medium": 1.0}, taken)


def test_sparse_task_is_mostly_beyond_reach_and_new_to_the_warm_start(char_tokenizer):
    from dapo.tasks.tiny_reasoning_model import warm_start_chains

    train, test = sparse_split()
    # held out: the reasoning task's own test chains, all within reach
    assert [c.question for c in test] == [c.question for c in split_chains(2000, 128, 0)[1]]
    assert len(train) == 384
    train_q, test_q = {c.question for c in train}, {c.question for c in test}
    assert len(train_q) == 384 and not train_q & test_q
    assert not train_q & {c.question for c in warm_start_chains(0)}
    assert [sum(c.tier == t for c in train) for t in SPARSE_TIER_WEIGHTS] == [15, 31, 15, 323]
    assert {c.tier for c in train} == set(SPARSE_TIER_WEIGHTS) and "beyond" not in {c.tier for c in test}
    lengths = [len(char_tokenizer(working(c), add_special_tokens=False)["input_ids"]) for c in train]
    # as short as the reasoning task's: right working never reaches the preset's overlong buffer
    assert min(lengths) >= 128 and max(lengths) <= 215


def test_tier_interleaved_keeps_every_prefix_at_the_tier_shares():
    chains = [Chain(10 + i, (("+", 1),), t) for i, t in enumerate("e e m m m m h h b b b b b b".split())]
    tiers = {"e": "easy", "m": "medium", "h": "hard", "b": "beyond"}
    chains = [Chain(c.start, c.ops, tiers[c.tier]) for c in chains]
    out = tier_interleaved(chains)
    # keys (j + 1/2) / count: easy 1/4 3/4; medium 1/8 3/8 5/8 7/8; hard 1/4 3/4; beyond 1/12 3/12
    # 5/12 7/12 9/12 11/12; ties go in tier order
    assert [c.tier[0] for c in out] == list("bmehbmbbmehbmb")
    assert sorted(c.start for c in out) == [c.start for c in chains]  # a reordering, nothing lost
    # each tier's chains keep their own order
    assert [c.start for c in out if c.tier == "medium"] == [12, 13, 14, 15]


def test_wide_task_is_large_new_to_the_warm_start_and_held_out_on_every_tier(char_tokenizer):
    from dapo.config.load import load_config
    from dapo.tasks.tiny_reasoning_model import warm_start_chains

    train, test = wide_split()
    batch = int(load_config([], preset="reasoning").data.train_batch_size)
    assert len(train) == 1536 and len(train) >= 30 * batch
    assert [sum(c.tier == t for c in train) for t in TIERS] == [92, 61, 461, 922]
    assert [sum(c.tier == t for c in test) for t in TIERS] == [32, 64, 64, 32]
    train_q, test_q = {c.question for c in train}, {c.question for c in test}
    warm_q = {c.question for c in warm_start_chains(0)}
    assert len(train_q) == 1536 and len(test_q) == 192
    assert not train_q & test_q and not train_q & warm_q and not test_q & warm_q
    # the reasoning task's held-out chains are all in it, so the two tasks' learnable tiers compare
    assert {c.question for c in split_chains(2000, 128, 0)[1]} <= test_q
    for k in range(1, len(test) + 1):  # any data.val_max_samples prefix keeps the tier shares
        for t in TIERS:
            share = sum(c.tier == t for c in test) / len(test)
            assert abs(sum(c.tier == t for c in test[:k]) - k * share) <= 1, (k, t)
    lengths = [len(char_tokenizer(working(c), add_special_tokens=False)["input_ids"]) for c in train + test]
    assert min(lengths) >= 128 and max(lengths) <= 215
    assert (_digest(train), _digest(test)) == ("f4394ee0ac1d55a9", "d05da7ef961afc85")
    assert chains_fingerprint(train, test) == "2dba44635b"
    assert chains_fingerprint(*sparse_split()) == "1860f72499"  # the sparse task's cache folder


def test_warm_start_targets_slip_at_each_kinds_rate():
    from dapo.tasks.tiny_reasoning_model import STEP_ACCURACY, noisy_values, step_kind, warm_start_target

    rng = random.Random(0)
    chains = make_chains(400, 5)
    right = {"easy": 0, "medium": 0, "hard": 0}
    lines: dict[str, list[bool]] = {}
    for c in chains:
        t = warm_start_target(c, rng)
        assert t.startswith("1)") and "\nAnswer: " in t
        values = noisy_values(c, rng, clean=False)
        right[c.tier] += values[-1] == c.answer
        for (op, x), before, after in zip(c.ops, [c.start, *values], values):
            lines.setdefault(step_kind(before, op, apply(before, op, x)), []).append(
                after == apply(before, op, x)
            )
        # clean targets are the right working, without re-checked lines
        assert noisy_values(c, rng, clean=True) == c.values()
        assert warm_start_target(c, rng, clean=True) == working(c)
    # each kind of line is right at about its rate; chains are right less often the harder they are
    for kind, hits in lines.items():
        assert abs(sum(hits) / len(hits) - STEP_ACCURACY[kind]) < 0.05, kind
    assert 0.9 > right["easy"] / 100 > right["medium"] / 200 > right["hard"] / 100 > 0.05


def test_warm_start_never_sees_a_test_question():
    from dapo.tasks.tiny_reasoning_model import WARM_START_CHAINS, warm_start_chains

    test = {c.question for c in split_chains(2000, 128, 0)[1]}
    chains = warm_start_chains(0)
    assert len(chains) > 0.95 * WARM_START_CHAINS and not {c.question for c in chains} & test


@pytest.mark.parametrize("task", ["reasoning", "reasoning_sparse", "reasoning_wide"])
def test_reasoning_preset_runs_on_the_task(tmp_path, monkeypatch, task):
    from dapo.cli import main
    from dapo.tasks.tiny_reasoning_model import build_reasoning_model

    monkeypatch.setenv("DAPO_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "model"
    model.mkdir()
    build_reasoning_model(model, steps=1, log=lambda s: None)
    run = tmp_path / "run"
    rc = main(
        [
            "train",
            "--config-name",
            "reasoning",
            f"actor_rollout_ref.model.path={model}",
            f"data.builtin_task={task}",
            f"trainer.default_local_dir={run}",
            "trainer.total_training_steps=1",
            "trainer.val_before_train=false",
            "trainer.test_freq=0",
            "data.train_batch_size=2",
            "data.gen_batch_size=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "algorithm.filter_groups.enable=false",
            "data.val_max_samples=2",
            "actor_rollout_ref.rollout.val_kwargs.n=1",
        ]
    )
    assert rc == 0
    rows = metric_rows(run)
    m = next(r for r in rows if r.get("step") == 1 and "prompt_length/min" in r)
    # chain prompts (chat tokens + "dd 1)+d ... =") are 40+ tokens; arithmetic prompts are ~10
    assert m["prompt_length/min"] >= 40 and m["prompt_length/max"] <= 80
    assert m["response_length/max"] <= 256
    # the cache keeps a hidden ``.<name>.lock`` beside each built folder
    (data,) = [p for p in (tmp_path / "cache" / "data").iterdir() if not p.name.startswith(".")]
    assert data.name.startswith(f"{task}-")
    import pyarrow.parquet as pq

    train = pq.read_table(data / "train.parquet").to_pylist()
    tiers = [r["extra_info"]["tier"] for r in train]
    counts = [tiers.count(t) for t in ("easy", "medium", "hard", "beyond")]
    expected = {"reasoning": [504, 990, 506, 0], "reasoning_sparse": [15, 31, 15, 323]}
    assert counts == expected.get(task, [92, 61, 461, 922])
    split = {"reasoning_sparse": sparse_split, "reasoning_wide": wide_split}
    chains, test_chains = split.get(task, lambda: split_chains(2000, 128, 0))()
    assert [r["prompt"][0]["content"] for r in train] == [c.question for c in chains]
    test = pq.read_table(data / "test.parquet").to_pylist()
    # reasoning and reasoning_sparse are scored on the same held-out chains; each row names its tier
    assert [r["prompt"][0]["content"] for r in test] == [c.question for c in test_chains]
    assert [r["extra_info"]["tier"] for r in test] == [c.tier for c in test_chains]
    if task != "reasoning_wide":
        assert test_chains == split_chains(2000, 128, 0)[1]
