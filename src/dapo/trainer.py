"""The training loop, and nothing else: a single controller that calls the workers.

One step: the dynamic batcher collects ``train_batch_size`` groups (rollout + reward per
round), the actor recomputes old log-probs, advantages are computed per group, the actor
updates, metrics are logged. Training steps (not generation rounds) drive the counter,
the LR schedule and ``total_training_steps``; timers and metrics accumulate over every
generation round of a step.
"""

from __future__ import annotations

import copy
import json
import math
import os
import random
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from dapo.actor.dp_actor import Actor, actor_settings_from_config
from dapo.algo.advantages import get_adv_estimator_fn
from dapo.algo.agg import agg_loss
from dapo.algo.kl import apply_kl_penalty, get_kl_controller
from dapo.algo.rollout_correction import compute_rollout_correction
from dapo.batch import Batch
from dapo.checkpoint import find_resume_checkpoint, load_checkpoint, save_checkpoint
from dapo.config.load import ConfigError
from dapo.config.validate import validate
from dapo.data.dataset import PromptSampler, load_prompts
from dapo.distributed.builder import build_actor, dp_world_size
from dapo.dumps import dump_batch
from dapo.metrics import compute_data_metrics, compute_timing_metrics
from dapo.profiling import estimate_mfu, peak_memory_gb, profile_step
from dapo.rollout.hf import HFRollout, SamplingParams
from dapo.sampling import DynamicBatcher
from dapo.sampling.batcher import SampledStep, batch_from_state, batch_to_state
from dapo.signals import GracefulStop
from dapo.tracking import build_trackers
from dapo.validation import process_validation_metrics


@dataclass
class Timer:
    """Seconds per phase, accumulated over every generation round of a step."""

    raw: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def __call__(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.raw[name] = self.raw.get(name, 0.0) + time.perf_counter() - t0


@dataclass
class GenContext:
    """What generating one step's batch accumulates: phase times and round metrics. Each step's
    generation has its own, so a batch prefetched while the previous step trains keeps its
    numbers apart from that step's."""

    timer: Timer = field(default_factory=Timer)
    round_metrics: dict[str, float] = field(default_factory=dict)
    reward_extra_keys: list[str] = field(default_factory=list)  # the scorer's extra columns

    def add(self, key: str, value: float) -> None:
        self.round_metrics[key] = self.round_metrics.get(key, 0.0) + float(value)


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def lr_lambda(
    scheduler_type: str, warmup: int, total: int, min_lr_ratio: float, num_cycles: float
) -> Callable:
    """verl's constant-with-warmup and cosine-with-warmup schedules, stepped once per training step."""

    def fn(step: int) -> float:
        if warmup > 0 and step < warmup:
            return float(step) / float(max(1, warmup))
        if scheduler_type == "constant":
            return 1.0
        progress = float(step - warmup) / float(max(1, total - warmup))
        cos = 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress))
        return max(0.0, min_lr_ratio + (1.0 - min_lr_ratio) * cos)

    return fn


MAX_CONSECUTIVE_NONFINITE = 3


class TrainingError(RuntimeError):
    """The run cannot go on; the message says why and how to continue."""


