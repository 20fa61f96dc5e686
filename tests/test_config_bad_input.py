"""Every bad configuration is rejected before any work, with a message naming the key."""

import pytest
import yaml

from dapo.config.load import load_config, preset_names
from fixtures.config_helpers import config_problems as problems


@pytest.mark.parametrize("preset", preset_names())
def test_every_preset_is_valid(preset):
    assert problems(preset=preset) == []


def test_unknown_key_is_named_with_a_suggestion():
    (p,) = problems("actor_rollout_ref.actor.clip_ratio_hihg=0.3")
    assert "actor_rollout_ref.actor.clip_ratio_hihg" in p and "clip_ratio_high" in p


def test_gen_batch_smaller_than_train_batch():
    (p,) = problems("data.gen_batch_size=8", "data.train_batch_size=16")
    assert "data.gen_batch_size=8" in p and "data.train_batch_size=16" in p


def test_train_batch_not_divisible_by_mini_batch():
    ps = problems("data.train_batch_size=16", "actor_rollout_ref.actor.ppo_mini_batch_size=6")
    assert any("not divisible by actor_rollout_ref.actor.ppo_mini_batch_size=6" in p for p in ps)


def test_unknown_loss_agg_mode():
    (p,) = problems("actor_rollout_ref.actor.loss_agg_mode=token-median")
    assert "actor_rollout_ref.actor.loss_agg_mode" in p and "seq-mean-token-mean" in p


def test_unknown_filter_metric():
    (p,) = problems("algorithm.filter_groups.metric=accuracy")
    assert "algorithm.filter_groups.metric" in p and "'accuracy'" in p


def test_greedy_groups_cannot_be_filtered():
    # n identical greedy samples never have spread: the step would never fill
    (p,) = problems("actor_rollout_ref.rollout.do_sample=false", "actor_rollout_ref.rollout.n=4")
    assert "algorithm.filter_groups.enable" in p and "do_sample=false" in p and "n=4" in p
    assert problems("actor_rollout_ref.rollout.do_sample=false", "algorithm.filter_groups.enable=false") == []
    n1 = problems("actor_rollout_ref.rollout.do_sample=false", "actor_rollout_ref.rollout.n=1")
    assert not any("algorithm.filter_groups.enable" in p for p in n1)


def test_wrong_type_names_the_key():
    (p,) = problems("data.train_batch_size=many")
    assert "data.train_batch_size" in p


def test_all_problems_reported_together():
    ps = problems(
        "data.gen_batch_size=4", "actor_rollout_ref.actor.loss_agg_mode=x", "algorithm.adv_estimator=gae"
    )
    assert len(ps) == 3


def test_verl_plus_syntax_and_reward_kwargs_alias():
    cfg = load_config(
        [
            "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
            "+reward_model.reward_kwargs.overlong_buffer_cfg.len=6",
            "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=0.5",
            "++actor_rollout_ref.rollout.n=4",
            "+actor_rollout_ref.model.override_config.max_position_embeddings=256",
        ]
    )
    assert cfg.reward_model.overlong_buffer.enable is True
    assert cfg.reward_model.overlong_buffer.len == 6
    assert cfg.reward_model.overlong_buffer.penalty_factor == 0.5
    assert cfg.actor_rollout_ref.rollout.n == 4
    assert cfg.actor_rollout_ref.model.override_config.max_position_embeddings == 256


def test_interpolated_run_dir():
    cfg = load_config(["trainer.project_name=p", "trainer.experiment_name=e"])
    assert cfg.trainer.default_local_dir == "checkpoints/p/e"


def test_dapo_preset_has_recipe_values():
    cfg = load_config([], preset="dapo")
    a = cfg.actor_rollout_ref.actor
    assert (a.clip_ratio_low, a.clip_ratio_high, a.clip_ratio_c) == (0.2, 0.28, 10.0)
    assert cfg.algorithm.filter_groups.enable and cfg.algorithm.filter_groups.metric == "acc"
    assert cfg.algorithm.filter_groups.max_num_gen_batches == 10
    assert (cfg.data.train_batch_size, cfg.data.gen_batch_size, cfg.actor_rollout_ref.rollout.n) == (
        512,
        1536,
        16,
    )
    assert cfg.reward_model.overlong_buffer.len == 4096


