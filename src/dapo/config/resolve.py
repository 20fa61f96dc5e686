"""Every "null means X" rule of the configuration, applied in one place.

``resolve(cfg)`` returns a copy in which each key the run derives from another key holds the
value the run will use, so ``dapo validate`` prints it and the code reads it without
fallbacks. ``dapo.config.pipeline.build_config`` calls it once per run; after the data loads,
``finalize_steps`` fixes the step count with the same rules. The rules (verl's, unless marked ours):

* ``data.gen_batch_size``: null -> ``data.train_batch_size`` (the DAPO recipe)
* ``data.val_batch_size``: null -> 256 prompts per validation generation (ours)
* ``data.seed``: null -> ``trainer.seed`` (ours: one seed for everything)
* ``rollout.prompt_length`` / ``rollout.response_length``: null -> ``data.max_prompt_length`` /
  ``data.max_response_length`` (verl interpolates them)
* ``model.tokenizer_path``: null -> ``model.path`` (when a model path is given)
* ``rollout.seed``: null -> ``trainer.seed``
* the vLLM engine keys with a per-device default (``rollout_engine_defaults``; ours on CPU, verl's
  on CUDA): ``rollout.gpu_memory_utilization`` null -> 0.5 on cuda; ``rollout.dtype`` null ->
  bfloat16 on cuda (float16 for an fp16 actor); ``rollout.enforce_eager`` null -> false on cuda,
  true on cpu; ``rollout.per_request_seed`` null -> false on cuda, true on cpu
* ``actor.clip_ratio_low`` / ``clip_ratio_high``: null -> ``actor.clip_ratio``
* ``actor.ppo_micro_batch_size_per_gpu``: null -> the deprecated global ``ppo_micro_batch_size``
  divided by the data-parallel size (``trainer.nnodes x trainer.n_gpus_per_node`` over the
  Ulysses SP size: the ranks of an SP group share their rows), else
  one micro-batch per mini-batch (``ppo_mini_batch_size x rollout.n``; only reachable with
  ``use_dynamic_bsz``, where it sizes nothing but the log-prob fallback below)
* ``rollout.log_prob_micro_batch_size_per_gpu``: null -> ``rollout.log_prob_micro_batch_size``
  divided by the data-parallel size, else the actor's per-rank micro-batch size
* ``rollout.log_prob_use_dynamic_bsz``: also true when ``actor.use_dynamic_bsz`` is (verl
  interpolates it from the actor)
* ``ref.log_prob_*``: the reference pass uses the rollout's log-prob settings
* ``reward_model.scoring.num_workers``: null -> one per core, at most 4 (ours)
* ``reward_model.reward_kwargs.max_resp_len``: absent -> ``data.max_response_length`` (the
  length the overlong penalty measures against)
* ``trainer.total_training_steps``: null -> ``len(train data) // data.train_batch_size x
  trainer.total_epochs`` (at least one step per epoch), once the size of the data is known
  (``count_train_rows`` before loading, when the parquet footers tell it; ``finalize_steps``
  after)
* ``optim.lr_warmup_steps``: -1 -> ``int(optim.lr_warmup_steps_ratio x total steps)``;
  ``optim.total_training_steps``: -1 -> ``trainer.total_training_steps``

Nulls that mean "none" (no checkpoint limit, no dump directory, the built-in task or model,
which are written on first use) stay null, and so do two vLLM keys on CPU, where the value is
vLLM's or the loaded model's: ``rollout.gpu_memory_utilization`` (unused) and ``rollout.dtype``
(the actor's parameter dtype).
"""

from __future__ import annotations

import copy
import dataclasses
import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

VAL_BATCH_SIZE = 256


# vLLM's weights dtype on CUDA for the actor's model_dtype: its GPU attention kernels refuse float32
CUDA_ROLLOUT_DTYPE = {"fp32": "bfloat16", "bf16": "bfloat16", "fp16": "float16"}


# the keys rollout_engine_defaults fills: `dapo validate --explain` names the device they were resolved for
DEVICE_DEFAULT_KEYS = tuple(
    f"actor_rollout_ref.rollout.{k}"
    for k in ("gpu_memory_utilization", "dtype", "enforce_eager", "per_request_seed")
)


