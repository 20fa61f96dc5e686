"""Each `dapo preprocess` format's output is accepted by `dapo train`, which runs a step on it."""

from pathlib import Path

import pytest

from dapo.cli import main
from runs import metric_rows

FIX = Path(__file__).parent / "fixtures"

FORMATS = {
    "gsm8k": ["--input", str(FIX / "gsm8k.jsonl")],
    "math": ["--input", str(FIX / "math.jsonl")],
    "dapo-math-17k": ["--input", str(FIX / "dapo_math_17k.parquet")],
    "aime2024": ["--input", str(FIX / "aime2024.jsonl")],
    "generic": [
        "--input",
        str(FIX / "generic.csv"),
        "--prompt-column",
        "q",
        "--answer-column",
        "a",
        "--data-source",
        "arithmetic",
    ],
}


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_preprocessed_data_trains(tmp_path, tiny_random_model_dir, fmt):
    out = tmp_path / "data"
    assert main(["preprocess", fmt, *FORMATS[fmt], "--output", str(out)]) == 0
    (data,) = sorted(out.glob("*.parquet"))
    run_dir = tmp_path / "run"
    rc = main(
        [
            "train",
            f"data.train_files={data}",
            f"data.val_files={data}",
            f"actor_rollout_ref.model.path={tiny_random_model_dir}",
            f"trainer.default_local_dir={run_dir}",
            "data.max_prompt_length=1024",
            "data.max_response_length=8",
            "reward_model.overlong_buffer.len=2",
            "trainer.total_training_steps=1",
            "trainer.torch_threads=1",
            "trainer.val_before_train=false",
            "trainer.logger=[jsonl]",
            "trainer.save_final_model=false",
            "data.train_batch_size=2",
            "data.gen_batch_size=2",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "algorithm.filter_groups.enable=false",
            "actor_rollout_ref.rollout.val_kwargs.n=1",
            "data.val_max_samples=2",
        ]
    )
    assert rc == 0
    row = metric_rows(run_dir)[0]
    assert "actor/pg_loss" in row and row["reward/errors"] == 0
