"""verl's configuration keys reach dapo: the DAPO recipe's command line validates through the real
CLI, every leaf key of verl's PPO trainer config is implemented or accepted and ignored (named
once in one note per reason), values that ignoring would change are refused, verl's other
spellings of a key are read into it, and notes name only the keys the user set."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import dapo.config.machine
from dapo.cli import main
from dapo.config.compat import ignored_group, ignored_groups
from dapo.config.load import verl_alias
from dapo.config.schema import DapoConfig
from dapo.run_config import build_run_config
from fixtures.config_helpers import config_problems, run_config

FIXTURES = Path(__file__).parent / "fixtures"
VERL_KEY_FILES = ["verl_ppo_trainer_keys_0.9.1.txt", "verl_ppo_trainer_keys_main_b178a3cd.txt"]

# The arguments of `python3 -m recipe.dapo.main_dapo` in verl-recipe's dapo/run_dapo_qwen2.5_32b.sh
# (the same at the commit verl pins and at the recipe's head), with the shell variables replaced
# by the values the script sets and {home} standing for $HOME (RAY_DATA_HOME defaults to $HOME/verl).
RECIPE_32B = [
    "data.train_files={home}/verl/data/dapo-math-17k.parquet",
    "data.val_files={home}/verl/data/aime-2024.parquet",
    "data.prompt_key=prompt",
    "data.truncation=left",
    "data.max_prompt_length=2048",
    "data.max_response_length=20480",
    "data.gen_batch_size=1536",
    "data.train_batch_size=512",
    "actor_rollout_ref.rollout.n=16",
    "algorithm.adv_estimator=grpo",
    "algorithm.use_kl_in_reward=False",
    "algorithm.kl_ctrl.kl_coef=0.0",
    "actor_rollout_ref.actor.use_kl_loss=False",
    "actor_rollout_ref.actor.kl_loss_coef=0.0",
    "actor_rollout_ref.actor.clip_ratio_low=0.2",
    "actor_rollout_ref.actor.clip_ratio_high=0.28",
    "actor_rollout_ref.actor.clip_ratio_c=10.0",
    "algorithm.filter_groups.enable=True",
    "algorithm.filter_groups.max_num_gen_batches=10",
    "algorithm.filter_groups.metric=acc",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.actor.use_dynamic_bsz=True",
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True",
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=22528",
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=22528",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=22528",
    "actor_rollout_ref.model.path={home}/verl/models/Qwen2.5-32B",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.actor.optim.lr_warmup_steps=10",
    "actor_rollout_ref.actor.optim.weight_decay=0.1",
    "actor_rollout_ref.actor.ppo_mini_batch_size=32",
    "actor_rollout_ref.actor.fsdp_config.param_offload=True",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True",
    "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.actor.grad_clip=1.0",
    "actor_rollout_ref.actor.loss_agg_mode=token-mean",
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size=8",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.80",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=4",
    "actor_rollout_ref.rollout.enable_chunked_prefill=True",
    "actor_rollout_ref.rollout.max_num_batched_tokens=22528",
    "actor_rollout_ref.rollout.temperature=1.0",
    "actor_rollout_ref.rollout.top_p=1.0",
    "actor_rollout_ref.rollout.top_k=-1",
    "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
    "actor_rollout_ref.rollout.val_kwargs.top_p=0.7",
    "actor_rollout_ref.rollout.val_kwargs.top_k=-1",
    "actor_rollout_ref.rollout.val_kwargs.do_sample=True",
    "actor_rollout_ref.rollout.val_kwargs.n=1",
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "actor_rollout_ref.ref.ulysses_sequence_parallel_size=8",
    "actor_rollout_ref.actor.fsdp_config.fsdp_size=-1",
    "reward_model.reward_manager=dapo",
    "reward_model.overlong_buffer.enable=True",
    "reward_model.overlong_buffer.len=4096",
    "reward_model.overlong_buffer.penalty_factor=1.0",
    'trainer.logger=["console","wandb"]',
    "trainer.project_name=DAPO",
    "trainer.experiment_name=DAPO-Qwen2.5-32B",
    "trainer.n_gpus_per_node=8",
    "trainer.nnodes=16",
    "trainer.val_before_train=True",
    "trainer.test_freq=5",
    "trainer.save_freq=5",
    "trainer.total_epochs=1",
    "trainer.default_local_dir={home}/verl/ckpts/DAPO/DAPO-Qwen2.5-32B",
    "trainer.resume_mode=auto",
]

# what of the recipe dapo accepts and ignores: the reference pass follows the rollout's log-prob
# settings and the actor's offload, and vLLM's chunked prefill is not passed on
RECIPE_32B_IGNORED = {
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz",
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",
    "actor_rollout_ref.ref.fsdp_config.param_offload",
    "actor_rollout_ref.rollout.enable_chunked_prefill",
}

ACCEPTED = re.compile(r"^note: (?P<keys>.*?) (?:is|are) accepted for verl compatibility and ignored: ")


def _named(notes: list[str]) -> list[str]:
    """What the accepted-and-ignored notes name, once per mention: a key (``key=value``), a block
    of keys (``block.* (N keys)``) or the keys with one last part (``**.part (N keys)``)."""
    named = []
    for note in notes:
        m = ACCEPTED.match(note)
        if m:
            found = re.findall(r"(?:^|, )(?:([\w.-]+)=|([\w.*-]+) \(\d+ keys\))", m.group("keys"))
            named += [key or group for key, group in found]
    return named


def _covers(entry: str, key: str) -> bool:
    if entry.endswith(".*"):
        return key.startswith(entry[:-1])
    if entry.startswith("**."):
        return key.endswith(entry[2:])
    return entry == key


def _each_named_once(notes: list[str], keys: list[str]) -> None:
    """Each key is named by exactly one entry of its group's note (a key, or the block holding it),
    and each entry of a note names one of that note's keys."""
    by_note = {n: [] for n in notes if ACCEPTED.match(n)}
    for key in keys:
        (note,) = [n for n in by_note if n.endswith(ignored_group(key).why)]
        by_note[note].append(key)
    for note, mine in by_note.items():
        entries = _named([note])
        for key in mine:
            assert len([e for e in entries if _covers(e, key)]) == 1, key
        for entry in entries:
            assert any(_covers(entry, key) for key in mine), entry


