"""A scorer that never returns and one that kills its own process do not stall training."""

from pathlib import Path

from dapo.cli import main
from dapo.tasks.arithmetic import write_task
from runs import metric_rows

FIXTURES = Path(__file__).parent / "fixtures"


def test_hung_and_dying_scorers_are_counted_and_the_step_completes(tmp_path, tiny_random_model_dir):
    train, test = write_task(tmp_path / "data", train_size=20, test_size=4)
    run_dir = tmp_path / "run"
    rc = main(
        [
            "train",
            f"data.train_files={train}",
            f"data.val_files={test}",
            f"actor_rollout_ref.model.path={tiny_random_model_dir}",
            f"trainer.default_local_dir={run_dir}",
            "trainer.total_training_steps=1",
            "trainer.torch_threads=1",
            "trainer.val_before_train=false",
            "trainer.logger=[jsonl]",
            "trainer.save_final_model=false",
            "data.train_batch_size=2",
            "data.gen_batch_size=2",
            "actor_rollout_ref.rollout.n=8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
            "algorithm.filter_groups.enable=false",
            f"custom_reward_function.path={FIXTURES / 'hostile_reward.py'}",
            "reward_model.scoring.mode=process",
            "reward_model.scoring.timeout_s=1.0",
            "reward_model.scoring.num_workers=2",
            "actor_rollout_ref.rollout.val_kwargs.n=1",
        ]
    )
    assert rc == 0
    rows = metric_rows(run_dir)
    step = next(r for r in rows if r["step"] == 1)
    assert "actor/pg_loss" in step  # the update ran
    # 16 random responses: with 5 length classes some hang and some die (seeded, checked below)
    assert step["reward/timeouts"] >= 1
    assert step["reward/errors"] >= 1 and step["reward/worker_deaths"] >= 1
