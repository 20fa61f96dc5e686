"""Non-finite gradients skip the optimizer step and are counted; several in a row stop the run
with a clear error and the last checkpoint intact."""

from pathlib import Path

import torch
from safetensors.torch import load_file

from dapo.checkpoint.store import find_resume_checkpoint
from dapo.cli import main
from dapo.tasks.arithmetic import write_task
from runs import metric_rows

FIXTURES = Path(__file__).parent / "fixtures"


def test_nonfinite_steps_are_skipped_then_stop_the_run(tmp_path, tiny_random_model_dir, capsys):
    train, test = write_task(tmp_path / "data", train_size=24, test_size=4)
    run_dir = tmp_path / "run"
    rc = main(
        [
            "train",
            f"data.train_files={train}",
            f"data.val_files={test}",
            f"actor_rollout_ref.model.path={tiny_random_model_dir}",
            f"trainer.default_local_dir={run_dir}",
            "trainer.total_training_steps=6",
            "trainer.torch_threads=1",
            "trainer.val_before_train=false",
            "trainer.logger=[jsonl]",
            "trainer.save_freq=1",
            "data.train_batch_size=2",
            "data.gen_batch_size=2",
            "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
            "algorithm.filter_groups.enable=false",
            f"custom_reward_function.path={FIXTURES / 'nan_reward.py'}",
            "reward_model.scoring.mode=inline",
        ]
    )
    assert rc == 2
    err = capsys.readouterr().err
    assert "3 optimizer steps in a row had a non-finite gradient norm" in err and "resume" in err
    rows = metric_rows(run_dir)
    assert [r["actor/nonfinite_steps"] for r in rows] == [1.0, 2.0]
    # the last checkpoint is intact: complete, and its weights are the (finite) initial weights
    ckpt = find_resume_checkpoint(run_dir, "auto", None)
    assert ckpt is not None and ckpt.name == "global_step_2"
    saved = load_file(ckpt / "actor" / "huggingface" / "model.safetensors")
    initial = load_file(Path(tiny_random_model_dir) / "model.safetensors")
    for k, v in initial.items():
        assert torch.equal(saved[k], v), k