def _recipe_machine(home: Path, monkeypatch) -> None:
    """The files the recipe names, under a fake $HOME, and a machine with 8 GPUs."""
    data = home / "verl" / "data"
    data.mkdir(parents=True)
    for name in ("dapo-math-17k.parquet", "aime-2024.parquet"):
        shutil.copy(FIXTURES / "dapo_math_17k.parquet", data / name)
    model = home / "verl" / "models" / "Qwen2.5-32B"
    model.mkdir(parents=True)
    # Qwen2.5-32B's attention shape: SP 8 must split 40 query and 8 key/value heads
    shape = {"model_type": "qwen2", "num_attention_heads": 40, "num_key_value_heads": 8, "hidden_size": 5120}
    (model / "config.json").write_text(json.dumps(shape))
    (model / "model.safetensors.index.json").write_text("{}")  # its shards, as validate looks for them
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setattr(dapo.config.machine, "cuda_device_count", lambda: 8)


def test_recipe_32b_command_line_validates_and_names_each_ignored_key_once(tmp_path, monkeypatch, capsys):
    _recipe_machine(tmp_path, monkeypatch)
    args = [a.format(home=tmp_path) for a in RECIPE_32B]
    assert main(["validate", "-c", "dapo", *args]) == 0
    out = capsys.readouterr()
    assert "configuration OK" in out.err
    notes = [line for line in out.err.splitlines() if line.startswith("note: ")]
    named = _named(notes)
    assert sorted(named) == sorted(RECIPE_32B_IGNORED)  # each once, nothing else
    # one note per reason, each saying why
    (chunked,) = [n for n in notes if "enable_chunked_prefill" in n]
    assert "vLLM" in chunked and "does not pass to its engine" in chunked
    (ref,) = [n for n in notes if "log_prob_use_dynamic_bsz" in n]
    assert "log_prob_max_token_len_per_gpu=22528" in ref and "rollout's log-prob settings" in ref
    # and the values the run uses are the recipe's
    cfg = build_run_config(args, preset="dapo").cfg
    assert cfg.actor_rollout_ref.rollout.max_num_batched_tokens == 22528
    assert cfg.trainer.logger == ["console", "wandb"]
    assert cfg.actor_rollout_ref.model.path == f"{tmp_path}/verl/models/Qwen2.5-32B"


