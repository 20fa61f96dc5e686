"""Every rule of the configuration that the configuration alone decides. Each problem names the
key and how to fix it.

Rules that need a component's knowledge (the names a registry holds, a tool file that must load,
a model's attention heads) belong to that component and reach ``dapo.config.pipeline.build_config``
as its ``rules`` (``dapo.run_config``), so this package imports none of them.
"""

from __future__ import annotations

from typing import Any

from dapo.config import sampling as sampling_cfg
from dapo.config.resolve import data_parallel_size, max_resp_len, per_rank, shares_trainer_gpu

KNOWN_LOGGERS = ("console", "jsonl", "tensorboard", "wandb", "mlflow")
TRUNCATION = ("left", "right", "middle", "error")
RESUME_MODES = ("auto", "disable", "resume_path")
LR_SCHEDULERS = ("constant", "cosine")
# metrics every reward manager provides, plus what math_dapo and the overlong log add
KNOWN_FILTER_METRICS = (*sampling_cfg.BUILTIN_METRICS, "pred", "overlong", "overlong_reward", "reward")


def validate(cfg: Any) -> list[str]:
    """All problems with a loaded config (empty when it is usable)."""
    p: list[str] = []
    objectives = [o.name for o in (cfg.reward_model.objectives or [])]
    data, arr, alg, tr = cfg.data, cfg.actor_rollout_ref, cfg.algorithm, cfg.trainer
    actor, rollout = arr.actor, arr.rollout

    def need(cond: bool, msg: str) -> None:
        if not cond:
            p.append(msg)

    # batch sizes (prompts; a mini-batch of prompts is x rollout.n trajectories)
    tbs, n = data.train_batch_size, rollout.n
    need(tbs >= 1, f"data.train_batch_size: must be >= 1 prompts, got {tbs}")
    need(n >= 1, f"actor_rollout_ref.rollout.n: must be >= 1 responses per prompt, got {n}")
    gbs = data.gen_batch_size
    if gbs is not None:
        need(
            gbs >= tbs,
            f"data.gen_batch_size={gbs} is smaller than data.train_batch_size={tbs}: a generation round must "
            f"cover at least one training batch; set data.gen_batch_size>={tbs} (or null for {tbs})",
        )
    mini = actor.ppo_mini_batch_size
    need(mini >= 1, f"actor_rollout_ref.actor.ppo_mini_batch_size: must be >= 1 prompts, got {mini}")
    if mini >= 1 and tbs >= 1:
        need(
            tbs >= mini,
            f"actor_rollout_ref.actor.ppo_mini_batch_size={mini} exceeds data.train_batch_size={tbs}; "
            "lower it to at most the train batch",
        )
        # one cause, one message: a mini-batch larger than the batch is not also "not divisible"
        need(
            tbs < mini or tbs % mini == 0,
            f"data.train_batch_size={tbs} is not divisible by actor_rollout_ref.actor.ppo_mini_batch_size={mini}; "
            "pick a mini-batch size that divides the train batch",
        )
    if not actor.use_dynamic_bsz:
        micro, micro_g = actor.ppo_micro_batch_size_per_gpu, actor.ppo_micro_batch_size
        if micro is None and micro_g is None:
            p.append(
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu: must be set (trajectories per micro-batch) "
                "unless actor_rollout_ref.actor.use_dynamic_bsz=true"
            )
        elif micro is not None and micro_g is not None:
            p.append(
                "actor_rollout_ref.actor.ppo_micro_batch_size and ppo_micro_batch_size_per_gpu are both set; "
                "set only ppo_micro_batch_size_per_gpu (the other is deprecated)"
            )
        else:
            if micro is not None:
                m = micro
            else:  # the deprecated global key, per rank as the run will use it
                m = per_rank(micro_g, cfg) if micro_g >= 1 else micro_g
            rank_mini = mini * n // max(1, data_parallel_size(cfg))
            need(m >= 1, f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu: must be >= 1, got {m}")
            if m >= 1 and mini >= 1:
                need(
                    rank_mini % m == 0,
                    f"the mini-batch of {rank_mini} trajectories (ppo_mini_batch_size={mini} x rollout.n={n}) is not "
                    f"divisible by actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={m}",
                )
    need(
        _budget_ok(actor.ppo_max_token_len_per_gpu),
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu: must be >= 1 tokens or auto, got "
        f"{actor.ppo_max_token_len_per_gpu!r}",
    )
    p.extend(_auto_budget_problems(cfg))
    need(actor.ppo_epochs >= 1, f"actor_rollout_ref.actor.ppo_epochs: must be >= 1, got {actor.ppo_epochs}")

    # lengths
    need(data.max_prompt_length >= 1, "data.max_prompt_length: must be >= 1 tokens")
    need(data.max_response_length >= 1, "data.max_response_length: must be >= 1 tokens")
    need(
        data.truncation in TRUNCATION,
        f"data.truncation: must be one of {', '.join(TRUNCATION)}, got {data.truncation!r}",
    )

    # algorithm (the estimator, loss and KL names are dapo.algo's rules)
    need(
        actor.clip_ratio_c > 1.0,
        f"actor_rollout_ref.actor.clip_ratio_c: must be > 1 (dual clip), got {actor.clip_ratio_c}",
    )
    for key in ("clip_ratio", "clip_ratio_low", "clip_ratio_high"):
        v = getattr(actor, key)
        need(v is None or v >= 0, f"actor_rollout_ref.actor.{key}: must be >= 0, got {v}")
    need(
        alg.kl_ctrl.type in ("fixed", "adaptive"),
        f"algorithm.kl_ctrl.type: must be fixed or adaptive, got {alg.kl_ctrl.type!r}",
    )
    need(actor.grad_clip > 0, f"actor_rollout_ref.actor.grad_clip: must be > 0, got {actor.grad_clip}")
    need(actor.optim.lr >= 0, f"actor_rollout_ref.actor.optim.lr: must be >= 0, got {actor.optim.lr}")
    need(
        actor.optim.lr_scheduler_type in LR_SCHEDULERS,
        f"actor_rollout_ref.actor.optim.lr_scheduler_type: must be one of {', '.join(LR_SCHEDULERS)}, got {actor.optim.lr_scheduler_type!r}",
    )

    # dynamic sampling
    fg = alg.filter_groups
    p.extend(sampling_cfg.validate(fg))
    known_metrics = (*KNOWN_FILTER_METRICS, *objectives)
    if fg.prefetch is True:
        need(
            not alg.use_kl_in_reward,
            "algorithm.filter_groups.prefetch: the in-reward KL needs the actor during generation; "
            "set prefetch=false or algorithm.use_kl_in_reward=false",
        )
        need(
            int(cfg.trainer.nnodes) * int(cfg.trainer.n_gpus_per_node) == 1,
            "algorithm.filter_groups.prefetch: one actor rank only (trainer.nnodes x "
            "trainer.n_gpus_per_node must be 1); set prefetch=false",
        )
    if fg.enable and fg.metric and fg.metric not in known_metrics and not cfg.custom_reward_function.path:
        p.append(
            f"algorithm.filter_groups.metric: unknown metric {fg.metric!r}; known: {', '.join(known_metrics)} "
            "(a custom reward function may add its own keys)"
        )

    if fg.enable and not rollout.do_sample and int(rollout.n) > 1 and not cfg.custom_reward_function.path:
        # greedy decoding gives every sample of a group the same response, hence the same
        # built-in reward: every group would be filtered, a step would never fill
        p.append(
            "algorithm.filter_groups.enable: every group is filtered when actor_rollout_ref.rollout.do_sample"
            f"=false (its n={rollout.n} samples are one greedy response); set do_sample=true or "
            "filter_groups.enable=false"
        )

    # sampling parameters
    if rollout.do_sample:
        need(
            rollout.temperature > 0, "actor_rollout_ref.rollout.temperature: must be > 0 when do_sample=true"
        )
    need(0 < rollout.top_p <= 1, f"actor_rollout_ref.rollout.top_p: must be in (0, 1], got {rollout.top_p}")
    vk = rollout.val_kwargs
    if vk.do_sample:
        need(
            vk.temperature > 0,
            "actor_rollout_ref.rollout.val_kwargs.temperature: must be > 0 when val_kwargs.do_sample=true",
        )
    need(vk.n >= 1, f"actor_rollout_ref.rollout.val_kwargs.n: must be >= 1, got {vk.n}")
    need(
        rollout.update_weights_bucket_megabytes >= 1,
        "actor_rollout_ref.rollout.update_weights_bucket_megabytes: must be >= 1 MiB, "
        f"got {rollout.update_weights_bucket_megabytes}",
    )
    need(
        rollout.name in ("hf", "vllm"),
        f"actor_rollout_ref.rollout.name: {rollout.name!r} is not available here; use hf or vllm",
    )
    if rollout.name == "vllm":
        p.extend(_vllm_problems(rollout, cfg))
    p.extend(_stream_problems(cfg))
    p.extend(_async_problems(cfg))
    p.extend(multi_turn_problems(rollout.multi_turn))

    rc = alg.rollout_correction
    need(
        not (rc.bypass_mode and (rc.rollout_is or rc.rollout_rs)),
        "algorithm.rollout_correction.bypass_mode=true makes the sampler's log-probs the old ones, so "
        "rollout_is / rollout_rs against them would be identically 1; set them to null with bypass_mode",
    )

    # reward shaping
    p.extend(overlong_problems(cfg.reward_model.overlong_buffer, *max_resp_len(cfg)))
    p.extend(scoring_problems(cfg.reward_model.scoring))
    if objectives and cfg.custom_reward_function.path:
        p.append(
            "reward_model.objectives and custom_reward_function.path are both set; list the custom function as an objective"
        )

    # trainer
    for name in tr.logger:
        need(
            name in KNOWN_LOGGERS,
            f"trainer.logger: unknown logger {name!r}; known: {', '.join(KNOWN_LOGGERS)}",
        )
    need(
        tr.resume_mode in RESUME_MODES,
        f"trainer.resume_mode: must be one of {', '.join(RESUME_MODES)}, got {tr.resume_mode!r}",
    )
    need(tr.total_epochs >= 1, f"trainer.total_epochs: must be >= 1, got {tr.total_epochs}")
    if tr.total_training_steps is not None:
        need(
            tr.total_training_steps >= 1,
            f"trainer.total_training_steps: must be >= 1 or null, got {tr.total_training_steps}",
        )
    need(tr.device in ("cpu", "cuda"), f"trainer.device: must be cpu or cuda, got {tr.device!r}")
    need(
        tr.worker_backend in ("auto", "inprocess", "process", "ray"),
        f"trainer.worker_backend: must be auto, inprocess, process or ray, got {tr.worker_backend!r}",
    )
    if tr.worker_backend == "process" and tr.nnodes > 1:
        p.append("trainer.worker_backend=process runs on one node; use ray (or auto) with trainer.nnodes > 1")
    p.extend(_sequence_parallel_problems(cfg))
    return p


def scoring_problems(sc: Any) -> list[str]:
    """``reward_model.scoring``'s rules; also the reward manager's when it is built directly."""
    key = "reward_model.scoring"
    out = []
    if sc.mode not in ("auto", "process", "inline"):
        out.append(f"{key}.mode: must be auto, process or inline, got {sc.mode!r}")
    if not sc.timeout_s > 0:
        out.append(f"{key}.timeout_s: must be > 0 seconds, got {sc.timeout_s}")
    budget = sc.step_timeout_s
    seconds = isinstance(budget, int | float) and not isinstance(budget, bool) and budget >= 0
    if not (budget == "auto" or budget is None or seconds):
        out.append(f"{key}.step_timeout_s: must be auto, seconds >= 0, or 0/null (no budget), got {budget!r}")
    if not sc.step_timeout_per_sample_s > 0:
        out.append(f"{key}.step_timeout_per_sample_s: must be > 0, got {sc.step_timeout_per_sample_s}")
    if not sc.step_timeout_min_s >= 0:
        out.append(f"{key}.step_timeout_min_s: must be >= 0 seconds, got {sc.step_timeout_min_s}")
    if not sc.memory_limit_mb >= 0:
        out.append(f"{key}.memory_limit_mb: must be >= 0 (0: no limit), got {sc.memory_limit_mb}")
    return out


TRUNCATE_SIDES = ("left", "right", "middle")


def multi_turn_problems(mt: Any) -> list[str]:
    """``actor_rollout_ref.rollout.multi_turn``'s own rules (the tool-call ``format`` is the tool
    parser's rule); also the multi-turn loop's when it is built directly."""
    key = "actor_rollout_ref.rollout.multi_turn"
    out = []
    if mt.tool_response_truncate_side not in TRUNCATE_SIDES:
        out.append(
            f"{key}.tool_response_truncate_side: must be one of {', '.join(TRUNCATE_SIDES)}, "
            f"got {mt.tool_response_truncate_side!r}"
        )
    if mt.max_parallel_calls < 1:
        out.append(f"{key}.max_parallel_calls: must be >= 1, got {mt.max_parallel_calls}")
    if mt.max_tool_response_length < 1:
        out.append(f"{key}.max_tool_response_length: must be >= 1, got {mt.max_tool_response_length}")
    for name in ("max_assistant_turns", "max_user_turns"):
        v = getattr(mt, name)
        if v is not None and v < 1:
            out.append(f"{key}.{name}: must be >= 1 or null, got {v}")
    return out


def overlong_problems(ob: Any, max_len: int, max_key: str) -> list[str]:
    """``reward_model.overlong_buffer`` against the response length it measures (``max_len``,
    read from ``max_key``): verl's rules, also the reward manager's when it is built directly."""
    if not ob.enable:
        return []
    if ob.len <= 0:
        return ["reward_model.overlong_buffer.len: must be > 0 when the overlong buffer is enabled"]
    if ob.len >= max_len:
        return [
            f"reward_model.overlong_buffer.len={ob.len} is not shorter than {max_key}={max_len}: responses "
            f"longer than {max_key} - len = {max_len - ob.len} tokens are penalised, so every response would be; "
            f"set reward_model.overlong_buffer.len below {max_len} (the DAPO recipe uses a fifth of it) or "
            "reward_model.overlong_buffer.enable=false"
        ]
    return []


def config_warnings(cfg: Any, resolved: Any) -> list[str]:
    """Settings that run but may not do what a newcomer expects, each naming the key: ``cfg`` as
    loaded (it tells a key the user set from a derived one), ``resolved`` what the run uses. The
    notes on accepted-but-unimplemented verl keys are ``dapo.config.compat``'s."""
    out: list[str] = []
    data, fg = cfg.data, cfg.algorithm.filter_groups
    gbs = data.gen_batch_size
    if not fg.enable and gbs is not None and gbs != data.train_batch_size:
        out.append(
            f"algorithm.filter_groups.enable=false: each step trains on all data.gen_batch_size={gbs} prompts "
            f"generated, not data.train_batch_size={data.train_batch_size} (verl's behaviour); set "
            "data.gen_batch_size=null to train on data.train_batch_size prompts"
        )
    o = resolved.actor_rollout_ref.actor.optim
    if o.lr_warmup_steps > 0:
        out.append(
            f"actor_rollout_ref.actor.optim.lr_warmup_steps={o.lr_warmup_steps}: the learning rate rises "
            f"linearly from 0, so step 1's policy update runs at lr 0 (the weights do not move) and step k uses lr x (k-1)/{o.lr_warmup_steps} "
            "(verl's warmup); set lr_warmup_steps=0 to start at the full rate"
        )
    r = cfg.actor_rollout_ref.rollout
    if (
        r.name == "vllm"
        and r.weight_transfer is not None
        and r.placement == "colocated"
        and r.tensor_model_parallel_size == 1
    ):
        out.append(
            f"actor_rollout_ref.rollout.weight_transfer={r.weight_transfer}: no effect here (one in-process "
            "vLLM worker is handed the tensors directly); it chooses the transport for placement=server or "
            "tensor_model_parallel_size > 1"
        )
    out.extend(sampling_cfg.skip_rule_warnings(fg))
    out.extend(
        sampling_cfg.metric_warnings(
            fg,
            overlong_buffer_enable=bool(cfg.reward_model.overlong_buffer.enable),
            use_kl_in_reward=bool(cfg.algorithm.use_kl_in_reward),
        )
    )
    return out


VLLM_DTYPES = ("auto", "float32", "bfloat16", "float16")
WEIGHT_TRANSFERS = ("socket", "collective")  # the transports dapo.rollout.vllm_weight_transfer builds


def _vllm_problems(rollout: Any, cfg: Any) -> list[str]:
    """The vLLM backend's keys (the model's head size is checked when the engine is built)."""
    p = []
    key = "actor_rollout_ref.rollout"
    if rollout.placement not in ("colocated", "server"):
        p.append(f"{key}.placement: must be colocated or server, got {rollout.placement!r}")
    tp = rollout.tensor_model_parallel_size
    if tp != 1 and cfg.trainer.device != "cuda":
        p.append(f"{key}.tensor_model_parallel_size: must be 1 on CPU, got {tp}")
    if rollout.dtype is not None and rollout.dtype not in VLLM_DTYPES:
        p.append(f"{key}.dtype: must be null or one of {', '.join(VLLM_DTYPES)}, got {rollout.dtype!r}")
    if rollout.load_format not in ("auto", "dummy"):
        p.append(f"{key}.load_format: must be auto or dummy, got {rollout.load_format!r}")
    if rollout.max_num_seqs < 1 or rollout.max_num_batched_tokens < 1:
        p.append(f"{key}.max_num_seqs and max_num_batched_tokens: must be >= 1")
    if rollout.cpu_kvcache_space_gb <= 0:
        p.append(f"{key}.cpu_kvcache_space_gb: must be > 0 GiB, got {rollout.cpu_kvcache_space_gb}")
    devices = rollout.server_devices
    if devices is not None:
        if rollout.placement != "server" or cfg.trainer.device != "cuda":
            p.append(f"{key}.server_devices: needs placement=server and trainer.device=cuda; set it to null")
        elif len(set(devices)) < tp or any(int(d) < 0 for d in devices):
            p.append(
                f"{key}.server_devices: needs at least tensor_model_parallel_size={tp} distinct device ids "
                f">= 0, got {list(devices)}"
            )
    transfer, gpus = rollout.weight_transfer, int(cfg.trainer.n_gpus_per_node)
    if transfer is not None and transfer not in WEIGHT_TRANSFERS:
        p.append(f"{key}.weight_transfer: must be null, socket or collective, got {transfer!r}")
    elif transfer == "collective" and cfg.trainer.device == "cuda" and devices is None:
        p.append(
            f"{key}.weight_transfer=collective: on trainer.device=cuda it needs rollout.server_devices (NCCL "
            "cannot put the trainer and a vLLM worker on one GPU); set weight_transfer=socket or null"
        )
    elif transfer == "collective" and cfg.trainer.device == "cuda" and shares_trainer_gpu(rollout, gpus):
        p.append(
            f"{key}.weight_transfer=collective: server_devices {list(devices)} include a device of the "
            f"trainer's (0 to trainer.n_gpus_per_node-1={gpus - 1}; NCCL cannot put the trainer and a vLLM "
            "worker on one GPU); set weight_transfer=socket or null, or give the server other devices"
        )
    if cfg.algorithm.filter_groups.prefetch and rollout.placement != "colocated":
        p.append(
            f"{key}.name=vllm: algorithm.filter_groups.prefetch needs placement=colocated (the "
            "in-process engine); set placement=colocated or prefetch=false"
        )
    return p


ASYNC_MODES = ("sync", "colocate_async", "separate_async")


def _async_problems(cfg: Any) -> list[str]:
    """``async_training``: what the async loop supports (vLLM in process for colocate_async, as a
    server for separate_async; one actor rank; nothing that needs the actor while generating)."""
    at, key = cfg.async_training, "async_training"
    if at.mode not in ASYNC_MODES:
        return [f"{key}.mode: must be one of {', '.join(ASYNC_MODES)}, got {at.mode!r}"]
    p = []
    k = at.max_off_policy_threshold
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        p.append(f"{key}.max_off_policy_threshold: must be an integer >= 0 (policy updates), got {k!r}")
    if at.max_off_policy_strategy not in ("drop", "wait"):
        p.append(f"{key}.max_off_policy_strategy: must be drop or wait, got {at.max_off_policy_strategy!r}")
    if at.mode == "sync":
        return p
    r, alg, fg = cfg.actor_rollout_ref.rollout, cfg.algorithm, cfg.algorithm.filter_groups
    # colocate_async steps the in-process engine; separate_async streams from the server process
    want, other = (
        ("server", "colocate_async") if at.mode == "separate_async" else ("colocated", "separate_async")
    )
    if r.name == "vllm" and r.placement in ("colocated", "server") and r.placement != want:
        p.append(
            f"{key}.mode={at.mode} needs actor_rollout_ref.rollout.placement={want}, got "
            f"{r.placement!r}; set placement={want}, or use {key}.mode={other}"
        )
    why = [
        (r.name != "vllm", f"actor_rollout_ref.rollout.name=vllm with placement={want}"),
        (r.multi_turn.enable, "actor_rollout_ref.rollout.multi_turn.enable=false"),
        (
            alg.use_kl_in_reward,
            "algorithm.use_kl_in_reward=false (the in-reward KL needs the actor while generating)",
        ),
        (
            alg.adv_estimator == "remax",
            "an advantage estimator other than remax (its greedy baseline is a second rollout)",
        ),
        (fg.prefetch, "algorithm.filter_groups.prefetch=false (async replaces it)"),
        (
            fg.enable and fg.strategy == "verl",
            "algorithm.filter_groups.strategy default or stream (the verl recipe is sequential)",
        ),
        (
            int(cfg.trainer.nnodes) * int(cfg.trainer.n_gpus_per_node) != 1,
            "one actor rank (trainer.nnodes x trainer.n_gpus_per_node = 1)",
        ),
        (
            fg.enable and not fg.carry_over,
            "algorithm.filter_groups.carry_over=true (the pool holds the next batches' groups, which "
            "carry_over=false would throw away every step)",
        ),
    ]
    p.extend(f"{key}.mode={at.mode} needs {fix}" for bad, fix in why if bad)
    return p


def _stream_problems(cfg: Any) -> list[str]:
    """strategy=stream talks to vLLM's engine request by request: the in-process engine only."""
    fg, rollout = cfg.algorithm.filter_groups, cfg.actor_rollout_ref.rollout
    if not (fg.enable and fg.strategy == "stream"):
        return []
    key = "algorithm.filter_groups.strategy=stream"
    if rollout.name != "vllm":
        return [
            f"{key}: needs actor_rollout_ref.rollout.name=vllm, got {rollout.name!r}; or use strategy=default"
        ]
    if rollout.placement != "colocated":
        return [
            f"{key}: needs actor_rollout_ref.rollout.placement=colocated (the vLLM server placement "
            f"cannot abort requests yet), got {rollout.placement!r}; or use strategy=default"
        ]
    if rollout.multi_turn.enable:
        return [f"{key}: single-turn rollouts only; set actor_rollout_ref.rollout.multi_turn.enable=false"]
    if cfg.algorithm.adv_estimator == "remax":
        # ReMax's greedy baseline is a batched generate on the same engine, mid-stream
        return [f"{key}: not with algorithm.adv_estimator=remax (its greedy baseline); use strategy=default"]
    return []


def _budget_ok(value: Any) -> bool:
    if str(value) == "auto":
        return True
    try:
        return int(value) >= 1 and not isinstance(value, bool)
    except (TypeError, ValueError):
        return False


def _auto_budget_problems(cfg: Any) -> list[str]:
    arr, ab = cfg.actor_rollout_ref, cfg.trainer.auto_budget
    out = []
    dyn = bool(arr.actor.use_dynamic_bsz)
    if str(arr.actor.ppo_max_token_len_per_gpu) == "auto" and not dyn:
        out.append(
            "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=auto sizes token-budget micro-batches: "
            "set actor_rollout_ref.actor.use_dynamic_bsz=true"
        )
    for sec in ("rollout", "ref"):
        v = arr[sec].log_prob_max_token_len_per_gpu
        key = f"actor_rollout_ref.{sec}.log_prob_max_token_len_per_gpu"
        if not _budget_ok(v):
            out.append(f"{key}: must be >= 1 tokens or auto, got {v!r}")
        elif str(v) == "auto" and not (dyn or arr[sec].log_prob_use_dynamic_bsz):
            out.append(
                f"{key}=auto sizes token-budget micro-batches: set actor_rollout_ref.{sec}.log_prob_use_dynamic_bsz=true"
            )
    if not 0 <= float(ab.margin) < 1:
        out.append(f"trainer.auto_budget.margin: must be in [0, 1), got {ab.margin}")
    if ab.memory_limit_gb is not None and float(ab.memory_limit_gb) <= 0:
        out.append(f"trainer.auto_budget.memory_limit_gb: must be > 0 GB or null, got {ab.memory_limit_gb}")
    return out


def _sequence_parallel_problems(cfg: Any) -> list[str]:
    """verl's Ulysses rules, checked before any process starts (whether the model's attention
    heads split is the rule of ``dapo.distributed.ulysses``)."""
    key = "actor_rollout_ref.actor.ulysses_sequence_parallel_size"
    arr = cfg.actor_rollout_ref
    sp = int(arr.actor.ulysses_sequence_parallel_size or 1)
    ref_sp = getattr(arr.ref, "ulysses_sequence_parallel_size", None)
    out = []
    if ref_sp is not None and int(ref_sp) != sp:
        out.append(
            f"actor_rollout_ref.ref.ulysses_sequence_parallel_size={ref_sp}: the reference runs on the actor's "
            f"ranks and must use the actor's SP size ({key}={sp}); remove it or set it to {sp}"
        )
    if sp < 1:
        return [*out, f"{key}: must be >= 1, got {sp}"]
    if sp == 1:
        return out
    world = int(cfg.trainer.nnodes) * int(cfg.trainer.n_gpus_per_node)
    if world % sp:
        out.append(
            f"{key}={sp} must divide the {world} ranks (trainer.nnodes x trainer.n_gpus_per_node); "
            "each group of that many ranks shares its rows"
        )
    if not arr.model.use_remove_padding:
        out.append(
            f"{key}={sp} splits the packed sequence: set actor_rollout_ref.model.use_remove_padding=true"
        )
    return out