def rollout_engine_defaults(rollout: Any, device: str, model_dtype: str) -> None:
    """Fill ``rollout``'s null vLLM keys that have a per-device default, in place."""
    cuda = device == "cuda"
    if cuda and rollout.gpu_memory_utilization is None:
        rollout.gpu_memory_utilization = 0.5
    if cuda and rollout.dtype is None:
        rollout.dtype = CUDA_ROLLOUT_DTYPE.get(model_dtype, "bfloat16")
    if rollout.enforce_eager is None:
        rollout.enforce_eager = not cuda
    if rollout.per_request_seed is None:
        rollout.per_request_seed = not cuda


def resolve(cfg: Any, num_train_rows: int | None = None) -> Any:
    """A copy of ``cfg`` with every derived key filled in; idempotent.

    ``num_train_rows`` (the training prompts) fixes ``trainer.total_training_steps`` when it is
    null; without it the step count stays null until the data is read (``finalize_steps``)."""
    cfg = copy.deepcopy(cfg)
    readonly = isinstance(cfg, DictConfig) and OmegaConf.is_readonly(cfg)
    if readonly:
        OmegaConf.set_readonly(cfg, False)
    d, arr, tr = cfg.data, cfg.actor_rollout_ref, cfg.trainer
    a, r, m = arr.actor, arr.rollout, arr.model

    if d.gen_batch_size is None:
        d.gen_batch_size = d.train_batch_size
    if d.val_batch_size is None:
        d.val_batch_size = VAL_BATCH_SIZE
    if d.seed is None:
        d.seed = tr.seed
    if r.prompt_length is None:
        r.prompt_length = d.max_prompt_length
    if r.response_length is None:
        r.response_length = d.max_response_length
    if m.tokenizer_path is None and m.path is not None:
        m.tokenizer_path = m.path
    if r.seed is None:
        r.seed = tr.seed
    rollout_engine_defaults(r, str(tr.device), str(a.fsdp_config.model_dtype))

    if a.clip_ratio_low is None:
        a.clip_ratio_low = a.clip_ratio
    if a.clip_ratio_high is None:
        a.clip_ratio_high = a.clip_ratio
    if a.ppo_micro_batch_size_per_gpu is None:
        a.ppo_micro_batch_size_per_gpu = (
            per_rank(a.ppo_micro_batch_size, cfg) if a.ppo_micro_batch_size else a.ppo_mini_batch_size * r.n
        )
    a.ppo_micro_batch_size = None
    if r.log_prob_micro_batch_size_per_gpu is None:
        r.log_prob_micro_batch_size_per_gpu = (
            per_rank(r.log_prob_micro_batch_size, cfg)
            if r.log_prob_micro_batch_size
            else a.ppo_micro_batch_size_per_gpu
        )
    r.log_prob_micro_batch_size = None
    r.log_prob_use_dynamic_bsz = bool(r.log_prob_use_dynamic_bsz or a.use_dynamic_bsz)
    ref = arr.ref
    ref.log_prob_micro_batch_size = None
    ref.log_prob_micro_batch_size_per_gpu = r.log_prob_micro_batch_size_per_gpu
    ref.log_prob_use_dynamic_bsz = r.log_prob_use_dynamic_bsz
    ref.log_prob_max_token_len_per_gpu = r.log_prob_max_token_len_per_gpu

    rm = cfg.reward_model
    if rm.scoring.num_workers is None:
        rm.scoring.num_workers = default_scoring_workers()
    if rm.reward_kwargs.get("max_resp_len") is None:
        rm.reward_kwargs["max_resp_len"] = max_resp_len(cfg)[0]
    if tr.total_training_steps is None and num_train_rows is not None:
        tr.total_training_steps = steps_from_rows(num_train_rows, d.train_batch_size, tr.total_epochs)
    o = a.optim
    if tr.total_training_steps is not None:
        o.lr_warmup_steps = warmup_steps(o, tr.total_training_steps)
        if o.total_training_steps < 0:
            o.total_training_steps = tr.total_training_steps
    if readonly:
        OmegaConf.set_readonly(cfg, True)
    return cfg


