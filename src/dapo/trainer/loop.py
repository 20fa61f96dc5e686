"""The training loop, and nothing else: one step collects ``train_batch_size`` groups (the dynamic
batcher's rollout + reward rounds), fills old/ref log-probs, computes advantages, updates the actor
and logs. What it calls is built beside what it builds; docs/architecture.md walks through a step.
"""

from __future__ import annotations

import copy
import os
import random
import time
import warnings
from collections.abc import Callable
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console

from dapo.actor.dp_actor import Actor, actor_settings_from_config
from dapo.actor.old_log_prob import compute_old_and_ref
from dapo.actor.optim import build_optimizer
from dapo.algo.advantages import get_adv_estimator_fn
from dapo.algo.kl import get_kl_controller
from dapo.batch import Batch
from dapo.checkpoint.store import save_model_dir
from dapo.config.load import to_yaml
from dapo.config.pipeline import finalize_steps
from dapo.config.schema import DapoConfig
from dapo.data.dataset import build_prompt_data, refuse_bad_data
from dapo.distributed.actor_group import LocalActor
from dapo.distributed.builder import actor_on_ranks, build_actor, driver_holds_weights
from dapo.distributed.rank_weights import RankWeights
from dapo.errors import check_nonfinite
from dapo.model.loader import build_policy
from dapo.outputs.dumps import dump_batch, turn_keys
from dapo.outputs.profiling import Timer, actor_perf_metrics, device_peak_flops, profile_step
from dapo.outputs.progress import StepProgress, quiet_third_party_bars
from dapo.outputs.records import GroupRecorder
from dapo.outputs.tracking import build_trackers, read_summary, write_summary
from dapo.reward.factory import build_reward_manager
from dapo.reward.scorers import scorer_notes
from dapo.rollout.rounds import GenerationRound
from dapo.rollout.runner import RolloutRunner
from dapo.sampling import DynamicBatcher, SampledStep
from dapo.sampling.prefetch import GenContext, Prefetcher
from dapo.tasks import run_files
from dapo.trainer.async_run import AsyncRun
from dapo.trainer.metrics import compute_data_metrics, compute_timing_metrics
from dapo.trainer.signals import GracefulStop
from dapo.trainer.state import resume_trainer, save_trainer
from dapo.trainer.validation import final_validation_note, validation_metrics
from dapo.viewer.report import refresh_report


