"""The config's one typed path: resolve (every null-means-X rule), `dapo validate` printing what
the run uses, `--explain`, every problem in one pass, other trainers' names, unimplemented verl
keys, and the config-level surprises a newcomer meets."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from omegaconf import OmegaConf

from dapo.cli import main
from dapo.config.compat import UNIMPLEMENTED
from dapo.config.explain import key_docs
from dapo.config.load import ConfigError, load_config, preset_names, preset_path
from dapo.config.resolve import resolve
from dapo.config.schema import DapoConfig
from dapo.run_config import build_run_config
from fixtures.config_helpers import config_problems

A = "actor_rollout_ref.actor"
R = "actor_rollout_ref.rollout"


def _resolved(*overrides: str, rows: int | None = None):
    return resolve(load_config(list(overrides), preset=None), num_train_rows=rows)


def _warnings(*overrides: str, preset: str | None = "default") -> list[str]:
    return list(build_run_config(list(overrides), preset=preset).warnings)


def test_each_null_rule_by_hand():
    c = _resolved(
        "data.train_batch_size=8",
        "data.max_prompt_length=7",
        "data.max_response_length=9",
        "trainer.seed=5",
        "trainer.total_epochs=3",
        f"{A}.clip_ratio=0.1",
        f"{A}.clip_ratio_low=null",
        f"{A}.clip_ratio_high=null",
        f"{A}.ppo_mini_batch_size=4",
        f"{R}.n=3",
        f"{A}.use_dynamic_bsz=true",
        f"{A}.optim.lr_warmup_steps_ratio=0.25",
        "actor_rollout_ref.model.path=/m",
        rows=100,
    )
    assert (c.data.gen_batch_size, c.data.val_batch_size, c.data.seed) == (8, 256, 5)
    r, a = c.actor_rollout_ref.rollout, c.actor_rollout_ref.actor
    assert (r.prompt_length, r.response_length) == (7, 9)
    assert c.actor_rollout_ref.model.tokenizer_path == "/m"
    assert (r.tensor_model_parallel_size, r.seed) == (1, 5)  # vLLM's: one TP rank, the run's seed
    assert (a.clip_ratio_low, a.clip_ratio_high) == (0.1, 0.1)
    assert a.ppo_micro_batch_size_per_gpu == 12  # one micro-batch per mini-batch: 4 prompts x 3
    assert r.log_prob_micro_batch_size_per_gpu == 12 and r.log_prob_use_dynamic_bsz is True
    assert c.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu == 12
    assert c.trainer.total_training_steps == 100 // 8 * 3 == 36
    assert a.optim.lr_warmup_steps == 9 and a.optim.total_training_steps == 36  # int(0.25 x 36)
    assert resolve(c, num_train_rows=100) == c  # idempotent


def test_deprecated_global_micro_batches_become_per_rank():
    c = _resolved(
        f"{A}.ppo_micro_batch_size=8",
        f"{R}.log_prob_micro_batch_size=6",
        "trainer.n_gpus_per_node=2",
    )
    a, r = c.actor_rollout_ref.actor, c.actor_rollout_ref.rollout
    assert (a.ppo_micro_batch_size_per_gpu, a.ppo_micro_batch_size) == (4, None)
    assert (r.log_prob_micro_batch_size_per_gpu, r.log_prob_micro_batch_size) == (3, None)


def test_set_values_are_kept_and_few_steps_of_data_still_train_one():
    c = _resolved("data.gen_batch_size=48", "data.seed=3", f"{A}.optim.lr_warmup_steps=2", rows=5)
    assert (c.data.gen_batch_size, c.data.seed) == (48, 3)
    assert c.trainer.total_training_steps == 30  # 5 rows < one batch: one step per epoch x 30
    assert c.actor_rollout_ref.actor.optim.lr_warmup_steps == 2


def _validate_out(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["validate", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_validate_prints_no_null_for_a_derived_key(capsys, tmp_path):
    data = tmp_path / "train.parquet"
    pq.write_table(pa.table({"prompt": ["q"] * 40}), data)
    rc, out, _ = _validate_out(
        capsys, f"data.train_files={data}", "trainer.total_training_steps=null", "data.gen_batch_size=null"
    )
    assert rc == 0
    cfg = yaml.safe_load(out)
    assert cfg["trainer"]["total_training_steps"] == 40 // 16 * 1  # default preset: 16 prompts, 1 epoch
    assert cfg["data"]["gen_batch_size"] == 16 and cfg["data"]["val_batch_size"] == 256
    r = cfg["actor_rollout_ref"]["rollout"]
    assert (r["prompt_length"], r["response_length"]) == (32, 24)
    assert r["log_prob_micro_batch_size_per_gpu"] == 64
    assert cfg["actor_rollout_ref"]["actor"]["optim"]["total_training_steps"] == 2


def test_explain_lists_actor_keys_with_values_defaults_and_meanings(capsys):
    rc, out, _ = _validate_out(capsys, "--explain", A, f"{A}.clip_ratio_high=0.3")
    assert rc == 0
    lines = out.splitlines()
    keys = [ln.split(" = ")[0] for ln in lines[::2]]
    assert keys == [k for k in key_docs() if k.startswith(A + ".")] and len(keys) > 30
    i = keys.index(f"{A}.clip_ratio_high")
    assert lines[2 * i] == f"{A}.clip_ratio_high = 0.3   [default 0.2]"
    assert "upper clip" in lines[2 * i + 1]
    j = keys.index(f"{A}.ppo_micro_batch_size_per_gpu")
    assert lines[2 * j] == f"{A}.ppo_micro_batch_size_per_gpu = 64   [default null]"
    # a derived value says it was resolved
    rc, out, _ = _validate_out(capsys, "--explain", "data.gen_batch_size", "data.gen_batch_size=null")
    assert out.splitlines()[0] == "data.gen_batch_size = 16 (set null, resolved)   [default null]"
    assert "[accepted, not implemented" in _validate_out(capsys, "--explain", "trainer.critic_warmup")[1]
    assert main(["validate", "--explain", "no.such"]) == 2


def test_every_key_has_a_meaning():
    docs = key_docs()
    assert len(docs) > 150
    assert [k for k, v in docs.items() if not v.strip()] == []


def test_every_problem_in_one_pass(capsys, tmp_path):
    preset = tmp_path / "p.yaml"
    preset.write_text(
        "data:\n  train_batch_size: many\n  max_promt_length: 3\nactor_rollout_ref:\n  rollout:\n    n: 0\n"
    )
    rc = main(
        [
            "validate",
            "-c",
            str(preset),
            "trainer.total_epochs=x",
            "trainer.nosuch=1",
            "algorithm.adv_estimator=nope",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2
    for needle in (
        "data.train_batch_size: Value 'many'",
        "data.max_promt_length: unknown configuration key; did you mean data.max_prompt_length",
        "trainer.total_epochs=x",
        "trainer.nosuch: unknown configuration key",
        "actor_rollout_ref.rollout.n: must be >= 1",
        "algorithm.adv_estimator: unknown estimator 'nope'",
    ):
        assert needle in err, needle


@pytest.mark.parametrize(
    "name,dapo_key",
    [
        ("learning_rate", "actor_rollout_ref.actor.optim.lr"),
        ("num_generations", "actor_rollout_ref.rollout.n"),
        ("per_device_train_batch_size", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"),
        ("max_completion_length", "data.max_response_length"),
        ("beta", "actor_rollout_ref.actor.kl_loss_coef"),
        ("epsilon_high", "actor_rollout_ref.actor.clip_ratio_high"),
        ("num_iterations", "actor_rollout_ref.actor.ppo_epochs"),
        ("n_samples_per_prompt", "actor_rollout_ref.rollout.n"),
        ("rollout_batch_size", "data.train_batch_size"),
        ("micro_train_batch_size", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"),
        ("init_kl_coef", "actor_rollout_ref.actor.kl_loss_coef"),
        ("actor_learning_rate", "actor_rollout_ref.actor.optim.lr"),
        ("generate_max_len", "data.max_response_length"),
        ("prompt_max_len", "data.max_prompt_length"),
    ],
)
def test_other_trainers_names_point_to_dapos(name, dapo_key):
    with pytest.raises(ConfigError) as e:
        load_config([f"{name}=1"])
    (p,) = e.value.problems
    assert p.startswith(f"{name}: unknown configuration key; dapo's name for it is {dapo_key}")
    assert OmegaConf.select(OmegaConf.structured(DapoConfig), dapo_key.split(" ")[0]) is not None or (
        dapo_key.endswith("_per_gpu")
    )


def test_unimplemented_keys_warn_by_name_or_are_refused():
    assert len(UNIMPLEMENTED) >= 16
    defaults = OmegaConf.structured(DapoConfig)
    for key in UNIMPLEMENTED:  # every listed key exists, at its default nothing is said
        assert OmegaConf.select(defaults, key, default="missing") != "missing", key
    assert _warnings(f"{A}.optim.lr_warmup_steps=0") == []
    warnings = _warnings(
        "data.validation_shuffle=true",
        "trainer.log_val_generations=10",
        "actor_rollout_ref.actor.optim.lr_warmup_steps=0",
    )
    assert len(warnings) == 2
    assert warnings[0].startswith("data.validation_shuffle=true is accepted")
    assert warnings[1].startswith("trainer.log_val_generations=10 is accepted")
    refused = config_problems("actor_rollout_ref.actor.strategy=megatron", "reward_model.enable=true")
    assert [p.split("=")[0] for p in refused] == [
        "actor_rollout_ref.actor.strategy",
        "reward_model.enable",
    ]
    # implemented keys are not on the list: bypass_mode uses the sampler's log-probs as the old ones
    assert "algorithm.rollout_correction.bypass_mode" not in UNIMPLEMENTED
    assert config_problems("algorithm.rollout_correction.bypass_mode=true") == []
    assert config_problems("actor_rollout_ref.actor.strategy=fsdp2") == []


def test_overlong_buffer_as_long_as_the_response_is_refused():
    # the default 8-token buffer with 8-token responses penalised every token and validated OK
    (p,) = config_problems("data.max_response_length=8")
    assert p.startswith("reward_model.overlong_buffer.len=8 is not shorter than data.max_response_length=8")
    assert config_problems("data.max_response_length=9") == []
    assert config_problems("data.max_response_length=8", "reward_model.overlong_buffer.enable=false") == []


def test_filtering_off_says_it_trains_on_the_generation_batch():
    (w,) = [
        w
        for w in _warnings("algorithm.filter_groups.enable=false")
        if w.startswith("algorithm.filter_groups")
    ]
    assert "data.gen_batch_size=32" in w and "not data.train_batch_size=16" in w and "verl" in w
    assert not any(
        w.startswith("algorithm.filter_groups")
        for w in _warnings("algorithm.filter_groups.enable=false", "data.gen_batch_size=null")
    )


def test_warmup_says_the_first_step_has_lr_zero(capsys):
    assert main(["validate"]) == 0
    err = capsys.readouterr().err
    assert (
        "actor_rollout_ref.actor.optim.lr_warmup_steps=2" in err
        and "step 1's policy update runs at lr 0 (the weights do not move)" in err
    )
    ratio = _warnings(f"{A}.optim.lr_warmup_steps=-1", f"{A}.optim.lr_warmup_steps_ratio=0.1")
    assert [w for w in ratio if "lr_warmup_steps=4:" in w]  # int(0.1 x 40 steps), resolved first


def test_one_cause_one_message_for_the_mini_batch():
    (p,) = config_problems(f"{A}.ppo_mini_batch_size=32")
    assert "exceeds data.train_batch_size=16" in p
    (p,) = config_problems(f"{A}.ppo_mini_batch_size=5", f"{A}.ppo_micro_batch_size_per_gpu=8")
    assert "not divisible" in p


def test_presets_hold_only_what_differs_from_the_schema():
    defaults = OmegaConf.structured(DapoConfig)
    for name in preset_names():
        raw = OmegaConf.load(preset_path(name))
        same = [
            k
            for k in _leaves(OmegaConf.to_container(raw, resolve=False))
            if OmegaConf.select(raw, k, throw_on_resolution_failure=False)
            == OmegaConf.select(defaults, k, default=object())
            and OmegaConf.select(defaults, k) is not None
        ]
        assert same == [], f"preset {name} restates schema defaults: {same}"


def _leaves(d: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in d.items():
        key = f"{prefix}{k}"
        out.extend(_leaves(v, key + ".") if isinstance(v, dict) else [key])
    return out


def test_help_lists_every_command_with_an_example_and_train_help_points_to_the_keys(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for cmd in ("train", "validate", "eval", "data", "preprocess", "bench", "view", "report", "model"):
        assert f"\n  {cmd} " in out.split("commands, with an example each:")[1], cmd
        assert f"dapo {cmd}" in out
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    assert "dapo validate --explain" in capsys.readouterr().out


def test_a_retired_key_names_its_replacement():
    with pytest.raises(ConfigError) as e:
        load_config(["algorithm.filter_groups.skip.max_consecutive=64"])
    (p,) = e.value.problems
    assert p.startswith(
        "algorithm.filter_groups.skip.max_consecutive: no longer a configuration key; it was replaced by "
        "algorithm.filter_groups.skip.revisit_epochs"
    )