def finalize_steps(cfg: Any, num_train_rows: int) -> Any:
    """The typed run config (``DapoConfig``) with the derivations that need the size of the
    training data done: ``trainer.total_training_steps``, ``optim.lr_warmup_steps`` and
    ``optim.total_training_steps`` (the rules of ``resolve``). A new config; ``cfg`` is not
    changed, and a config whose step count is set comes back equal."""
    tr, o = cfg.trainer, cfg.actor_rollout_ref.actor.optim
    total = tr.total_training_steps
    if total is None:
        total = steps_from_rows(num_train_rows, cfg.data.train_batch_size, tr.total_epochs)
    optim = dataclasses.replace(
        o,
        lr_warmup_steps=warmup_steps(o, total),
        total_training_steps=o.total_training_steps if o.total_training_steps >= 0 else total,
    )
    actor = dataclasses.replace(cfg.actor_rollout_ref.actor, optim=optim)
    return dataclasses.replace(
        cfg,
        trainer=dataclasses.replace(tr, total_training_steps=total),
        actor_rollout_ref=dataclasses.replace(cfg.actor_rollout_ref, actor=actor),
    )


def steps_from_rows(num_train_rows: int, train_batch_size: int, total_epochs: int) -> int:
    """``trainer.total_training_steps`` when null: whole batches per epoch (at least one) x epochs."""
    return max(1, int(num_train_rows) // int(train_batch_size)) * int(total_epochs)


def warmup_steps(optim: Any, total_training_steps: int) -> int:
    """``optim.lr_warmup_steps``, or ``lr_warmup_steps_ratio`` x the total steps when it is -1."""
    if optim.lr_warmup_steps >= 0:
        return int(optim.lr_warmup_steps)
    return int(optim.lr_warmup_steps_ratio * total_training_steps)


def max_resp_len(cfg: Any) -> tuple[int, str]:
    """The response length the overlong penalty measures against, and the key it comes from."""
    given = (cfg.reward_model.reward_kwargs or {}).get("max_resp_len")
    if given is not None:
        return int(given), "reward_model.reward_kwargs.max_resp_len"
    return int(cfg.data.max_response_length), "data.max_response_length"


def per_rank(global_micro_batch_size: int, cfg: Any) -> int:
    """A deprecated global micro-batch size (all ranks) as verl's per-rank one."""
    return max(1, int(global_micro_batch_size) // data_parallel_size(cfg))


def data_parallel_size(cfg: Any) -> int:
    """Data-parallel groups: all ranks over the Ulysses SP size (the ranks of an SP group share
    their rows); all ranks when the SP size does not divide them (validation names that)."""
    world = int(cfg.trainer.nnodes) * int(cfg.trainer.n_gpus_per_node)
    sp = int(cfg.actor_rollout_ref.actor.ulysses_sequence_parallel_size or 1)
    return world // sp if sp >= 1 and world % sp == 0 else world


def default_scoring_workers() -> int:
    """Reward-scoring worker processes when ``reward_model.scoring.num_workers`` is null."""
    return max(1, min(4, os.cpu_count() or 1))


def typed(cfg: Any) -> Any:
    """The config as the schema's dataclasses (``DapoConfig``): what the run holds once it is
    resolved, so every key is a typed attribute."""
    return OmegaConf.to_object(cfg) if isinstance(cfg, DictConfig) else cfg


def count_train_rows(cfg: Any) -> int | None:
    """The number of training prompts, read from the parquet footers without loading the data;
    None when it cannot be known before loading (the built-in task not written yet, prompts
    that may be filtered for length, an unreadable file)."""
    files = cfg.data.train_files
    if files is None or cfg.data.filter_overlong_prompts:
        return None
    paths = [files] if isinstance(files, str) else list(files)
    try:
        import pyarrow.parquet as pq

        rows = sum(pq.ParquetFile(Path(str(p)).expanduser()).metadata.num_rows for p in paths)
    except Exception:
        return None
    cap = cfg.data.train_max_samples
    return min(rows, cap) if cap is not None and cap > 0 else rows