class Trainer:
    def __init__(
        self, cfg: DapoConfig, printer: Callable[[str], None] = print, console: Console | None = None
    ):
        """``cfg`` is the run's config as ``dapo.run_config.build_run_config`` makes it (validated,
        resolved, typed; ``.cfg`` of its result); the trainer only adds the step count once the
        data is loaded (``finalize_steps``) and never writes to it. ``printer`` prints a line;
        ``console``, when given, is the rich console it prints to: the progress bar then shares it
        (lines print above the bar) and lines fit its width."""
        if not isinstance(cfg, DapoConfig):
            raise TypeError(
                f"Trainer takes the run config that dapo.run_config.build_run_config(...).cfg makes "
                f"(validated and resolved), got {type(cfg).__name__}"
            )
        self.cfg = cfg
        self.print, self.console = printer, console
        quiet_third_party_bars()
        # the reward pool forks after the tokenizer has run; its Rust threads must not be in use then
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        tr = cfg.trainer
        if tr.torch_threads and tr.torch_threads > 0:
            torch.set_num_threads(int(tr.torch_threads))
        seed = int(tr.seed)
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)
        self.run_dir = Path(tr.default_local_dir).expanduser()
        files = run_files(cfg, self.print)
        refuse_bad_data(cfg, files.train_files, files.val_files)  # before the model loads
        self.model_path = files.model_path
        # with the actor on worker ranks and vLLM sampling, the weights live on the ranks (and in
        # vLLM): the trainer's model is their layout, on the meta device (``rank_weights``)
        self.rank_weights: RankWeights | None = None
        self.tokenizer, self.model, self.device = build_policy(
            cfg.actor_rollout_ref.model,
            path=files.model_path,
            tokenizer_path=files.tokenizer_path,
            device=tr.device,
            model_dtype=cfg.actor_rollout_ref.actor.fsdp_config.model_dtype,
            weights=driver_holds_weights(cfg),
        )
        # made once the data and the model have loaded: a refused `dapo eval` (which takes no run
        # lock) leaves no directory behind
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.rollout = RolloutRunner(cfg, self.model, self.tokenizer, self.print, model_path=self.model_path)
        self.train_rows, self.val_rows, self.sampler = build_prompt_data(
            cfg.data,
            files.train_files,
            files.val_files,
            self.tokenizer,
            self.rollout.prompt_width,
            val_only=tr.val_only,
            log=self.print,
        )
        self.reward_fn = build_reward_manager(cfg, self.tokenizer)
        if not cfg.custom_reward_function.path:
            for line in scorer_notes({r.data_source for r in self.train_rows + self.val_rows}):
                self.print(line)
        self._setup_algorithm()
        self.trackers = build_trackers(
            list(tr.logger),
            self.run_dir,
            self.print,
            # a terminal's lines break between fields at its width; a log file gets one line a step
            console_width=(lambda: console.width) if console is not None and console.is_terminal else None,
            project_name=tr.project_name,
            experiment_name=tr.experiment_name,
            config=self.cfg,
        )
        self.group_recorder = GroupRecorder.from_config(self.run_dir, self.cfg)
        self.global_step = 0
        self.steps_run = self.updates = 0  # by this invocation (a resumed run counts from its resume)
        self.timer = Timer()
        # algorithm.filter_groups.prefetch: the next step's batch, generated while this step trains
        self.prefetcher = Prefetcher(bool(cfg.algorithm.filter_groups.prefetch))
        # async_training.mode=colocate_async or separate_async: generation and scoring threads, started with the loop
        self.async_run: AsyncRun | None = None
        self.stopped, self.stopped_by = False, None
        # validation before training and the latest one: a checkpoint keeps them for the summary
        self.validation: dict[str, dict[str, float]] = {"before": {}, "last": {}}
        self.step_row: dict[str, Any] | None = None  # the metrics row of the step being saved
        resume_trainer(self)
        # the resolved configuration of this run (of its latest start, for a resumed run), once
        # the resume has accepted it: a refused start leaves the run directory as it was
        (self.run_dir / "config.yaml").write_text(to_yaml(cfg))

    # ---------------------------------------------------------------- setup

    def _setup_algorithm(self) -> None:
        self.cfg = cfg = finalize_steps(self.cfg, len(self.train_rows))
        a, alg = cfg.actor_rollout_ref.actor, cfg.algorithm
        self.settings = actor_settings_from_config(cfg)
        self.total_training_steps = int(cfg.trainer.total_training_steps)
        # with worker ranks this optimizer only carries the LR schedule (never stepped, no state)
        self.optimizer, self.scheduler = build_optimizer(self.model, a.optim, self.total_training_steps)
        self.use_ref = bool(a.use_kl_loss or alg.use_kl_in_reward)
        on_ranks = actor_on_ranks(cfg)
        # the reference policy is the frozen initial weights; it costs nothing when no KL is used,
        # and with worker ranks each rank holds its own shards of it
        self.ref_model = None
        if self.use_ref and not on_ranks:
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        holds_weights = driver_holds_weights(cfg)
        # one interface whether the actor runs here or on a worker group (processes or Ray)
        self.actor = build_actor(
            cfg,
            model_path=self.model_path,
            settings=self.settings,
            actor=None if on_ranks else Actor(self.model, self.optimizer, self.settings),
            ref_model=self.ref_model,
            use_ref=self.use_ref,
            lr_source=self.optimizer,
            rollout_model=self.model if holds_weights else None,
            run_dir=self.run_dir,
            log=self.print,
        )
        if not holds_weights:
            self.rank_weights = RankWeights(self.actor, self.model)
            self.rollout.use_weights(self.rank_weights)
        kl = alg.kl_ctrl
        self.kl_ctrl = (
            get_kl_controller(kl.type, kl.kl_coef, kl.target_kl, kl.horizon) if alg.use_kl_in_reward else None
        )
        in_process = isinstance(self.actor, LocalActor)
        # async and prefetch: generation and the update run at the same time, so the device is
        # not handed over
        if cfg.async_training.mode == "sync" and not cfg.algorithm.filter_groups.prefetch:
            self.rollout.attach_handoff(cfg, self.optimizer if in_process else None)
        self.batcher = DynamicBatcher.from_config(cfg)
        self.adv_fn = get_adv_estimator_fn(alg.adv_estimator)
        self.round = GenerationRound(
            self.rollout, self.reward_fn, alg, self.kl_ctrl, self._compute_old_and_ref
        )

    # ---------------------------------------------------------------- the loop

    def fit(self) -> dict[str, Any]:
        t_start = time.time()
        self.print(f"run directory: {self.run_dir}")
        tr = self.cfg.trainer
        before = self.validation["before"]  # a resumed run's, from its checkpoint
        # a resumed run has validated before training already
        if (tr.val_before_train and self.global_step == 0) or tr.val_only:
            timer = Timer()
            with timer("testing"):
                before = self.validate()
            if before:
                self._log({**before, "timing_s/testing": timer.raw["testing"]}, step=self.global_step)
        if tr.val_only:
            return self._finish(before, before, t_start)
        self.validation = {"before": before, "last": self.validation["last"] or before}
        last_val = self.validation["last"]
        if tr.test_freq <= 0 and self.val_rows and self.global_step < self.total_training_steps:
            self.print(final_validation_note(tr.test_freq))
        with (
            GracefulStop(self.print) as stop,
            StepProgress(
                self.total_training_steps, enabled="console" in tr.logger, console=self.console
            ) as progress,
        ):
            progress.advance_to(self.global_step)
            if self.cfg.async_training.mode != "sync":
                self.async_run = AsyncRun(self.cfg, self.rollout, self.round, self.batcher, self.sampler)
            try:
                while self.global_step < self.total_training_steps:
                    self.global_step += 1
                    self.steps_run += 1
                    with profile_step(self.global_step, tr.profile_steps, self.run_dir / "profile"):
                        metrics = self._train_step(progress)
                    for line in self.rollout.step_warnings():
                        self.print(line)
                    if self.prefetcher.error is not None:
                        self._log(metrics, step=self.global_step)
                        self.print(
                            f"generating the batch of step {self.global_step + 1} failed; step "
                            f"{self.global_step} is logged but not saved (the last checkpoint is intact)"
                        )
                        raise self.prefetcher.error
                    is_last = self.global_step >= self.total_training_steps
                    timer = Timer()
                    # validation also runs after the last step, whatever test_freq, so the summary has it
                    if is_last or (tr.test_freq > 0 and self.global_step % tr.test_freq == 0):
                        with timer("testing"):
                            last_val = self.validation["last"] = self.validate()
                        metrics.update(last_val)
                        metrics["timing_s/testing"] = timer.raw["testing"]
                    saved = stop.requested or (
                        tr.save_freq > 0 and (is_last or self.global_step % tr.save_freq == 0)
                    )
                    if saved:
                        self.step_row = dict(metrics)
                        self.rollout.to_trainer()  # the optimizer state is the actor's again
                        with timer("save_checkpoint"):
                            with self._generation_quiet():
                                save_trainer(self)
                        metrics["timing_s/save_checkpoint"] = timer.raw["save_checkpoint"]
                    progress.advance(metrics)
                    self._log(metrics, step=self.global_step)
                    refresh_report(self.run_dir, self.global_step, tr.report_freq, is_last, log=self.print)
                    if stop.requested:
                        if not saved:  # the stop came while the step was being logged (a closed console)
                            self.step_row = dict(metrics)
                            self.rollout.to_trainer()
                            with self._generation_quiet():
                                save_trainer(self)
                        break
            except BaseException:
                # an error, or Ctrl-C, must not leave the generation and scoring threads
                # stepping the engine and drawing prompts behind the exception
                if self.async_run is not None:
                    self.async_run.shutdown()
                raise
        self.stopped, self.stopped_by = stop.requested, stop.reason
        return self._finish(before, last_val, t_start)

    def _train_step(self, progress: StepProgress) -> dict[str, float]:
        self.timer = Timer()
        # the trainer process's CPU seconds over the step (all its threads; not the scoring
        # workers'): on a shared machine a step's wall seconds say more about the load than the step
        cpu0 = time.process_time()
        with self.timer("step"):
            sampled, ctx = self._next_sampled(progress)
            self.group_recorder.write(self.global_step, sampled)
            metrics: dict[str, float] = dict(sampled.metrics)
            metrics.update(ctx.round_metrics)
            if sampled.action != "train" or sampled.batch is None or len(sampled.batch) == 0:
                self.print(f"step {self.global_step}: no update (dynamic sampling: {sampled.action})")
                metrics["training/skipped_step"] = 1.0
                if self.cfg.trainer.rollout_data_dir and ctx.last_round is not None:
                    # the filtered-out groups of the step's last round, to see why nothing trained
                    keys = ctx.reward_extra_keys
                    self._dump(self.cfg.trainer.rollout_data_dir, ctx.last_round, keys, {"trained": False})
                return metrics
            batch = sampled.batch
            epoch = self.sampler.epoch  # the prefetch below may move it on
            prefetching = self._start_prefetch(progress)
            try:
                self.rollout.to_trainer()
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
                with warnings.catch_warnings():
                    # with actor ranks the driver's optimizer only carries the schedule (the ranks
                    # step their own), and torch would warn at every run's first step
                    warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)`")
                    self.scheduler.step()
                if self.async_run is not None:
                    self.async_run.after_update(self.model)
                self.updates += 1
                # the step ends when its prefetch does: validation, checkpoints and dumps then see
                # a quiet trainer, and the step's time includes any generation the update did not hide
                if prefetching:
                    with self.timer("wait_prefetch"):
                        self.prefetcher.wait()
            except BaseException:
                # an error, or Ctrl-C twice (during the update or the wait): the next step's
                # generation stops at its next round instead of this one waiting for it
                if prefetching:
                    self.prefetcher.cancel()
                raise
            check_nonfinite(self.actor.consecutive_nonfinite, self.global_step, self.run_dir)
            if self.cfg.trainer.rollout_data_dir:
                with self.timer("dump_rollout_generations"):
                    self._dump(self.cfg.trainer.rollout_data_dir, batch, ctx.reward_extra_keys)
        metrics["actor/nonfinite_steps"] = float(self.actor.nonfinite_steps)
        metrics.update(compute_data_metrics(batch))
        metrics.update(compute_timing_metrics(batch, self.timer.raw))
        metrics.update(self.rollout.take_sync_metrics())
        metrics["perf/cpu_time_per_step"] = time.process_time() - cpu0
        if not hasattr(self, "_peak_flops"):  # measured once per run (on a CPU it draws from torch's RNG)
            self._peak_flops = device_peak_flops(self.device, next(self.model.parameters()).dtype)
        seq_lens = batch.tensors["attention_mask"].sum(-1).tolist() * self.settings.actor.ppo_epochs
        seconds = self.timer.raw.get("update_actor", 0.0)
        metrics.update(
            actor_perf_metrics(self.model.config, seq_lens, seconds, self.device, self._peak_flops)
        )
        metrics["training/global_step"] = float(self.global_step)
        metrics["training/epoch"] = float(epoch)
        return metrics

    def _next_sampled(self, progress: StepProgress) -> tuple[SampledStep, GenContext]:
        """This step's batch: the one prefetched during the previous step, else generated now."""
        if self.async_run is not None:
            with self.timer("wait_generation"):
                sampled, ctx = self.async_run.next_batch()
            self.timer.add(ctx.timer)
            return sampled, ctx
        prefetched = self.prefetcher.take()
        if prefetched is not None:
            self.timer.add(prefetched[1].timer)
            return prefetched
        self.rollout.sync_weights(self.timer)
        ctx = GenContext(timer=self.timer)
        fg = self.cfg.algorithm.filter_groups
        stream = self.round.stream(ctx) if fg.enable and fg.strategy == "stream" else None
        try:
            sampled = self.batcher.next_batch(
                self.sampler, partial(self.round, ctx=ctx), on_round=progress.on_round, stream=stream
            )
        finally:
            if stream is not None:
                stream.close()
        return sampled, ctx

    def _start_prefetch(self, progress: StepProgress) -> bool:
        """Generate the next step's batch in the background, on the weights before this update."""
        if not self.prefetcher.enabled or self.global_step >= self.total_training_steps:
            return False
        self.rollout.sync_weights(self.timer)
        return self.prefetcher.start(
            lambda ctx: self.batcher.next_batch(
                self.sampler, self.prefetcher.guard(partial(self.round, ctx=ctx)), progress.on_round, lag=1
            )
        )

    @property
    def weights_writer(self) -> Callable[[Path], Any] | None:
        """What writes the policy's Hugging Face files when the trainer holds no copy of it."""
        return self.rank_weights.save_pretrained if self.rank_weights is not None else None

    def _generation_quiet(self) -> Any:
        """Async: the batcher's state held still while a checkpoint saves it."""
        return self.async_run.locked() if self.async_run is not None else nullcontext()

    def _compute_old_and_ref(self, batch: Batch) -> dict[str, float]:
        return compute_old_and_ref(
            self.actor,
            batch,
            self.settings,
            self.cfg,
            self.timer,
            use_ref=self.use_ref,
            # async groups come from older weights, as prefetched ones do: old log-probs are recomputed
            prefetch=self.prefetcher.enabled or self.async_run is not None,
        )

    # ---------------------------------------------------------------- validation, logging, the end

    def validate(self) -> dict[str, float]:
        """Held-out metrics. Sampling uses its own generator seeded from trainer.seed, so the
        numbers depend only on the weights (``dapo eval`` of a saved model reproduces them)."""
        if not self.val_rows:
            return {}
        seed, bs = int(self.cfg.trainer.seed) + 7919, int(self.cfg.data.val_batch_size)
        with self.async_run.idle() if self.async_run is not None else nullcontext():
            batch = self.rollout.generate_validation(self.val_rows, bs, seed)
            # a context of its own: validation's reward counters are not a training step's
            extra = self.round.score(batch, GenContext())
        self._dump(self.cfg.trainer.validation_data_dir, batch, list(extra))
        return validation_metrics(batch, extra)

    def _dump(
        self, out_dir: str | None, batch: Batch, reward_extra_keys: list[str], fields: dict | None = None
    ) -> None:
        if out_dir:
            keys = reward_extra_keys + turn_keys(batch)
            dump_batch(out_dir, self.global_step, batch, self.tokenizer, keys, fields=fields)

    def _log(self, metrics: dict[str, Any], step: int) -> None:
        for t in self.trackers:
            t.log(metrics, step)

    def _finish(self, before: dict[str, float], after: dict[str, float], t_start: float) -> dict[str, Any]:
        tr = self.cfg.trainer
        self.rollout.to_trainer()
        model_dir = None
        if tr.save_final_model and not tr.val_only and not self.stopped:
            model_dir = save_model_dir(
                self.run_dir / "final_model", self.model, self.tokenizer, weights_writer=self.weights_writer
            )
        previous = read_summary(self.run_dir)
        if (
            not tr.val_only
            and self.steps_run == 0
            and self.global_step > 0
            and previous is not None
            and previous.get("steps") == self.global_step
        ):
            # a re-run with no step left (a finished run whose finished.json was lost) keeps the
            # record of the invocations that trained, instead of "0 steps, 0 updates, 0 s"
            summary = previous
        else:
            summary = self._write_summary(before, after, model_dir, t_start)
        for t in self.trackers:
            t.close()
        if self.async_run is not None:
            self.async_run.shutdown()
        for part in (self.actor, self.rollout, self.prefetcher):
            part.shutdown()
        self.reward_fn.close() if hasattr(self.reward_fn, "close") else None
        return summary

    def _write_summary(
        self, before: dict[str, float], after: dict[str, float], model_dir: Path | None, t_start: float
    ) -> dict[str, Any]:
        return write_summary(
            self.run_dir,
            before,
            after,
            model_path=self.model_path,
            final_model=str(model_dir) if model_dir else None,
            steps=self.global_step,
            # policy updates made by this invocation; 0 after steps ran means nothing was trained
            steps_run=self.steps_run,
            updates=self.updates,
            stopped=self.stopped,
            stopped_by=self.stopped_by,
            total_training_steps=self.total_training_steps,
            wall_time_s=round(time.time() - t_start, 1),
        )
