"""The configuration schema: verl's key names, one dataclass per block, defaults here only.

Defaults follow verl's ``ppo_trainer.yaml`` + the DAPO recipe yaml (VERL_SPEC section 2)
except where a comment says why we differ (CPU-first, no critic, no hub).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dapo.config.sampling import FilterGroupsConfig


@dataclass
class DataConfig:
    # parquet path or list of paths; null means the built-in arithmetic task (written on first use)
    train_files: Any = None
    val_files: Any = None
    prompt_key: str = "prompt"
    reward_fn_key: str = "data_source"
    max_prompt_length: int = 512
    max_response_length: int = 512
    train_batch_size: int = 1024
    # prompts per generation round; null means train_batch_size (the DAPO yaml's default)
    gen_batch_size: int | None = None
    val_batch_size: int | None = None
    truncation: str = "error"
    filter_overlong_prompts: bool = False
    return_raw_chat: bool = True
    shuffle: bool = True
    seed: int | None = None
    validation_shuffle: bool = False
    dataloader_num_workers: int = 8
    train_max_samples: int = -1
    val_max_samples: int = -1
    trust_remote_code: bool = False
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    # ours: the built-in task (and tiny model) used when train_files (model.path) is null:
    # arithmetic (short answers) or reasoning (chained operations with written working)
    builtin_task: str = "arithmetic"


@dataclass
class KLCtrlConfig:
    type: str = "fixed"
    kl_coef: float = 0.001
    horizon: int = 10000
    target_kl: float = 0.1


@dataclass
class RolloutCorrectionConfig:
    rollout_is: str | None = None
    # a float, or verl's "lower_upper" string form such as "0.5_2.0"
    rollout_is_threshold: Any = 2.0
    rollout_rs: str | None = None
    rollout_rs_threshold: Any = None
    bypass_mode: bool = False
    loss_type: str = "ppo_clip"
    rollout_is_batch_normalize: bool = False


@dataclass
class AlgorithmConfig:
    # verl's default is gae, which needs a critic; dapo is critic-free, so grpo is the default
    adv_estimator: str = "grpo"
    norm_adv_by_std_in_grpo: bool = True
    gamma: float = 1.0
    lam: float = 1.0
    use_kl_in_reward: bool = False
    kl_penalty: str = "kl"
    kl_ctrl: KLCtrlConfig = field(default_factory=KLCtrlConfig)
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)


@dataclass
class OptimConfig:
    lr: float = 1e-6
    lr_warmup_steps: int = -1
    lr_warmup_steps_ratio: float = 0.0
    lr_scheduler_type: str = "constant"
    min_lr_ratio: float = 0.0
    num_cycles: float = 0.5
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    total_training_steps: int = -1


@dataclass
class PolicyLossConfig:
    loss_mode: str = "vanilla"
    clip_cov_ratio: float = 0.0002
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 0.0002
    ppo_kl_coef: float = 0.1


@dataclass
class FSDPConfig:
    param_offload: bool = False
    optimizer_offload: bool = False
    fsdp_size: int = -1
    model_dtype: str = "fp32"


@dataclass
class CheckpointConfig:
    save_contents: list[str] = field(default_factory=lambda: ["model", "optimizer", "extra"])


@dataclass
class ActorConfig:
    strategy: str = "fsdp"
    ppo_mini_batch_size: int = 256
    ppo_micro_batch_size: int | None = None
    ppo_micro_batch_size_per_gpu: int | None = None
    use_dynamic_bsz: bool = False
    # a number of tokens, or auto (chosen from a measured probe: see trainer.auto_budget)
    ppo_max_token_len_per_gpu: Any = 16384
    ppo_epochs: int = 1
    # ours: when the update is exactly on-policy, take the old log-probs from the update's own
    # forward (detached) instead of a separate pass (dapo.actor.old_log_prob); false: always recompute, as verl
    on_policy_fast_path: bool = True
    shuffle: bool = False
    data_loader_seed: int = 42
    clip_ratio: float = 0.2
    clip_ratio_low: float | None = 0.2
    clip_ratio_high: float | None = 0.2
    clip_ratio_c: float = 3.0
    loss_agg_mode: str = "token-mean"
    loss_scale_factor: float | None = None
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    entropy_coeff: float = 0.0
    calculate_entropy: bool = False
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    grad_clip: float = 1.0
    ulysses_sequence_parallel_size: int = 1
    optim: OptimConfig = field(default_factory=OptimConfig)
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)


@dataclass
class RefConfig:
    log_prob_micro_batch_size: int | None = None
    log_prob_micro_batch_size_per_gpu: int | None = None
    log_prob_use_dynamic_bsz: bool = False
    log_prob_max_token_len_per_gpu: Any = 16384  # or auto
    # verl interpolates it from the actor's; null here means the same (the ref shares the ranks)
    ulysses_sequence_parallel_size: int | None = None
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)


@dataclass
class ValKwargsConfig:
    top_k: int = -1
    top_p: float = 1.0
    temperature: float = 0.0
    n: int = 1
    do_sample: bool = False


@dataclass
class MultiTurnConfig:
    enable: bool = False
    max_assistant_turns: int | None = None
    max_user_turns: int | None = None
    max_parallel_calls: int = 1
    max_tool_response_length: int = 256
    tool_response_truncate_side: str = "middle"
    tool_config_path: str | None = None
    interaction_config_path: str | None = None
    format: str = "hermes"


@dataclass
class RolloutConfig:
    # verl requires a name (vllm/sglang/hf); "hf" is our KV-cached engine for any transformers model
    name: str = "hf"
    mode: str = "sync"
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    do_sample: bool = True
    # null means data.max_prompt_length / data.max_response_length, as verl interpolates
    prompt_length: int | None = None
    response_length: int | None = None
    log_prob_micro_batch_size: int | None = None
    log_prob_micro_batch_size_per_gpu: int | None = None
    log_prob_use_dynamic_bsz: bool = False
    log_prob_max_token_len_per_gpu: Any = 16384  # or auto
    # verl's default is false; we always keep the sampler's log-probs (they cost nothing here)
    calculate_log_probs: bool = True
    tensor_model_parallel_size: int | None = None
    gpu_memory_utilization: float | None = None
    val_kwargs: ValKwargsConfig = field(default_factory=ValKwargsConfig)
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)


@dataclass
class ModelConfig:
    # a Hugging Face model directory; null means the built-in tiny model (built and cached on first use)
    path: str | None = None
    tokenizer_path: str | None = None
    # verl defaults these to true for GPU kernels; on CPU they only cost time, so off by default
    use_remove_padding: bool = False
    enable_gradient_checkpointing: bool = False
    trust_remote_code: bool = False
    override_config: dict[str, Any] = field(default_factory=dict)
    custom_chat_template: str | None = None


@dataclass
class ActorRolloutRefConfig:
    hybrid_engine: bool = True
    model: ModelConfig = field(default_factory=ModelConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    ref: RefConfig = field(default_factory=RefConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)


@dataclass
class OverlongBufferConfig:
    enable: bool = False
    len: int = 0
    penalty_factor: float = 0.0
    log: bool = False


@dataclass
class ScoringConfig:
    """ours: how reward functions are isolated (``dapo.reward.manager.ScoringConfig``).

    auto: the built-in regex scorers run in-process, everything else in worker processes
    with a per-sample wall-clock timeout; process: everything in workers; inline: nothing.
    A failed or timed-out sample scores ``failure_score`` and is counted.
    ``step_timeout_s`` bounds one step's worker scoring (null: no bound); samples without a
    result by then count as timeouts. ``memory_limit_mb`` caps each worker's address space
    (0: no cap).
    """

    mode: str = "auto"
    timeout_s: float = 10.0
    failure_score: float = -1.0
    num_workers: int | None = None
    step_timeout_s: float | None = None
    memory_limit_mb: float = 8192


@dataclass
class RewardObjectiveConfig:
    """ours: one weighted reward function of a multi-objective reward."""

    name: str = "score"
    weight: float = 1.0
    # a python file with the function; null means the built-in data_source router
    path: str | None = None
    function: str = "compute_score"
    reward_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class RewardModelConfig:
    enable: bool = False
    reward_manager: str = "dapo"
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    # verl scripts pass +reward_model.reward_kwargs.overlong_buffer_cfg.* and .max_resp_len;
    # overlong_buffer_cfg is read as an alias of reward_model.overlong_buffer
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
    use_reward_loop: bool = True
    launch_reward_fn_async: bool = False
    # ours: safe scoring and multi-objective rewards (each objective is logged as reward/<name>/mean
    # and can be named by algorithm.filter_groups.metric)
    scoring: ScoringConfig = field(default_factory=ScoringConfig)
    objectives: list[RewardObjectiveConfig] | None = None


@dataclass
class CustomRewardFunctionConfig:
    path: str | None = None
    name: str = "compute_score"
    reward_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class AutoBudgetConfig:
    """ours: how ``...max_token_len_per_gpu=auto`` budgets are sized. ``memory_limit_gb``: what
    the process may use (null: what the device / machine has free, the address-space limit or
    the cgroup limit, whichever is smallest); ``margin``: the share of it kept free."""

    memory_limit_gb: float | None = None
    margin: float = 0.2


@dataclass
class TrainerConfig:
    total_epochs: int = 30
    total_training_steps: int | None = None
    project_name: str = "verl-dapo"
    experiment_name: str = "default"
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    log_val_generations: int = 0
    rollout_data_dir: str | None = None
    validation_data_dir: str | None = None
    nnodes: int = 1
    n_gpus_per_node: int = 1
    save_freq: int = -1
    test_freq: int = -1
    resume_mode: str = "auto"
    resume_from_path: str | None = None
    val_before_train: bool = True
    val_only: bool = False
    critic_warmup: int = 0
    # verl's default is true; it only matters with several data-parallel ranks
    balance_batch: bool = False
    default_local_dir: str = "checkpoints/${trainer.project_name}/${trainer.experiment_name}"
    max_actor_ckpt_to_keep: int | None = None
    # ours: where actor ranks run when nnodes x n_gpus_per_node > 1: auto (processes on one node,
    # Ray across nodes) | inprocess | process | ray
    worker_backend: str = "auto"
    auto_budget: AutoBudgetConfig = field(default_factory=AutoBudgetConfig)
    # verl's default is cuda; dapo runs on CPU unless told otherwise
    device: str = "cpu"
    # ours: the seed of every RNG (model init, sampler, rollout) and torch's CPU thread count (0: all cores)
    seed: int = 1
    torch_threads: int = 0
    # torch.profiler chrome traces of these steps in <run_dir>/profile
    profile_steps: list[int] | None = None
    # ours: refresh <run_dir>/report.html every N steps and at the last step (0: off)
    report_freq: int = 0
    # ours: also measure held-out accuracy after training and save the final model (summary.json)
    save_final_model: bool = True


@dataclass
class DapoConfig:
    data: DataConfig = field(default_factory=DataConfig)
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    custom_reward_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