def test_cli_validate_exit_code(capsys):
    from dapo.cli import main

    assert main(["validate", "data.gen_batch_size=1", "data.train_batch_size=2"]) == 2
    err = capsys.readouterr().err
    assert "data.gen_batch_size=1" in err
    assert main(["validate"]) == 0
    out = capsys.readouterr()
    assert "configuration OK" in out.err
    printed, loaded = yaml.safe_load(out.out), load_config([])  # the resolved configuration
    assert printed["data"]["train_batch_size"] == loaded.data.train_batch_size
    assert (
        printed["actor_rollout_ref"]["actor"]["loss_agg_mode"] == loaded.actor_rollout_ref.actor.loss_agg_mode
    )


@pytest.mark.parametrize(
    "overrides, says",
    [
        (["algorithm.filter_groups.strategy=verl"], "needs strategy default"),
        (["algorithm.filter_groups.max_staleness=0"], "max_staleness >= 1"),
        (["algorithm.use_kl_in_reward=true"], "use_kl_in_reward=false"),
        (["trainer.n_gpus_per_node=2"], "one actor rank"),
    ],
)
def test_prefetch_conflicts_are_named(overrides, says):
    ps = problems("algorithm.filter_groups.prefetch=true", *overrides)
    assert any("algorithm.filter_groups.prefetch" in p and says in p for p in ps), ps


@pytest.mark.parametrize(
    "override, named",
    [
        ("actor_rollout_ref.rollout.placement=remote", "actor_rollout_ref.rollout.placement"),
        ("actor_rollout_ref.rollout.tensor_model_parallel_size=2", "must be 1 on CPU"),
        ("actor_rollout_ref.rollout.dtype=int8", "actor_rollout_ref.rollout.dtype"),
        ("actor_rollout_ref.rollout.load_format=pt", "actor_rollout_ref.rollout.load_format"),
    ],
)
def test_vllm_rollout_keys(override, named):
    # a model of one's own: vLLM on CPU refuses the built-in models' head size (24)
    (p,) = problems("actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.model.path=/models/m", override)
    assert named in p


def test_vllm_prefetch_needs_the_in_process_engine():
    """Prefetch runs on the in-process engine; the vLLM server has no prefetch path."""
    keys = ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.model.path=/models/m"]
    keys.append("algorithm.filter_groups.prefetch=true")
    (p,) = problems(*keys, "actor_rollout_ref.rollout.placement=server")
    assert "prefetch needs placement=colocated" in p and "prefetch=false" in p
    assert problems(*keys) == []


def test_unknown_rollout_name():
    (p,) = problems("actor_rollout_ref.rollout.name=sglang")
    assert "'sglang'" in p and "use hf or vllm" in p


def test_ulysses_rules_name_the_key(tmp_path):
    key = "actor_rollout_ref.actor.ulysses_sequence_parallel_size"
    ok = ("trainer.n_gpus_per_node=4", "actor_rollout_ref.model.use_remove_padding=true")
    assert problems(f"{key}=2", *ok) == []  # the built-in tiny model: 4 heads, 2 kv heads
    (p,) = problems(f"{key}=3", "trainer.n_gpus_per_node=3", ok[1])
    assert p.startswith(f"{key}=3") and "num_attention_heads=4" in p
    (p,) = problems(f"{key}=2", "trainer.n_gpus_per_node=4")
    assert key in p and "use_remove_padding=true" in p
    (p,) = problems(f"{key}=4", "trainer.n_gpus_per_node=2", ok[1])
    assert p.startswith(f"{key}=4 must divide the 2 ranks")
    (tmp_path / "config.json").write_text('{"num_attention_heads": 8, "num_key_value_heads": 3}')
    (p,) = problems(f"{key}=2", *ok, f"actor_rollout_ref.model.path={tmp_path}")
    assert "num_key_value_heads=3" in p
    (p,) = problems(f"{key}=2", *ok, "actor_rollout_ref.ref.ulysses_sequence_parallel_size=1")
    assert p.startswith("actor_rollout_ref.ref.ulysses_sequence_parallel_size=1")