def test_the_dapo_preset_alone_names_no_key():
    # the preset sets the reference pass's log-prob keys as the recipe does: not the user's keys
    run = build_run_config([], preset="dapo")
    assert _named([f"note: {w}" for w in run.warnings]) == []
    again = build_run_config(["actor_rollout_ref.ref.log_prob_use_dynamic_bsz=true"], preset="dapo")
    assert _named([f"note: {w}" for w in again.warnings]) == [
        "actor_rollout_ref.ref.log_prob_use_dynamic_bsz"
    ]


def test_keys_in_the_users_own_yaml_file_are_named(tmp_path):
    own = tmp_path / "mine.yaml"
    own.write_text(
        "actor_rollout_ref:\n"
        "  actor:\n    ppo_micro_batch_size_per_gpu: 4\n"
        "  ref:\n    log_prob_use_dynamic_bsz: true\n"
        "  rollout:\n    enable_chunked_prefill: false\n    engine_kwargs:\n      vllm:\n        swap_space: 4\n"
        "critic:\n  optim:\n    lr: 1.0e-5\n"
    )
    run = build_run_config([], preset=str(own))
    assert sorted(_named([f"note: {w}" for w in run.warnings])) == [
        "actor_rollout_ref.ref.log_prob_use_dynamic_bsz",
        "actor_rollout_ref.rollout.enable_chunked_prefill",
        "actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space",
        "critic.optim.lr",
    ]
    # a refused value inside a block is found: the block is read key by key
    own.write_text(
        "actor_rollout_ref:\n  actor:\n    ppo_micro_batch_size_per_gpu: 4\n"
        "  model:\n    lora:\n      rank: 64\n      alpha: 32\n"
    )
    (p,) = config_problems(preset=str(own))
    assert p.startswith("actor_rollout_ref.model.lora.rank=64 is accepted for verl compatibility but not")


def _verl_lines(name: str) -> list[str]:
    text = (FIXTURES / name).read_text()
    return [line for line in text.splitlines() if line and not line.startswith("#")]


DEFAULTS = OmegaConf.structured(DapoConfig)


def _outside_schema(key: str) -> bool:
    return OmegaConf.select(DEFAULTS, key, default="\0") == "\0" and verl_alias(key) is None


@pytest.mark.parametrize("name", VERL_KEY_FILES)
def test_every_verl_ppo_trainer_key_is_accepted(name):
    lines = _verl_lines(name)
    assert len(lines) > 500
    # verl's defaults of dapo's own keys may be refused (adv_estimator=gae, rollout.name=???), but no
    # key is unknown and no key outside the schema is refused at verl's default
    outside = [line.split("=", 1)[0] for line in lines if _outside_schema(line.split("=", 1)[0])]
    problems = config_problems(*lines)
    assert [p for p in problems if "unknown configuration key" in p] == []
    assert [p for p in problems if any(p.startswith((f"{k}=", f"{k}:")) for k in outside)] == []
    assert all(ignored_group(k) is not None for k in outside)


@pytest.mark.parametrize("name", VERL_KEY_FILES)
def test_every_ignored_verl_key_is_named_once(name):
    lines = [line for line in _verl_lines(name) if _outside_schema(line.split("=", 1)[0])]
    run = build_run_config(lines)  # the default preset: valid with every verl-only key at its default
    notes = [f"note: {w}" for w in run.warnings]
    expected = [k for k in (line.split("=", 1)[0] for line in lines) if not ignored_group(k).reject]
    _each_named_once(notes, expected)
    assert any(n.startswith("note: critic.* (") for n in notes)  # a verl-only block is named as one
    assert len([n for n in notes if ACCEPTED.match(n)]) <= len(ignored_groups())


@pytest.mark.parametrize(
    "override, says",
    [
        ("actor_rollout_ref.model.lora_rank=64", "LoRA adapters are not implemented"),
        ("actor_rollout_ref.actor.optim.optimizer=SGD", "torch's AdamW"),
        ("actor_rollout_ref.rollout.ignore_eos=true", "end-of-sequence"),
        ("actor_rollout_ref.rollout.quantization=fp8", "quantized rollouts"),
        ("algorithm.rollout_correction.rollout_token_veto_threshold=0.0001", "no token veto"),
        ("algorithm.use_pf_ppo=true", "PF-PPO"),
        ("actor_rollout_ref.ref.strategy=megatron", "only fsdp"),
        ("+data.custom_cls.path=my_dataset.py", "custom dataset classes"),
    ],
)
def test_a_value_that_ignoring_would_change_is_refused(override, says):
    (p,) = config_problems(override)
    key, value = override.lstrip("+").split("=", 1)
    assert p.startswith(f"{key}={value} is accepted for verl compatibility but not implemented: ")
    assert says in p and "remove it (or set " in p


