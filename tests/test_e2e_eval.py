"""`dapo eval` on a run's final model prints the run's last validation numbers (same seed)."""

import json
from pathlib import Path

from dapo.cli import main
from dapo.data.builtin import write_task

FIXTURES = Path(__file__).parent / "fixtures"


def test_eval_reproduces_last_validation(tmp_path, tiny_random_model_dir, capsys):
    train, test = write_task(tmp_path / "data", train_size=24, test_size=12)
    common = [
        f"data.train_files={train}",
        f"data.val_files={test}",
        "trainer.torch_threads=1",
        f"custom_reward_function.path={FIXTURES / 'parity_reward.py'}",
        "reward_model.scoring.mode=inline",
        "actor_rollout_ref.rollout.val_kwargs.n=4",
    ]
    run_dir = tmp_path / "run"
    assert (
        main(
            [
                "train",
                *common,
                f"actor_rollout_ref.model.path={tiny_random_model_dir}",
                f"trainer.default_local_dir={run_dir}",
                "trainer.total_training_steps=2",
                "trainer.logger=[jsonl]",
                "trainer.val_before_train=false",
                "data.train_batch_size=4",
                "data.gen_batch_size=4",
                "actor_rollout_ref.rollout.n=4",
                "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
                "algorithm.filter_groups.enable=false",
                "actor_rollout_ref.actor.optim.lr=1e-2",
            ]
        )
        == 0
    )
    last = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    capsys.readouterr()
    assert (
        main(
            [
                "eval",
                "--model",
                str(run_dir / "final_model"),
                *common,
                f"trainer.default_local_dir={tmp_path / 'eval'}",
            ]
        )
        == 0
    )
    printed = dict(line.split(" = ") for line in capsys.readouterr().out.splitlines() if " = " in line)
    core = {k: v for k, v in last.items() if k.startswith("val-core/")}
    assert core and set(core) <= set(printed)
    for k, v in core.items():
        assert float(printed[k]) == round(v, 6) or abs(float(printed[k]) - v) < 1e-6, k
