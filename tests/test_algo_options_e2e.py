"""Every algorithm option is reachable from `dapo train` and runs a step."""

from pathlib import Path

import pytest

from dapo.cli import main
from dapo.tasks.arithmetic import write_task
from runs import metric_rows

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def small_data(tmp_path_factory):
    return write_task(tmp_path_factory.mktemp("algo_data"), train_size=40, test_size=8)


def _run(tmp_path, model_dir, data, *extra) -> dict:
    train, test = data
    run_dir = tmp_path / "run"
    rc = main(
        [
            "train",
            f"data.train_files={train}",
            f"data.val_files={test}",
            f"actor_rollout_ref.model.path={model_dir}",
            f"trainer.default_local_dir={run_dir}",
            "trainer.total_training_steps=1",
            "trainer.torch_threads=1",
            "trainer.val_before_train=false",
            "trainer.logger=[jsonl]",
            "trainer.save_final_model=false",
            "data.train_batch_size=4",
            "data.gen_batch_size=4",
            "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "algorithm.filter_groups.enable=false",
            f"custom_reward_function.path={FIXTURES / 'parity_reward.py'}",
            "reward_model.scoring.mode=inline",
            *extra,
        ]
    )
    assert rc == 0
    rows = metric_rows(run_dir)
    (row,) = [r for r in rows if r["step"] == 1]
    assert row["actor/grad_norm"] > 0 and row["actor/pg_loss"] == row["actor/pg_loss"]  # trained, not NaN
    return row


@pytest.mark.parametrize(
    "estimator",
    ["grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "opo", "grpo_passk"],
)
def test_advantage_estimators(tmp_path, tiny_random_model_dir, small_data, estimator):
    row = _run(tmp_path, tiny_random_model_dir, small_data, f"algorithm.adv_estimator={estimator}")
    if estimator == "remax":
        assert row["timing_s/gen_max"] > 0


def test_dr_grpo(tmp_path, tiny_random_model_dir, small_data):
    _run(tmp_path, tiny_random_model_dir, small_data, "algorithm.norm_adv_by_std_in_grpo=false")


@pytest.mark.parametrize("mode", ["vanilla", "geo_mean", "gspo", "cispo", "clip_cov", "kl_cov"])
def test_policy_loss_modes(tmp_path, tiny_random_model_dir, small_data, mode):
    row = _run(
        tmp_path,
        tiny_random_model_dir,
        small_data,
        f"actor_rollout_ref.actor.policy_loss.loss_mode={mode}",
        "actor_rollout_ref.actor.ppo_epochs=2",
    )
    assert "actor/ppo_kl" in row


@pytest.mark.parametrize(
    "agg", ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
)
def test_loss_agg_modes(tmp_path, tiny_random_model_dir, small_data, agg):
    _run(tmp_path, tiny_random_model_dir, small_data, f"actor_rollout_ref.actor.loss_agg_mode={agg}")


@pytest.mark.parametrize("kl_type", ["kl", "abs", "mse", "low_var_kl", "k3+", "k1+"])
def test_kl_loss(tmp_path, tiny_random_model_dir, small_data, kl_type):
    row = _run(
        tmp_path,
        tiny_random_model_dir,
        small_data,
        "actor_rollout_ref.actor.use_kl_loss=true",
        f"actor_rollout_ref.actor.kl_loss_type={kl_type}",
        "actor_rollout_ref.actor.kl_loss_coef=0.1",
    )
    assert "actor/kl_loss" in row and row["actor/kl_coef"] == 0.1 and row["timing_s/ref"] > 0


@pytest.mark.parametrize("ctrl", ["fixed", "adaptive"])
def test_kl_in_reward(tmp_path, tiny_random_model_dir, small_data, ctrl):
    row = _run(
        tmp_path,
        tiny_random_model_dir,
        small_data,
        "algorithm.use_kl_in_reward=true",
        f"algorithm.kl_ctrl.type={ctrl}",
        "algorithm.kl_penalty=low_var_kl",
        "algorithm.kl_ctrl.kl_coef=0.05",
    )
    assert "actor/reward_kl_penalty" in row and "actor/reward_kl_penalty_coeff" in row


def test_entropy_bonus_and_metric(tmp_path, tiny_random_model_dir, small_data):
    row = _run(
        tmp_path,
        tiny_random_model_dir,
        small_data,
        "actor_rollout_ref.actor.entropy_coeff=0.01",
        "actor_rollout_ref.actor.calculate_entropy=true",
    )
    assert row["actor/entropy"] > 0


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_rollout_importance_sampling(tmp_path, tiny_random_model_dir, small_data, level):
    row = _run(
        tmp_path,
        tiny_random_model_dir,
        small_data,
        f"algorithm.rollout_correction.rollout_is={level}",
        "algorithm.rollout_correction.rollout_is_threshold=2.0",
    )
    assert any(k.startswith("rollout_corr/") for k in row)


def test_cosine_schedule_with_warmup(tmp_path, tiny_random_model_dir, small_data):
    row = _run(
        tmp_path,
        tiny_random_model_dir,
        small_data,
        "actor_rollout_ref.actor.optim.lr_scheduler_type=cosine",
        "actor_rollout_ref.actor.optim.lr_warmup_steps=1",
        "actor_rollout_ref.actor.optim.lr=1e-3",
    )
    assert row["actor/lr"] == 0.0  # step 1 is still inside the warmup (lr x 0/1)