def test_refused_keys_at_their_off_value_are_silent():
    run = build_run_config(
        [
            "actor_rollout_ref.model.lora_rank=0",
            "actor_rollout_ref.rollout.ignore_eos=false",
            "algorithm.use_pf_ppo=false",
        ]
    )
    assert _named([f"note: {w}" for w in run.warnings]) == []


def test_the_six_keys_that_were_unknown_are_accepted():
    keys = [
        "actor_rollout_ref.rollout.enable_chunked_prefill=True",
        "actor_rollout_ref.actor.use_torch_compile=False",
        "actor_rollout_ref.model.lora_rank=0",
        "actor_rollout_ref.model.use_shm=True",
        "actor_rollout_ref.rollout.layered_summon=True",
        "actor_rollout_ref.actor.fsdp_config.forward_prefetch=True",
    ]
    run = build_run_config(keys)
    assert sorted(_named([f"note: {w}" for w in run.warnings])) == sorted(
        k.split("=")[0] for k in keys if "lora_rank" not in k
    )


def test_a_misspelt_verl_key_is_still_unknown_and_the_right_one_suggested():
    (p,) = config_problems("actor_rollout_ref.rollout.enable_chunked_prefil=True")
    assert "unknown configuration key" in p and "actor_rollout_ref.rollout.enable_chunked_prefill" in p


def test_verl_0_9_reward_tree_and_other_spellings_are_read_into_dapos_keys():
    cfg = run_config(
        "+reward.reward_kwargs.overlong_buffer_cfg.enable=True",
        "+reward.reward_kwargs.overlong_buffer_cfg.len=6",
        "+reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=0.5",
        "reward.reward_manager.name=naive",
        "actor_rollout_ref.actor.optim.clip_grad=0.5",
        "actor_rollout_ref.actor.optim.warmup_style=cosine",
    )
    ob = cfg.reward_model.overlong_buffer
    assert (ob.enable, ob.len, ob.penalty_factor) == (True, 6, 0.5)
    assert cfg.reward_model.reward_manager == "naive"
    assert cfg.actor_rollout_ref.actor.grad_clip == 0.5
    assert cfg.actor_rollout_ref.actor.optim.lr_scheduler_type == "cosine"


def test_a_verl_0_9_yaml_file_is_read(tmp_path):
    own = tmp_path / "verl09.yaml"
    own.write_text(
        "reward:\n"
        "  num_workers: 8\n"
        "  reward_manager:\n    source: register\n    name: naive\n"
        "  custom_reward_function:\n    path: null\n    name: compute_score\n"
        "actor_rollout_ref:\n  actor:\n    ppo_micro_batch_size_per_gpu: 4\n"
        "    fsdp_config:\n      ulysses_sequence_parallel_size: 1\n"
        "    optim:\n      clip_grad: 0.25\n"
    )
    run = build_run_config([], preset=str(own))
    assert run.cfg.reward_model.reward_manager == "naive"
    assert run.cfg.actor_rollout_ref.actor.grad_clip == 0.25
    assert _named([f"note: {w}" for w in run.warnings]) == ["reward.num_workers"]


def test_two_spellings_of_one_key_that_disagree_are_a_problem():
    (p,) = config_problems(
        "actor_rollout_ref.actor.optim.clip_grad=0.5", "actor_rollout_ref.actor.grad_clip=1.0"
    )
    assert "actor_rollout_ref.actor.optim.clip_grad=0.5 and actor_rollout_ref.actor.grad_clip=1.0" in p
    assert "keep one of them" in p
    assert (
        config_problems(
            "actor_rollout_ref.actor.optim.clip_grad=0.5", "actor_rollout_ref.actor.grad_clip=0.5"
        )
        == []
    )


def test_deleting_an_ignored_key_is_accepted():
    assert config_problems("~actor_rollout_ref.rollout.enable_chunked_prefill") == []
    (p,) = config_problems("~actor_rollout_ref.rollout.enable_chunked_prefil")
    assert "unknown configuration key" in p
