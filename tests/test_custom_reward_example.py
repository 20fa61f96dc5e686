"""examples/custom_reward.py, run as the README shows it: `dapo train` scores every response with
it, so each dumped score is the example's own verdict on that dumped response."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from dapo.cli import main

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "custom_reward.py"


def _example():
    spec = importlib.util.spec_from_file_location("custom_reward_example", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_example_scores_hand_checked_responses():
    score = _example().compute_score
    assert score("arithmetic", "3 + 4 = 7. Answer: 7", "7") == {"score": 1.0, "acc": True, "numbers_given": 4}
    assert score("arithmetic", "Answer: 8", "7")["score"] == 0.0
    assert score("arithmetic", "I do not know", "7") == {"score": -0.1, "acc": False, "numbers_given": 0}
    assert score("arithmetic", "Answer: -7", "-7")["acc"] is True


@pytest.mark.slow
def test_dapo_train_scores_with_the_example(tmp_path):
    run = tmp_path / "run"
    code = main(
        [
            "train",
            f"custom_reward_function.path={EXAMPLE}",
            f"trainer.default_local_dir={run}",
            "trainer.total_training_steps=2",
            "trainer.torch_threads=1",
            "trainer.val_before_train=false",
            "trainer.save_final_model=false",
            "trainer.logger=[console,jsonl]",
            "data.val_max_samples=8",
            "data.train_batch_size=4",
            "data.gen_batch_size=4",
            "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
            "algorithm.filter_groups.enable=false",
            "reward_model.overlong_buffer.enable=false",
        ]
    )
    assert code == 0
    score = _example().compute_score
    rows = [json.loads(line) for f in sorted((run / "rollout_dumps").glob("*.jsonl")) for line in f.open()]
    assert len(rows) == 2 * 4 * 4  # every trained response of both steps
    for r in rows:
        assert r["score"] == pytest.approx(score("arithmetic", r["output"], r["gts"])["score"]), r["output"]
    # the warm-started model answers some right and some wrong: both verdicts were exercised
    assert {r["score"] for r in rows} >= {0.0, 1.0}
    # the dict's other values travel with each response
    for r in rows:
        assert r["numbers_given"] == score("arithmetic", r["output"], r["gts"])["numbers_given"]


def test_a_reward_file_that_does_not_compile_is_one_line_naming_file_and_line(tmp_path):
    from dapo.errors import DapoError
    from dapo.reward.pool import load_function_from_file

    bad = tmp_path / "bad.py"
    bad.write_text("def compute_score(**kw)\n    return 1\n")
    with pytest.raises(DapoError) as e:
        load_function_from_file(str(bad), "compute_score")
    assert str(e.value) == (
        f"custom_reward_function.path: {bad} line 1: expected ':'; fix the file "
        "(python -m py_compile FILE shows the same)"
    )
    bad.write_text("def compute_score(**kw):\n    return 1\n")  # fixed: the same path loads
    assert load_function_from_file(str(bad), "compute_score")() == 1