class Trainer:
    def __init__(self, cfg: DictConfig, printer: Callable[[str], None] = print):
        problems = validate(cfg)
        if problems:
            raise ConfigError(problems)
        self.cfg = cfg
        self.print = printer
        tr = cfg.trainer
        if tr.torch_threads and tr.torch_threads > 0:
            torch.set_num_threads(int(tr.torch_threads))
        set_seed(int(tr.seed))
        self.run_dir = Path(tr.default_local_dir).expanduser()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._setup_model()
        self._setup_data()
        self._setup_reward()
        self._setup_algorithm()
        self.trackers = build_trackers(
            list(tr.logger),
            self.run_dir,
            self.print,
            project_name=tr.project_name,
            experiment_name=tr.experiment_name,
            config=OmegaConf.to_container(cfg, resolve=True),
        )
        from dapo.viewer.records import GroupRecorder

        self.group_recorder = GroupRecorder.from_config(self.run_dir, cfg)
        self.global_step = 0
        self.timer = Timer()
        # algorithm.filter_groups.prefetch: the next step's batch, generated while this step trains
        self._executor = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="dapo-prefetch") if self.prefetch else None
        )
        self._prefetched: tuple[SampledStep, GenContext] | None = None
        self._prefetch_error: BaseException | None = None
        self.stopped = False
        self._resume()

    # ---------------------------------------------------------------- checkpoints

    def _trainer_state(self) -> dict[str, Any]:
        return {
            "sampler": self.sampler.state_dict(),
            "batcher": self.batcher.state_dict(),
            "kl_coef": self.kl_ctrl.value if self.kl_ctrl is not None else None,
            "nonfinite_steps": self.actor.nonfinite_steps,
            "rollout_generator": self.rollout.generator,
            "rollout_device_generators": dict(getattr(self.rollout, "_device_generators", {})),
            "prefetched": self._prefetched_state(),
        }

    def _prefetched_state(self) -> dict[str, Any] | None:
        if self._prefetched is None:
            return None
        sampled, ctx = self._prefetched
        return {
            "action": sampled.action,
            "batch": None if sampled.batch is None else batch_to_state(sampled.batch),
            "metrics": sampled.metrics,
            "group_records": sampled.group_records,
            "timer": ctx.timer.raw,
            "round_metrics": ctx.round_metrics,
            "reward_extra_keys": ctx.reward_extra_keys,
        }

    def _load_prefetched(self, d: dict[str, Any] | None) -> None:
        if d is None:
            self._prefetched = None
            return
        batch = None if d["batch"] is None else batch_from_state(d["batch"])
        sampled = SampledStep(batch, d["action"], dict(d["metrics"]), list(d["group_records"]))
        ctx = GenContext(Timer(dict(d["timer"])), dict(d["round_metrics"]), list(d["reward_extra_keys"]))
        self._prefetched = (sampled, ctx)

    def _save(self) -> None:
        save_checkpoint(
            self.run_dir,
            self.global_step,
            model=self.model,
            tokenizer=self.tokenizer,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            trainer_state=self._trainer_state(),
            max_to_keep=self.cfg.trainer.max_actor_ckpt_to_keep,
            extra_writer=self._save_sharded if self.actor.world_size > 1 else None,
        )

    def _save_sharded(self, ckpt_dir: Path) -> None:
        """Worker ranks' model and optimizer shards (torch.distributed.checkpoint, any world size)."""
        self.actor.save_sharded(str(ckpt_dir / "actor" / "dcp"))

    def _resume(self) -> None:
        """Continue from the latest complete checkpoint (trainer.resume_mode), exactly."""
        tr = self.cfg.trainer
        path = find_resume_checkpoint(self.run_dir, tr.resume_mode, tr.resume_from_path)
        if path is None:
            return
        st = load_checkpoint(
            path,
            self.model,
            self.optimizer,
            self.scheduler,
            generators={"rollout_generator": self.rollout.generator},
        )
        self.global_step = int(st["global_step"])
        dcp_dir = path / "actor" / "dcp"
        if dcp_dir.exists():  # saved by worker ranks; loads at any world size
            if self.actor.world_size > 1:
                self.actor.load_sharded(str(dcp_dir))
            else:
                from dapo.distributed.fsdp_worker import load_sharded

                load_sharded(self.model, self.optimizer, str(dcp_dir))
        self.sampler.load_state_dict(st["sampler"])
        self.batcher.load_state_dict(st["batcher"])
        if self.kl_ctrl is not None and st.get("kl_coef") is not None:
            self.kl_ctrl.value = float(st["kl_coef"])
        self.actor.nonfinite_steps = int(st["nonfinite_steps"])
        self._load_prefetched(st.get("prefetched"))
        if hasattr(self.rollout, "_device_generators"):
            self.rollout._device_generators.update(st.get("rollout_device_generators") or {})
        self.print(f"resumed from {path} (step {self.global_step})")

    # ---------------------------------------------------------------- setup

    def _setup_model(self) -> None:
        from dapo.model.loader import load_model, load_tokenizer
        from dapo.model.tiny import ensure_tiny_model

        m = self.cfg.actor_rollout_ref.model
        mt = self.cfg.actor_rollout_ref.rollout.multi_turn
        if mt.enable and not m.path:
            from dapo.tools.tiny_model import ensure_tiny_tool_model

            path = str(ensure_tiny_tool_model(log=self.print))
        else:
            path = m.path or str(ensure_tiny_model(log=self.print))
        self.model_path = path
        self.tokenizer = load_tokenizer(m.tokenizer_path or path, trust_remote_code=m.trust_remote_code)
        if m.custom_chat_template:
            self.tokenizer.chat_template = m.custom_chat_template
        from dapo.actor.precision import resolve_model_dtype

        self.device = torch.device("cuda" if self.cfg.trainer.device == "cuda" else "cpu")
        dtype = resolve_model_dtype(self.cfg.actor_rollout_ref.actor.fsdp_config.model_dtype, self.device)
        self.model = load_model(path, dtype=dtype, trust_remote_code=m.trust_remote_code)
        for k, v in (m.override_config or {}).items():
            setattr(self.model.config, k, v)
        if m.enable_gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        self.model.train()
        self.model.to(self.device)
        eos = self.tokenizer.eos_token_id
        gen_eos = (
            getattr(self.model.generation_config, "eos_token_id", None)
            if self.model.generation_config
            else None
        )
        eos_ids = [eos] + (gen_eos if isinstance(gen_eos, list) else [gen_eos] if gen_eos is not None else [])
        self.prefetch = bool(self.cfg.algorithm.filter_groups.prefetch)
        # with prefetch, generation runs on its own copy of the weights (refreshed before each
        # prefetch and each validation) while the optimizer updates the model in place
        self.rollout_model = None
        if self.prefetch:
            self.rollout_model = copy.deepcopy(self.model).eval().requires_grad_(False)
            if not self.cfg.algorithm.rollout_correction.rollout_is:
                self.print(
                    "warning: algorithm.filter_groups.prefetch trains on groups one policy update stale "
                    "with no importance weights; set algorithm.rollout_correction.rollout_is=token to "
                    "correct for the drift (on the built-in task, learning collapsed without it)"
                )
        self.rollout = HFRollout(
            self.rollout_model if self.rollout_model is not None else self.model,
            [e for e in eos_ids if e is not None],
            self.tokenizer.pad_token_id,
            seed=int(self.cfg.trainer.seed),
        )
        self.multi_turn = None
        if mt.enable:  # generate -> tool calls -> tool messages (response_mask 0) -> ...
            from dapo.rollout.multiturn import MultiTurnRollout

            self.multi_turn = MultiTurnRollout.from_config(self.rollout, self.tokenizer, mt)

    def _setup_data(self) -> None:
        d = self.cfg.data
        train_files, val_files = d.train_files, d.val_files
        if train_files is None and self.cfg.actor_rollout_ref.rollout.multi_turn.enable:
            from dapo.data.builtin_tools import ensure_tool_task

            tr_path, te_path = ensure_tool_task()
            train_files = str(tr_path)
            val_files = val_files if val_files is not None else str(te_path)
        elif train_files is None:
            from dapo.data.builtin import task_fingerprint, write_task
            from dapo.model.tiny import cache_dir

            tr_path, te_path = write_task(cache_dir() / "data" / f"arithmetic-{task_fingerprint()}")
            train_files = str(tr_path)
            val_files = val_files if val_files is not None else str(te_path)
        common = dict(
            prompt_key=d.prompt_key,
            reward_fn_key=d.reward_fn_key,
            filter_overlong_prompts=d.filter_overlong_prompts,
            truncation=d.truncation,
            chat_template_kwargs=dict(d.apply_chat_template_kwargs or {}),
        )
        self.prompt_width = int(self.cfg.actor_rollout_ref.rollout.prompt_length or d.max_prompt_length)
        self.train_rows, stats = load_prompts(
            train_files,
            self.tokenizer,
            self.prompt_width,
            max_samples=d.train_max_samples,
            files_key="data.train_files",
            **common,
        )
        self.val_rows = []
        if val_files is not None:
            self.val_rows, _ = load_prompts(
                val_files,
                self.tokenizer,
                self.prompt_width,
                max_samples=d.val_max_samples,
                files_key="data.val_files",
                **common,
            )
        seed = int(d.seed if d.seed is not None else self.cfg.trainer.seed)
        self.sampler = PromptSampler(self.train_rows, seed=seed, shuffle=d.shuffle)
        self.print(
            f"data: {len(self.train_rows)} train prompts, {len(self.val_rows)} validation prompts"
            + (f" ({stats['filtered_overlong']} over-long filtered)" if stats["filtered_overlong"] else "")
        )

    def _setup_reward(self) -> None:
        from dapo.reward.factory import build_reward_manager

        self.response_length = int(
            self.cfg.actor_rollout_ref.rollout.response_length or self.cfg.data.max_response_length
        )
        self.reward_fn = build_reward_manager(self.cfg, self.tokenizer)

    def _setup_algorithm(self) -> None:
        cfg = self.cfg
        a, alg = cfg.actor_rollout_ref.actor, cfg.algorithm
        self.settings = actor_settings_from_config(cfg)
        o = a.optim
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay
        )
        steps_per_epoch = max(1, len(self.train_rows) // cfg.data.train_batch_size)
        self.total_training_steps = int(
            cfg.trainer.total_training_steps or steps_per_epoch * cfg.trainer.total_epochs
        )
        warmup = (
            o.lr_warmup_steps
            if o.lr_warmup_steps >= 0
            else int(o.lr_warmup_steps_ratio * self.total_training_steps)
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lr_lambda(o.lr_scheduler_type, warmup, self.total_training_steps, o.min_lr_ratio, o.num_cycles),
        )
        self.use_ref = bool(a.use_kl_loss or alg.use_kl_in_reward)
        distributed = dp_world_size(cfg) > 1
        # the reference policy is the frozen initial weights; it costs nothing when no KL is used
        self.ref_model = (
            copy.deepcopy(self.model).eval().requires_grad_(False)
            if self.use_ref and not distributed
            else None
        )
        # one interface whether the actor runs here or on a worker group (processes or Ray)
        self.actor = build_actor(
            cfg,
            model_path=self.model_path,
            settings=self.settings,
            actor=Actor(self.model, self.optimizer, self.settings),
            ref_model=self.ref_model,
            use_ref=self.use_ref,
            lr_source=self.optimizer,
            rollout_model=self.model,
            run_dir=self.run_dir,
            log=self.print,
        )
        self.kl_ctrl = (
            get_kl_controller(
                alg.kl_ctrl.type, alg.kl_ctrl.kl_coef, alg.kl_ctrl.target_kl, alg.kl_ctrl.horizon
            )
            if alg.use_kl_in_reward
            else None
        )
        fg = OmegaConf.to_object(alg.filter_groups)
        gen_bs = int(cfg.data.gen_batch_size or cfg.data.train_batch_size)
        self.batcher = DynamicBatcher(
            fg, cfg.data.train_batch_size, gen_bs, cfg.actor_rollout_ref.rollout.n, seed=int(cfg.trainer.seed)
        )
        self.adv_fn = get_adv_estimator_fn(alg.adv_estimator)

    # ---------------------------------------------------------------- rollout + reward

    def _sampling_params(self, validate: bool = False) -> SamplingParams:
        r = self.cfg.actor_rollout_ref.rollout
        if validate:
            v = r.val_kwargs
            return SamplingParams(
                n=v.n,
                temperature=v.temperature,
                top_p=v.top_p,
                top_k=v.top_k,
                do_sample=v.do_sample,
                response_length=self.response_length,
            )
        return SamplingParams(
            n=r.n,
            temperature=r.temperature,
            top_p=r.top_p,
            top_k=r.top_k,
            do_sample=r.do_sample,
            response_length=self.response_length,
        )

    def _sync_rollout_weights(self) -> None:
        if self.rollout_model is None:
            return
        with torch.no_grad():
            for dst, src in zip(self.rollout_model.parameters(), self.model.parameters(), strict=True):
                dst.copy_(src)

    def _rollout(self, rows: list[dict], params: SamplingParams, ctx: GenContext) -> Batch:
        n = params.n
        turn_info: dict[str, list] = {}
        if self.multi_turn is not None:
            out, info = self.multi_turn.generate(rows, params, self.prompt_width)
            # tool tokens are attended to (attention 1) but never trained on (response_mask 0)
            attention_mask = out.attention_mask
            for k, v in self.multi_turn.last_metrics.items():
                if k.startswith("tools/") and k != "tools/call_rate":
                    ctx.add(k, v)
            turn_info = {k: list(info[k]) for k in ("num_turns", "tool_call_counts", "messages") if k in info}
        else:
            out = self.rollout.generate(
                [r["prompt_ids"] for r in rows], params, prompt_width=self.prompt_width
            )
            prompt_mask = (
                torch.arange(self.prompt_width).unsqueeze(0)
                >= (
                    self.prompt_width - torch.tensor([len(r["prompt_ids"]) for r in rows for _ in range(n)])
                ).unsqueeze(1)
            ).long()
            attention_mask = torch.cat([prompt_mask, out.response_mask], dim=1)
        input_ids = torch.cat([out.prompts, out.responses], dim=1)
        rep = [r for r in rows for _ in range(n)]
        return Batch(
            tensors={
                "prompts": out.prompts,
                "responses": out.responses,
                "input_ids": input_ids,
                "attention_mask": attention_mask,
                "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
                "response_mask": out.response_mask,
                "rollout_log_probs": out.rollout_log_probs,
            },
            non_tensors={
                "index": [r["index"] for r in rep],
                "data_source": [r["data_source"] for r in rep],
                "reward_model": [r["reward_model"] for r in rep],
                "extra_info": [r["extra_info"] for r in rep],
                "truncated": out.truncated.tolist(),
                **turn_info,
            },
        )

    def _score(self, batch: Batch, ctx: GenContext) -> dict[str, list]:
        scores, extra = self.reward_fn(batch)[:2]
        ctx.reward_extra_keys = list(extra)
        batch.tensors["token_level_scores"] = scores
        for k, v in extra.items():
            batch[k] = list(v)
        for k, v in (getattr(self.reward_fn, "last_metrics", None) or {}).items():
            ctx.add(k, v)
        return extra

    def _generate_and_score(self, rows: list[dict], ctx: GenContext) -> Batch:
        """One generation round: rollout, reward, rewards (with in-reward KL when configured)."""
        with ctx.timer("gen"):
            batch = self._rollout(rows, self._sampling_params(), ctx)
        with ctx.timer("reward"):
            self._score(batch, ctx)
        if self.cfg.algorithm.adv_estimator == "remax":
            batch.tensors["reward_baselines"] = self._greedy_baseline(rows, self._sampling_params().n, ctx)
        if self.kl_ctrl is not None:
            self._compute_old_and_ref(batch)
            rewards, current_kl = apply_kl_penalty(
                batch.tensors["token_level_scores"],
                batch.tensors["old_log_probs"],
                batch.tensors["ref_log_prob"],
                batch.tensors["response_mask"],
                self.kl_ctrl.value,
                self.cfg.algorithm.kl_penalty,
            )
            self.kl_ctrl.update(float(current_kl), n_steps=len(rows))
            batch.tensors["token_level_rewards"] = rewards
            ctx.round_metrics["actor/reward_kl_penalty"] = float(current_kl)
            ctx.round_metrics["actor/reward_kl_penalty_coeff"] = float(self.kl_ctrl.value)
        else:
            batch.tensors["token_level_rewards"] = batch.tensors["token_level_scores"].clone()
        return batch

    def _greedy_baseline(self, rows: list[dict], n: int, ctx: GenContext) -> torch.Tensor:
        """ReMax: the reward of one greedy response per prompt, repeated for its n samples [B]."""
        with ctx.timer("gen_max"):
            params = self._sampling_params()
            params.n, params.do_sample, params.temperature = 1, False, 0.0
            greedy = self._rollout(rows, params, ctx)
        with ctx.timer("reward"):
            scores, _ = self.reward_fn(greedy)[:2]
        return scores.sum(-1).repeat_interleave(n)

    def _compute_old_and_ref(self, batch: Batch) -> dict[str, float]:
        s = self.settings
        with self.timer("old_log_prob"):
            lp, ent = self.actor.compute_log_prob(
                batch,
                s.temperature,
                s.log_prob_micro_batch_size,
                calculate_entropy=True,
                **s.log_prob_kwargs(),
            )
        batch.tensors["old_log_probs"] = lp
        metrics = {
            "actor/entropy": float(agg_loss(ent, batch.tensors["response_mask"].float(), s.loss_agg_mode))
        }
        metrics.update(self._rollout_correction(batch))
        if self.use_ref:
            with self.timer("ref"):
                ref, _ = self.actor.compute_ref_log_prob(
                    batch, s.temperature, s.log_prob_micro_batch_size, **s.log_prob_kwargs()
                )
            batch.tensors["ref_log_prob"] = ref
        return metrics

    @staticmethod
    def _turn_keys(batch: Batch) -> list[str]:
        """Multi-turn columns that dumps show: every turn's messages, turn and tool-call counts."""
        return [k for k in ("messages", "num_turns", "tool_call_counts") if k in batch.non_tensors]

    def _rollout_correction(self, batch: Batch) -> dict[str, float]:
        """Truncated IS weights / rejection against the sampler's own log-probs (when configured)."""
        rc = self.cfg.algorithm.rollout_correction
        if not (rc.rollout_is or rc.rollout_rs) or "rollout_log_probs" not in batch.tensors:
            return {}
        weights, mask, metrics = compute_rollout_correction(
            batch.tensors["old_log_probs"],
            batch.tensors["rollout_log_probs"],
            batch.tensors["response_mask"].float(),
            rollout_is=rc.rollout_is,
            rollout_is_threshold=rc.rollout_is_threshold,
            rollout_is_batch_normalize=rc.rollout_is_batch_normalize,
            rollout_rs=rc.rollout_rs,
            rollout_rs_threshold=rc.rollout_rs_threshold,
        )
        if weights is not None:
            batch.tensors["rollout_is_weights"] = weights
        batch.tensors["response_mask"] = mask.to(batch.tensors["response_mask"].dtype)
        return metrics

    # ---------------------------------------------------------------- validation

    def validate(self) -> dict[str, float]:
        """Held-out metrics. Sampling uses its own generator seeded from trainer.seed, so the
        numbers depend only on the weights (``dapo eval`` of a saved model reproduces them)."""
        if not self.val_rows:
            return {}
        self._sync_rollout_weights()
        train_generator = self.rollout.generator
        self.rollout.generator = torch.Generator().manual_seed(int(self.cfg.trainer.seed) + 7919)
        try:
            return self._validate()
        finally:
            self.rollout.generator = train_generator

    def _validate(self) -> dict[str, float]:
        params = self._sampling_params(validate=True)
        ctx = GenContext()  # validation's reward counters are not a training step's
        batches = []
        bs = int(self.cfg.data.val_batch_size or 256)
        for s in range(0, len(self.val_rows), bs):
            rows = [r.as_dict() for r in self.val_rows[s : s + bs]]
            b = self._rollout(rows, params, ctx)
            b["uid"] = [f"val-{r['index']}" for r in rows for _ in range(params.n)]
            batches.append(b)
        batch = Batch.concat(batches)
        extra = self._score(batch, ctx)
        reward = batch.tensors["token_level_scores"].sum(-1).tolist()
        infos = {"reward": reward, **{k: list(v) for k, v in extra.items()}}
        if self.cfg.trainer.validation_data_dir:
            dump_batch(
                self.cfg.trainer.validation_data_dir,
                self.global_step,
                batch,
                self.tokenizer,
                reward_extra_keys=list(extra) + self._turn_keys(batch),
            )
        if "num_turns" in batch.non_tensors:
            from dapo.rollout.multiturn import multiturn_metrics

            turns = {k: list(batch[k]) for k in ("num_turns", "tool_call_counts")}
            turn_metrics = multiturn_metrics(turns, prefix="val-aux/")
        else:
            turn_metrics = {}
        out = process_validation_metrics(list(batch["data_source"]), list(batch["uid"]), infos)
        acc = [float(a) for a in extra.get("acc", [])]
        if acc:
            out["val/acc"] = float(np.mean(acc))
        out.update(turn_metrics)
        return out

    # ---------------------------------------------------------------- the loop

    def fit(self) -> dict[str, Any]:
        t_start = time.time()
        self.print(f"run directory: {self.run_dir}")
        tr = self.cfg.trainer
        before: dict[str, float] = {}
        # a resumed run has validated before training already
        if (tr.val_before_train and self.global_step == 0) or tr.val_only:
            with _timed() as t:
                before = self.validate()
            if before:
                self._log({**before, "timing_s/testing": t.seconds}, step=self.global_step)
        if tr.val_only:
            return self._finish(before, before, t_start)
        last_val = before
        from dapo.progress import StepProgress

        with (
            GracefulStop(self.print) as stop,
            StepProgress(self.total_training_steps, enabled="console" in tr.logger) as progress,
        ):
            progress.advance_to(self.global_step)
            while self.global_step < self.total_training_steps:
                self.global_step += 1
                with profile_step(self.global_step, tr.profile_steps, self.run_dir / "profile"):
                    metrics = self._train_step(progress)
                for line in self.multi_turn.step_warnings() if self.multi_turn is not None else []:
                    self.print(line)
                if self._prefetch_error is not None:
                    self._log(metrics, step=self.global_step)
                    self.print(
                        f"generating the batch of step {self.global_step + 1} failed; step "
                        f"{self.global_step} is logged but not saved (the last checkpoint is intact)"
                    )
                    raise self._prefetch_error
                is_last = self.global_step >= self.total_training_steps
                # validation also runs after the last step, whatever test_freq, so the summary has it
                if is_last or (tr.test_freq > 0 and self.global_step % tr.test_freq == 0):
                    with _timed() as t:
                        last_val = self.validate()
                    metrics.update(last_val)
                    metrics["timing_s/testing"] = t.seconds
                if stop.requested or (tr.save_freq > 0 and (is_last or self.global_step % tr.save_freq == 0)):
                    with _timed() as t:
                        self._save()
                    metrics["timing_s/save_checkpoint"] = t.seconds
                progress.advance(metrics)
                self._log(metrics, step=self.global_step)
                self.group_recorder.step_done(self.global_step, is_last=is_last)
                if stop.requested:
                    break
        self.stopped = stop.requested
        return self._finish(before, last_val, t_start)

    def _train_step(self, progress: Any) -> dict[str, float]:
        self.timer = Timer()
        with self.timer("step"):
            sampled, ctx = self._next_sampled(progress)
            self.group_recorder.write(self.global_step, sampled)
            metrics: dict[str, float] = dict(sampled.metrics)
            metrics.update(ctx.round_metrics)
            if sampled.action != "train" or sampled.batch is None or len(sampled.batch) == 0:
                self.print(f"step {self.global_step}: no update (dynamic sampling: {sampled.action})")
                metrics["training/skipped_step"] = 1.0
                return metrics
            batch = sampled.batch
            epoch = self.sampler.epoch  # the prefetch below may move it on
            prefetch = self._start_prefetch(progress)
            try:
                metrics.update(self._compute_old_and_ref(batch))
                with self.timer("adv"):
                    adv, ret = self.adv_fn(
                        token_level_rewards=batch.tensors["token_level_rewards"],
                        response_mask=batch.tensors["response_mask"].float(),
                        index=np.asarray(batch["uid"]),
                        norm_adv_by_std_in_grpo=self.cfg.algorithm.norm_adv_by_std_in_grpo,
                        config=self.cfg.algorithm,
                        epsilon=1e-6,
                        reward_baselines=batch.tensors.get("reward_baselines"),
                    )
                batch.tensors["advantages"], batch.tensors["returns"] = adv, ret
                with self.timer("update_actor"):
                    metrics.update(self.actor.update_policy(batch))
                self.scheduler.step()
            finally:
                # the step ends when its prefetch does: validation, checkpoints and dumps then see
                # a quiet trainer, and the step's time includes any generation the update did not hide
                if prefetch is not None:
                    with self.timer("wait_prefetch"):
                        self._finish_prefetch(*prefetch)
            if self.actor.consecutive_nonfinite >= MAX_CONSECUTIVE_NONFINITE:
                raise TrainingError(
                    f"{self.actor.consecutive_nonfinite} optimizer steps in a row had a non-finite gradient norm "
                    f"(step {self.global_step}); the last checkpoint in {self.run_dir} is intact. Lower "
                    "actor_rollout_ref.actor.optim.lr or check the data, then run the same command to resume"
                )
            if self.cfg.trainer.rollout_data_dir:
                with self.timer("dump_rollout_generations"):
                    dump_batch(
                        self.cfg.trainer.rollout_data_dir,
                        self.global_step,
                        batch,
                        self.tokenizer,
                        reward_extra_keys=ctx.reward_extra_keys + self._turn_keys(batch),
                    )
        metrics["actor/nonfinite_steps"] = float(self.actor.nonfinite_steps)
        metrics.update(compute_data_metrics(batch))
        metrics.update(compute_timing_metrics(batch, self.timer.raw))
        seq_lens = batch.tensors["attention_mask"].sum(-1).tolist() * self.settings.ppo_epochs
        mfu = estimate_mfu(
            self.model.config,
            seq_lens,
            self.timer.raw.get("update_actor", 0.0),
            peak_flops=self._peak_flops(),
        )
        if mfu is not None:
            metrics["perf/mfu/actor"] = mfu
        metrics["perf/max_memory_allocated_gb"] = peak_memory_gb(self.device)
        metrics["training/global_step"] = float(self.global_step)
        metrics["training/epoch"] = float(epoch)
        return metrics

    def _next_sampled(self, progress: Any) -> tuple[SampledStep, GenContext]:
        """This step's batch: the one prefetched during the previous step, else generated now."""
        if self._prefetched is not None:
            sampled, ctx = self._prefetched
            self._prefetched = None
            for k, v in ctx.timer.raw.items():
                self.timer.raw[k] = self.timer.raw.get(k, 0.0) + v
            return sampled, ctx
        self._sync_rollout_weights()
        ctx = GenContext(timer=self.timer)
        sampled = self.batcher.next_batch(
            self.sampler, partial(self._generate_and_score, ctx=ctx), on_round=progress.on_round
        )
        return sampled, ctx

    def _start_prefetch(self, progress: Any) -> tuple[Future, GenContext] | None:
        """Generate the next step's batch in the background, on the weights before this update."""
        if self._executor is None or self.global_step >= self.total_training_steps:
            return None
        self._sync_rollout_weights()
        ctx = GenContext()
        gen = partial(self._generate_and_score, ctx=ctx)
        return self._executor.submit(
            self.batcher.next_batch, self.sampler, gen, progress.on_round, lag=1
        ), ctx

    def _finish_prefetch(self, future: Future, ctx: GenContext) -> None:
        # exception() waits like result() (a KeyboardInterrupt during the wait propagates) but
        # hands back the thread's own error: fit() raises it after logging this step and before
        # validating or saving, so the last checkpoint stays consistent
        err = future.exception()
        if err is None:
            self._prefetched = (future.result(), ctx)
        else:
            self._prefetch_error = err

    def _peak_flops(self) -> float | None:
        """The device's promised peak; on a CPU, the best matmul FLOP/s measured once in this process."""
        if not hasattr(self, "_peak"):
            from dapo.profiling import promised_flops

            self._peak = promised_flops(self.device)
            if self._peak is None and self.device.type == "cpu":
                from dapo.bench.common import matmul_peak_flops

                self._peak = matmul_peak_flops(next(self.model.parameters()).dtype, size=512, seconds=0.3)
        return self._peak

    def _log(self, metrics: dict[str, Any], step: int) -> None:
        for t in self.trackers:
            t.log(metrics, step)

    def _finish(self, before: dict[str, float], after: dict[str, float], t_start: float) -> dict[str, Any]:
        tr = self.cfg.trainer
        model_dir = None
        if tr.save_final_model and not tr.val_only and not self.stopped:
            model_dir = self.run_dir / "final_model"
            self.model.save_pretrained(model_dir, safe_serialization=True)
            self.tokenizer.save_pretrained(model_dir)
        summary = {
            "run_dir": str(self.run_dir),
            "model_path": self.model_path,
            "final_model": str(model_dir) if model_dir else None,
            "steps": self.global_step,
            "stopped": self.stopped,
            "total_training_steps": self.total_training_steps,
            "wall_time_s": round(time.time() - t_start, 1),
            "val_acc_before": before.get("val/acc"),
            "val_acc_after": after.get("val/acc"),
            "val_before": {k: v for k, v in before.items() if k.startswith("val-core/")},
            "val_after": {k: v for k, v in after.items() if k.startswith("val-core/")},
        }
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        for t in self.trackers:
            t.close()
        self.actor.shutdown()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        self.reward_fn.close() if hasattr(self.reward_fn, "close") else None
        return summary


class _timed:
    def __enter__(self) -> _timed:
        self.t0 = time.perf_counter()
        self.seconds = 0.0
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.t0


os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
