"""verl keys dapo accepts but does not implement, and other trainers' names for dapo's keys.

``UNIMPLEMENTED`` is the one list of verl keys that are read by nothing here. Setting one to a
value other than its default gets a warning naming the key, or an error where ignoring it
would silently change what is trained. A key leaves the list when it is implemented.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from omegaconf import OmegaConf

from dapo.config.schema import DapoConfig

_LOGPROB = "the reference log-prob pass uses actor_rollout_ref.rollout's log-prob settings"


@dataclass(frozen=True)
class Unimplemented:
    why: str
    # True: a non-default value is an error (ignoring it would change the results)
    reject: bool = False
    # values other than the default that mean what dapo does anyway
    same_as_default: tuple[Any, ...] = ()


UNIMPLEMENTED: dict[str, Unimplemented] = {
    "data.return_raw_chat": Unimplemented("prompts are always tokenized here; the raw chat is kept anyway"),
    "data.validation_shuffle": Unimplemented("validation always runs in file order"),
    "data.dataloader_num_workers": Unimplemented("prompts are read in the trainer process"),
    "data.trust_remote_code": Unimplemented("use actor_rollout_ref.model.trust_remote_code"),
    "actor_rollout_ref.hybrid_engine": Unimplemented("the actor always generates its own rollouts"),
    "actor_rollout_ref.actor.strategy": Unimplemented(
        "only fsdp (torch FSDP2) is implemented", reject=True, same_as_default=("fsdp2",)
    ),
    "actor_rollout_ref.actor.checkpoint.save_contents": Unimplemented(
        "checkpoints always hold the model, optimizer and trainer state"
    ),
    "actor_rollout_ref.ref.log_prob_micro_batch_size": Unimplemented(_LOGPROB),
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": Unimplemented(_LOGPROB),
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz": Unimplemented(_LOGPROB),
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": Unimplemented(_LOGPROB),
    "actor_rollout_ref.ref.fsdp_config.param_offload": Unimplemented(
        "the reference model follows the actor's"
    ),
    "actor_rollout_ref.ref.fsdp_config.optimizer_offload": Unimplemented(
        "the reference model has no optimizer"
    ),
    "actor_rollout_ref.ref.fsdp_config.fsdp_size": Unimplemented(
        "the reference model follows the actor's mesh"
    ),
    "actor_rollout_ref.ref.fsdp_config.model_dtype": Unimplemented("the reference model follows the actor's"),
    "actor_rollout_ref.rollout.multi_turn.interaction_config_path": Unimplemented(
        "no simulated-user interactions; tools only", reject=True
    ),
    "actor_rollout_ref.rollout.mode": Unimplemented("generation is synchronous (the hf engine)"),
    "actor_rollout_ref.rollout.calculate_log_probs": Unimplemented(
        "the sampler's log-probs are always kept (they cost nothing here)"
    ),
    "algorithm.lam": Unimplemented("only used by gae, which needs a critic; dapo is critic-free"),
    "algorithm.rollout_correction.loss_type": Unimplemented(
        "only used with bypass_mode; the policy loss is actor_rollout_ref.actor.policy_loss.loss_mode"
    ),
    "reward_model.enable": Unimplemented(
        "no learned reward model: rewards come from reward functions", reject=True
    ),
    "reward_model.use_reward_loop": Unimplemented("rewards are scored in the trainer's own pool"),
    "reward_model.launch_reward_fn_async": Unimplemented("rewards are scored in the trainer's own pool"),
    "trainer.log_val_generations": Unimplemented(
        "set trainer.validation_data_dir to dump every validation generation"
    ),
    "trainer.critic_warmup": Unimplemented("dapo is critic-free"),
}


def _fmt(value: Any) -> str:
    return json.dumps(value) if isinstance(value, bool | type(None)) else str(value)


def unimplemented_problems(cfg: Any) -> tuple[list[str], list[str]]:
    """(errors, warnings) for unimplemented keys set to something other than their default."""
    defaults = OmegaConf.structured(DapoConfig)
    errors, warnings = [], []
    for key, u in UNIMPLEMENTED.items():
        value, default = OmegaConf.select(cfg, key), OmegaConf.select(defaults, key)
        if value == default or value in u.same_as_default:
            continue
        msg = f"{key}={_fmt(value)} is accepted for verl compatibility but not implemented: {u.why}"
        if u.reject:
            errors.append(f"{msg}; remove it (or set {key}={_fmt(default)})")
        else:
            warnings.append(f"{msg}; it has no effect")
    return errors, warnings


# other trainers' names (TRL's GRPOConfig, OpenRLHF's arguments) -> dapo's key
FOREIGN_NAMES: dict[str, str] = {
    # TRL
    "learning_rate": "actor_rollout_ref.actor.optim.lr",
    "num_generations": "actor_rollout_ref.rollout.n",
    "per_device_train_batch_size": "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "gradient_accumulation_steps": "actor_rollout_ref.actor.ppo_mini_batch_size",
    "generation_batch_size": "data.gen_batch_size",
    "max_completion_length": "data.max_response_length",
    "max_prompt_length": "data.max_prompt_length",
    "beta": "actor_rollout_ref.actor.kl_loss_coef (with actor_rollout_ref.actor.use_kl_loss=true)",
    "epsilon": "actor_rollout_ref.actor.clip_ratio_low",
    "epsilon_high": "actor_rollout_ref.actor.clip_ratio_high",
    "num_iterations": "actor_rollout_ref.actor.ppo_epochs",
    "scale_rewards": "algorithm.norm_adv_by_std_in_grpo",
    "loss_type": "actor_rollout_ref.actor.loss_agg_mode",
    "importance_sampling_level": "actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
    "max_grad_norm": "actor_rollout_ref.actor.grad_clip",
    "warmup_steps": "actor_rollout_ref.actor.optim.lr_warmup_steps",
    "warmup_ratio": "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio",
    "num_train_epochs": "trainer.total_epochs",
    "max_steps": "trainer.total_training_steps",
    "save_steps": "trainer.save_freq",
    "eval_steps": "trainer.test_freq",
    "output_dir": "trainer.default_local_dir",
    "report_to": "trainer.logger",
    "model_name_or_path": "actor_rollout_ref.model.path",
    "reward_weights": "reward_model.objectives (a weight per objective)",
    # OpenRLHF
    "n_samples_per_prompt": "actor_rollout_ref.rollout.n",
    "rollout_batch_size": "data.train_batch_size",
    "micro_train_batch_size": "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "micro_rollout_batch_size": "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
    "init_kl_coef": "actor_rollout_ref.actor.kl_loss_coef (or algorithm.kl_ctrl.kl_coef for the in-reward KL)",
    "actor_learning_rate": "actor_rollout_ref.actor.optim.lr",
    "generate_max_len": "data.max_response_length",
    "prompt_max_len": "data.max_prompt_length",
    "max_epochs": "actor_rollout_ref.actor.ppo_epochs",
    "num_episodes": "trainer.total_epochs",
    "eps_clip": "actor_rollout_ref.actor.clip_ratio",
    "advantage_estimator": "algorithm.adv_estimator",
    "kl_estimator": "actor_rollout_ref.actor.kl_loss_type",
    "entropy_loss_coef": "actor_rollout_ref.actor.entropy_coeff",
    "pretrain": "actor_rollout_ref.model.path",
    "prompt_data": "data.train_files",
    "input_key": "data.prompt_key",
    "max_norm": "actor_rollout_ref.actor.grad_clip",
    "l2": "actor_rollout_ref.actor.optim.weight_decay",
    "lr_warmup_ratio": "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio",
    "dynamic_filtering": "algorithm.filter_groups.enable",
    "packing_samples": "actor_rollout_ref.model.use_remove_padding",
}


def foreign_hint(key: str) -> str | None:
    """dapo's name for another trainer's key (matched on the key's last part), or None."""
    return FOREIGN_NAMES.get(key.split(".")[-1])
