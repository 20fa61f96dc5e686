"""The configuration schema: verl's key names, one dataclass per block, defaults here only.

Defaults follow verl's ``trainer/config/ppo_trainer.yaml`` and the DAPO recipe's yaml
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
    # held-out parquet path(s) for validation; null with the built-in task means its test split
    val_files: Any = None
    # column holding the chat messages (or text) of each prompt
    prompt_key: str = "prompt"
    # column naming each row's data source, which picks its reward function
    reward_fn_key: str = "data_source"
    # longest prompt in tokens (after the chat template); see truncation
    max_prompt_length: int = 512
    # most tokens generated per response (all turns together in multi-turn)
    max_response_length: int = 512
    # prompts (groups) per training step; each brings actor_rollout_ref.rollout.n responses
    train_batch_size: int = 1024
    # prompts per generation round; null means train_batch_size (the DAPO yaml's default)
    gen_batch_size: int | None = None
    # prompts per validation generation call; null means 256
    val_batch_size: int | None = None
    # over-long prompts: error | left | right | middle (which part to cut)
    truncation: str = "error"
    # drop prompts longer than max_prompt_length when the data is loaded
    filter_overlong_prompts: bool = False
    # verl: hand the raw chat to the rollout
    return_raw_chat: bool = True
    # shuffle the training prompts every epoch
    shuffle: bool = True
    # seed of the prompt order; null means trainer.seed
    seed: int | None = None
    # verl: shuffle the validation set
    validation_shuffle: bool = False
    # verl: data loader processes
    dataloader_num_workers: int = 8
    # use only the first N training rows (-1: all)
    train_max_samples: int = -1
    # use only the first N validation rows (-1: all)
    val_max_samples: int = -1
    # verl: remote code for the data's tokenizer
    trust_remote_code: bool = False
    # extra keyword arguments of tokenizer.apply_chat_template (e.g. enable_thinking)
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    # ours: the built-in task (and tiny model) used when train_files (model.path) is null:
    # arithmetic (short answers), reasoning (chained operations with written working) or
    # reasoning_sparse (the same chains, most beyond the tiny model's reach: few groups with spread),
    # reasoning_wide (a large pool, for coverage) or reasoning_longtail (chains of 1 to 16
    # operations: response lengths differ tenfold within a round)
    builtin_task: str = "arithmetic"


@dataclass
class KLCtrlConfig:
    # in-reward KL coefficient: fixed | adaptive (moves toward target_kl)
    type: str = "fixed"
    # (initial) coefficient of the in-reward KL penalty (algorithm.use_kl_in_reward)
    kl_coef: float = 0.001
    # adaptive controller: samples over which the coefficient adapts
    horizon: int = 10000
    # adaptive controller: the KL it steers toward
    target_kl: float = 0.1


@dataclass
class RolloutCorrectionConfig:
    # importance weights between sampler and trainer: null (off) | token | sequence
    rollout_is: str | None = None
    # a float, or verl's "lower_upper" string form such as "0.5_2.0"
    rollout_is_threshold: Any = 2.0
    # rejection of responses whose sampler/trainer divergence is too large: null (off) or its measure(s)
    rollout_rs: str | None = None
    # the rejection bound(s) for rollout_rs (one per measure)
    rollout_rs_threshold: Any = None
    # verl: use the sampler's log-probs as old log-probs
    bypass_mode: bool = False
    # verl: the loss of bypass mode
    loss_type: str = "ppo_clip"
    # divide the importance weights by their batch mean
    rollout_is_batch_normalize: bool = False


@dataclass
class AlgorithmConfig:
    # verl's default is gae, which needs a critic; dapo is critic-free, so grpo is the default
    adv_estimator: str = "grpo"
    # grpo: divide each group's centred rewards by their std (false: Dr. GRPO)
    norm_adv_by_std_in_grpo: bool = True
    # discount factor of the token-level estimators (reinforce_plus_plus)
    gamma: float = 1.0
    # verl: GAE lambda
    lam: float = 1.0
    # subtract a KL penalty against the reference policy from the token rewards
    use_kl_in_reward: bool = False
    # estimator of the in-reward KL: kl | abs | mse | low_var_kl | full (+ for straight-through)
    kl_penalty: str = "kl"
    kl_ctrl: KLCtrlConfig = field(default_factory=KLCtrlConfig)
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)


@dataclass
class OptimConfig:
    # AdamW learning rate (peak, after warmup)
    lr: float = 1e-6
    # steps of linear warmup from lr 0 (step 1 trains at lr 0); -1 means lr_warmup_steps_ratio x total steps
    lr_warmup_steps: int = -1
    # warmup as a fraction of the total training steps, when lr_warmup_steps is -1
    lr_warmup_steps_ratio: float = 0.0
    # after warmup: constant | cosine (decays to min_lr_ratio x lr)
    lr_scheduler_type: str = "constant"
    # cosine: the final learning rate as a fraction of lr
    min_lr_ratio: float = 0.0
    # cosine: number of cosine cycles over training (0.5: one decay)
    num_cycles: float = 0.5
    # AdamW weight decay
    weight_decay: float = 0.01
    # AdamW betas
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    # verl sets it from trainer.total_training_steps; -1 means that value
    total_training_steps: int = -1


@dataclass
class PolicyLossConfig:
    # policy loss: vanilla (PPO clip, DAPO clip-higher) | gspo | geo_mean | cispo | clip_cov | kl_cov
    loss_mode: str = "vanilla"
    # clip_cov: fraction of tokens whose gradient is cut
    clip_cov_ratio: float = 0.0002
    # clip_cov: lower bound of the covariance band
    clip_cov_lb: float = 1.0
    # clip_cov: upper bound of the covariance band
    clip_cov_ub: float = 5.0
    # kl_cov: fraction of tokens that get the KL penalty
    kl_cov_ratio: float = 0.0002
    # kl_cov: coefficient of that KL penalty
    ppo_kl_coef: float = 0.1


@dataclass
class FSDPConfig:
    # keep parameters on the CPU between uses (distributed ranks)
    param_offload: bool = False
    # keep optimizer state on the CPU between steps (distributed ranks)
    optimizer_offload: bool = False
    # ranks per FSDP shard group (-1: all ranks; fewer: HSDP replicas)
    fsdp_size: int = -1
    # ours: weight dtype: fp32 | bf16 | fp16 (fp32 keeps small RL updates)
    model_dtype: str = "fp32"


@dataclass
class CheckpointConfig:
    # verl: what a checkpoint holds
    save_contents: list[str] = field(default_factory=lambda: ["model", "optimizer", "extra"])


@dataclass
class ActorConfig:
    # verl: training backend; only fsdp (torch FSDP2) exists here
    strategy: str = "fsdp"
    # prompts per optimizer step (x rollout.n trajectories); a step's batch gives train_batch_size / this many
    # updates
    ppo_mini_batch_size: int = 256
    # deprecated global micro-batch (trajectories, all ranks); use ppo_micro_batch_size_per_gpu
    ppo_micro_batch_size: int | None = None
    # trajectories per forward/backward on one rank (gradient accumulation); null: the deprecated key / dp,
    # else one per mini-batch
    ppo_micro_batch_size_per_gpu: int | None = None
    # form micro-batches by a token budget (ppo_max_token_len_per_gpu) instead of a row count
    use_dynamic_bsz: bool = False
    # token budget of one micro-batch when use_dynamic_bsz: a number of tokens, or auto (chosen from a
    # measured probe: see trainer.auto_budget)
    ppo_max_token_len_per_gpu: Any = 16384
    # passes over each training batch
    ppo_epochs: int = 1
    # ours: when the update is exactly on-policy, take the old log-probs from the update's own
    # forward (detached) instead of a separate pass (dapo.actor.old_log_prob); false: always recompute, as verl
    on_policy_fast_path: bool = True
    # shuffle the trajectories before cutting mini-batches (each epoch)
    shuffle: bool = False
    # seed of that shuffle
    data_loader_seed: int = 42
    # PPO clip range; the default of clip_ratio_low and clip_ratio_high
    clip_ratio: float = 0.2
    # lower clip: the ratio is kept above 1 - clip_ratio_low; null means clip_ratio
    clip_ratio_low: float | None = 0.2
    # upper clip: the ratio is kept below 1 + clip_ratio_high (DAPO clip-higher: 0.28); null means clip_ratio
    clip_ratio_high: float | None = 0.2
    # dual clip for negative advantages: the loss is at most -A x clip_ratio_c (> 1)
    clip_ratio_c: float = 3.0
    # how token losses become one number: token-mean | token-sum | seq-mean-token-sum | seq-mean-token-mean |
    # seq-mean-token-sum-norm
    loss_agg_mode: str = "token-mean"
    # seq-mean-token-sum-norm: the constant divisor (null: the response length)
    loss_scale_factor: float | None = None
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    # weight of the entropy bonus subtracted from the loss
    entropy_coeff: float = 0.0
    # compute and log the entropy in the update even when entropy_coeff is 0
    calculate_entropy: bool = False
    # add a KL loss against the reference policy (GRPO-style) to the actor loss
    use_kl_loss: bool = False
    # weight of that KL loss
    kl_loss_coef: float = 0.001
    # KL estimator of the loss: kl | abs | mse | low_var_kl | full (+ for straight-through)
    kl_loss_type: str = "low_var_kl"
    # clip the gradient's global norm to this before each optimizer step
    grad_clip: float = 1.0
    # verl: ranks that split each packed sequence (Ulysses sequence parallel); needs model.use_remove_padding
    ulysses_sequence_parallel_size: int = 1
    optim: OptimConfig = field(default_factory=OptimConfig)
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)


@dataclass
class RefConfig:
    # verl: deprecated global micro-batch of the reference pass
    log_prob_micro_batch_size: int | None = None
    # reference pass rows per forward on one rank; the run uses rollout.log_prob_micro_batch_size_per_gpu
    log_prob_micro_batch_size_per_gpu: int | None = None
    # reference pass by token budget; the run uses rollout.log_prob_use_dynamic_bsz
    log_prob_use_dynamic_bsz: bool = False
    # reference pass token budget (a number or auto); the run uses rollout.log_prob_max_token_len_per_gpu
    log_prob_max_token_len_per_gpu: Any = 16384
    # verl interpolates it from the actor's; null here means the same (the ref shares the ranks)
    ulysses_sequence_parallel_size: int | None = None
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)


@dataclass
class ValKwargsConfig:
    # validation sampling: top-k (-1: off)
    top_k: int = -1
    # validation sampling: nucleus probability
    top_p: float = 1.0
    # validation sampling temperature
    temperature: float = 0.0
    # responses per validation prompt (metrics report mean/best/majority over them)
    n: int = 1
    # sample in validation (false: greedy)
    do_sample: bool = False


@dataclass
class MultiTurnConfig:
    # multi-turn rollout: the model may call tools between turns
    enable: bool = False
    # most model turns per dialogue (null: until the response budget ends)
    max_assistant_turns: int | None = None
    # most tool/user turns per dialogue (null: no limit)
    max_user_turns: int | None = None
    # most tool calls executed from one model turn
    max_parallel_calls: int = 1
    # tool output tokens kept per call
    max_tool_response_length: int = 256
    # which part of a long tool output is cut: left | right | middle
    tool_response_truncate_side: str = "middle"
    # tools yaml file, or the name of a config shipped in dapo/tools/configs
    tool_config_path: str | None = None
    # verl: simulated-user interactions
    interaction_config_path: str | None = None
    # tool-call format the model writes and the parser reads
    format: str = "hermes"


@dataclass
class RolloutConfig:
    # verl requires a name (vllm/sglang/hf); "hf" is our KV-cached engine for any transformers model
    name: str = "hf"
    # verl: sync | async generation
    mode: str = "sync"
    # responses sampled per prompt (the group size of GRPO and of the filter)
    n: int = 1
    # sampling temperature of training rollouts (also used for the log-probs)
    temperature: float = 1.0
    # nucleus sampling probability of training rollouts
    top_p: float = 1.0
    # top-k of training rollouts (-1: off)
    top_k: int = -1
    # sample training rollouts (false: greedy)
    do_sample: bool = True
    # prompt width in tokens; null means data.max_prompt_length (verl interpolates it)
    prompt_length: int | None = None
    # generation budget in tokens; null means data.max_response_length
    response_length: int | None = None
    # deprecated global micro-batch of the log-prob passes; use log_prob_micro_batch_size_per_gpu
    log_prob_micro_batch_size: int | None = None
    # rows per forward of the old/reference log-prob passes on one rank; null: the deprecated key / dp, else
    # the actor's micro-batch
    log_prob_micro_batch_size_per_gpu: int | None = None
    # log-prob passes by token budget; also true when the actor's use_dynamic_bsz is
    log_prob_use_dynamic_bsz: bool = False
    # token budget of one log-prob micro-batch: a number of tokens, or auto (see trainer.auto_budget)
    log_prob_max_token_len_per_gpu: Any = 16384
    # verl's default is false; we always keep the sampler's log-probs (they cost nothing here)
    calculate_log_probs: bool = True
    # vLLM engine settings (rollout.name=vllm; the own engine ignores them), verl's names.
    # gen_tp: vLLM's tensor parallel degree (verl's default is 2; one device here)
    tensor_model_parallel_size: int = 1
    # share of GPU memory vLLM may take (weights + KV cache); null: 0.5 on cuda (verl's: the actor's
    # weights stay on the device beside it), unused on cpu
    gpu_memory_utilization: float | None = None
    # vLLM's weights dtype; null: on cuda bfloat16 (float16 for an fp16 actor), as verl, because vLLM's
    # GPU attention kernels refuse float32; on cpu the actor's parameter dtype (log-probs match the trainer's)
    dtype: str | None = None
    # no CUDA graphs; null: false on cuda (verl's default: graphs make decoding fast), true on cpu (eager is
    # what vLLM's CPU build runs)
    enforce_eager: bool | None = None
    # release the KV cache between generations (vLLM sleep mode on GPUs; a no-op on CPU)
    free_cache_engine: bool = True
    # vLLM: the most sequences one engine step schedules
    max_num_seqs: int = 1024
    # vLLM: the most tokens one engine step schedules; on cuda long prompts are prefilled in chunks of it
    # beside running decodes (verl's 8192); on cpu chunked prefill is off and it is raised to prompt + response
    max_num_batched_tokens: int = 8192
    # vLLM: reuse KV blocks of shared prompt prefixes (reset after every weight sync)
    enable_prefix_caching: bool = True
    # how vLLM gets its first weights: "auto" reads the model directory; "dummy" starts from random
    # weights and takes the actor's at the first sync (verl's default on GPUs)
    load_format: str = "auto"
    # the seed of vLLM's samplers; null means trainer.seed
    seed: int | None = None
    # ours: give every sampled request its own seed drawn from rollout.seed (the same responses after a resume);
    # null: true on cpu, false on cuda (vLLM samples seeded requests one row at a time)
    per_request_seed: bool | None = None
    # ours: "colocated" runs vLLM in the trainer's process (verl's hybrid engine); "server" starts a
    # vLLM server process on 127.0.0.1 and talks HTTP to it (weights streamed over a local socket)
    placement: str = "colocated"
    # ours: the CUDA device ids the vLLM server runs on (at least tensor_model_parallel_size of them),
    # counted as the trainer's ranks count theirs (cuda:i): within the trainer's CUDA_VISIBLE_DEVICES when
    # it is set; null shares the trainer's devices
    server_devices: list[int] | None = None
    # ours: how the weights reach vLLM workers in other processes (the server's, and the in-process engine's
    # when tensor_model_parallel_size > 1; with one in-process worker the loader is handed the tensors
    # directly and this key has no effect): "socket" streams them over a local socket through host memory;
    # "collective" broadcasts them in a torch.distributed group (gloo on cpu; nccl on cuda, not yet run on a
    # GPU: GPU to GPU from an in-process actor, through host memory from FSDP ranks; only to a server on
    # server_devices, as NCCL cannot put the trainer and a worker on one GPU); null:
    # collective on cuda with server_devices none of which the trainer uses (0 .. n_gpus_per_node-1),
    # socket otherwise
    weight_transfer: str | None = None
    # the most bytes (MiB) of weights one sync round carries from the actor ranks (verl's
    # checkpoint_engine.update_weights_bucket_megabytes): the trainer holds one bucket at a time
    update_weights_bucket_megabytes: int = 64
    # ours: vLLM's KV cache size on CPU in GiB (VLLM_CPU_KVCACHE_SPACE)
    cpu_kvcache_space_gb: float = 1.0
    # ours: seconds to wait for a vLLM server to answer its health check
    server_startup_timeout_s: float = 300.0
    val_kwargs: ValKwargsConfig = field(default_factory=ValKwargsConfig)
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)


@dataclass
class ModelConfig:
    # a Hugging Face model directory; null means the built-in tiny model (built and cached on first use)
    path: str | None = None
    # tokenizer directory; null means model.path
    tokenizer_path: str | None = None
    # run packed sequences with no pad tokens (verl's default is true; off here, it pays only on GPUs)
    use_remove_padding: bool = False
    # recompute activations in the backward pass (less memory, more time)
    enable_gradient_checkpointing: bool = False
    # allow the model's own python code (only for models you trust)
    trust_remote_code: bool = False
    # attributes set on the model config after loading
    override_config: dict[str, Any] = field(default_factory=dict)
    # a jinja chat template replacing the tokenizer's
    custom_chat_template: str | None = None


@dataclass
class ActorRolloutRefConfig:
    # verl: actor and rollout share the weights (always so here)
    hybrid_engine: bool = True
    model: ModelConfig = field(default_factory=ModelConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    ref: RefConfig = field(default_factory=RefConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)


@dataclass
class OverlongBufferConfig:
    # DAPO overlong shaping: penalise responses that run into the last len tokens of the budget
    enable: bool = False
    # the buffer in tokens; responses longer than max length - len lose up to penalty_factor
    len: int = 0
    # the penalty at the full length (it grows linearly over the buffer)
    penalty_factor: float = 0.0
    # log the overlong flags and penalties as reward extras
    log: bool = False


@dataclass
class ScoringConfig:
    """ours: how reward functions are isolated (``dapo.reward.manager.ScoringConfig``).

    auto: the built-in regex scorers run in-process, everything else in worker processes
    with a per-sample wall-clock timeout; process: everything in workers; inline: nothing.
    A failed or timed-out sample scores ``failure_score`` and is counted.
    ``step_timeout_s`` bounds one scoring call's worker time (``auto``: sized from the samples it
    sends to workers, ``dapo.reward.manager.step_budget_s``; 0 or null: no bound); samples
    without a result by then count as timeouts. ``memory_limit_mb`` caps each worker's address
    space (0: no cap).
    """

    # where reward functions run: auto | process | inline (see above)
    mode: str = "auto"
    # seconds one sample may take to score before it fails
    timeout_s: float = 10.0
    # score of a sample whose reward function failed or timed out
    failure_score: float = -1.0
    # scoring worker processes (null: up to 4, by CPU count)
    num_workers: int | None = None
    # seconds one scoring call (a generation round's batch, or validation's) may spend in the
    # worker processes in all; what has no result by then is a timeout. auto: max(step_timeout_min_s,
    # step_timeout_per_sample_s x the samples it sends to workers, one per response and reward
    # function), e.g. 512 responses: max(60, 0.5 x 512) = 256 s; a number: that many seconds;
    # 0 or null: no bound
    step_timeout_s: Any = "auto"
    # step_timeout_s=auto: seconds allowed per sample scored in a worker
    step_timeout_per_sample_s: float = 0.5
    # step_timeout_s=auto: the least budget of a scoring call, in seconds
    step_timeout_min_s: float = 60.0
    # address-space cap of each scoring worker in MB (0: no cap)
    memory_limit_mb: float = 8192


@dataclass
class RewardObjectiveConfig:
    """ours: one weighted reward function of a multi-objective reward."""

    # the objective's name (metrics reward/<name>/mean)
    name: str = "score"
    # its weight in the summed reward
    weight: float = 1.0
    # a python file with the function; null means the built-in data_source router
    path: str | None = None
    # the function's name in that file
    function: str = "compute_score"
    # keyword arguments passed to the function
    reward_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class RewardModelConfig:
    # verl: a learned reward model
    enable: bool = False
    # dapo (with overlong shaping) | naive
    reward_manager: str = "dapo"
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    # verl scripts pass +reward_model.reward_kwargs.overlong_buffer_cfg.* and .max_resp_len;
    # overlong_buffer_cfg is read as an alias of reward_model.overlong_buffer
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
    # verl: the reward loop service
    use_reward_loop: bool = True
    # verl: score asynchronously
    launch_reward_fn_async: bool = False
    # ours: safe scoring and multi-objective rewards (each objective is logged as reward/<name>/mean
    # and can be named by algorithm.filter_groups.metric)
    scoring: ScoringConfig = field(default_factory=ScoringConfig)
    # several weighted reward functions summed into one reward (null: one reward function)
    objectives: list[RewardObjectiveConfig] | None = None


@dataclass
class CustomRewardFunctionConfig:
    # a python file with your reward function; null means the built-in data_source router
    path: str | None = None
    # the function's name in that file
    name: str = "compute_score"
    # keyword arguments passed to the function
    reward_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class AutoBudgetConfig:
    """ours: how ``...max_token_len_per_gpu=auto`` budgets are sized (``dapo.actor.auto_budget``)."""

    # what the process may use in GB; null: the smallest of device/machine free memory, RLIMIT_AS, cgroup
    memory_limit_gb: float | None = None
    # the share of that memory kept free
    margin: float = 0.2


@dataclass
class TrainerConfig:
    # passes over the training prompts (when total_training_steps is null)
    total_epochs: int = 30
    # training steps to run; null means len(train data) // train_batch_size x total_epochs
    total_training_steps: int | None = None
    # project name for the trackers
    project_name: str = "verl-dapo"
    # run name for the trackers
    experiment_name: str = "default"
    # where metrics go: console | jsonl | tensorboard | wandb | mlflow
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    # verl: validation samples to log
    log_val_generations: int = 0
    # dump every training step's rollouts as jsonl here (null: off)
    rollout_data_dir: str | None = None
    # dump every validation's generations as jsonl here (null: off)
    validation_data_dir: str | None = None
    # machines; data-parallel ranks = nnodes x n_gpus_per_node
    nnodes: int = 1
    # actor ranks per machine (devices, or CPU processes)
    n_gpus_per_node: int = 1
    # checkpoint every N steps and at the end (-1: never)
    save_freq: int = -1
    # validate every N steps (-1: never during training); validation still runs after the last step
    test_freq: int = -1
    # auto (the latest checkpoint in the run dir) | disable | resume_path
    resume_mode: str = "auto"
    # the checkpoint to resume from with resume_mode=resume_path
    resume_from_path: str | None = None
    # ours: resume even when the checkpoint was trained with a config that differs in a key that
    # changes training (the keys are named either way)
    resume_allow_config_change: bool = False
    # validate once before the first step
    val_before_train: bool = True
    # validate and stop (no training)
    val_only: bool = False
    # verl: critic-only steps
    critic_warmup: int = 0
    # verl's default is true; it only matters with several data-parallel ranks
    balance_batch: bool = False
    # the run directory: metrics, checkpoints, report, final model
    default_local_dir: str = "checkpoints/${trainer.project_name}/${trainer.experiment_name}"
    # keep only the newest N checkpoints (null: all)
    max_actor_ckpt_to_keep: int | None = None
    # ours: where actor ranks run when nnodes x n_gpus_per_node > 1: auto (processes on one node,
    # Ray across nodes) | inprocess | process | ray
    worker_backend: str = "auto"
    # ours: how ...max_token_len_per_gpu=auto budgets are sized
    auto_budget: AutoBudgetConfig = field(default_factory=AutoBudgetConfig)
    # verl's default is cuda; dapo runs on CPU unless told otherwise
    device: str = "cpu"
    # ours: the seed of every RNG (model init, sampler, rollout)
    seed: int = 1
    # ours: torch's CPU thread count (0: all cores)
    torch_threads: int = 0
    # torch.profiler chrome traces of these steps in <run_dir>/profile
    profile_steps: list[int] | None = None
    # ours: refresh <run_dir>/report.html every N steps and at the last step (0: off)
    report_freq: int = 0
    # ours: also measure held-out accuracy after training and save the final model (summary.json)
    save_final_model: bool = True


@dataclass
class AsyncTrainingConfig:
    # sync: generate, then update; colocate_async: generation runs on its own thread and engine
    # (in-process vLLM) and never waits for the update, weights reach it between two engine steps;
    # separate_async: the same with vLLM as a server process (rollout.placement=server, on devices
    # of its own with rollout.server_devices), its samples streamed back and kept across syncs
    mode: str = "sync"
    # a group is trained at most this many policy updates after its oldest token was generated
    max_off_policy_threshold: int = 2
    # beyond the bound: "drop" (generation never pauses; groups that can no longer make it are
    # thrown away) or "wait" (decoding pauses once the pool holds the batches the bound allows)
    max_off_policy_strategy: str = "drop"
    # at a weight sync, requests in flight go on under the new weights from their tokens so far
    # (false: they start again from the prompt)
    partial_rollout: bool = True


@dataclass
class DapoConfig:
    data: DataConfig = field(default_factory=DataConfig)
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    custom_reward_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    async_training: AsyncTrainingConfig = field(default_factory=AsyncTrainingConfig)
