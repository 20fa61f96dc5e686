"""Saving and resuming a trainer: the checkpoint (:mod:`dapo.checkpoint.store`) plus everything the
loop needs to continue exactly (prompt sampler and batcher positions, KL coefficient,
non-finite step count, the sampler's generators and a prefetched batch)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dapo.checkpoint.manifest import STATE_FILE, error_summary
from dapo.checkpoint.store import CheckpointError, load_checkpoint, resume_checkpoint, save_checkpoint
from dapo.distributed.actor_group import LocalActor
from dapo.outputs.rundir import RunDirError, check_resume_config, config_snapshot, has_row, reconcile_rows
from dapo.outputs.tracking import replay

if TYPE_CHECKING:
    from dapo.trainer.loop import Trainer


def trainer_state(t: Trainer) -> dict[str, Any]:
    """The loop's own state, saved beside the model and optimizer."""
    return {
        "sampler": t.sampler.state_dict(),
        "batcher": t.batcher.state_dict(),
        "kl_coef": t.kl_ctrl.value if t.kl_ctrl is not None else None,
        "nonfinite_steps": t.actor.nonfinite_steps,
        "rollout_generator": t.rollout.engine.generator,
        "rolloutdevice_generators": dict(t.rollout.engine.device_generators),
        "prefetched": t.prefetcher.state_dict(),
        # what a resume checks its config against, puts in the summary, and logs again when the
        # run was killed between this checkpoint and the step's metrics row
        "config": config_snapshot(t.cfg),
        "validation": t.validation,
        "metrics_row": t.step_row,
    }


def save_trainer(t: Trainer) -> None:
    """Checkpoint ``t`` at its global step (worker ranks write their own shards)."""

    def save_sharded(ckpt_dir: Path) -> None:
        # worker ranks' model and optimizer shards (torch.distributed.checkpoint, any world size)
        t.actor.save_sharded(str(ckpt_dir / "actor" / "dcp"))

    save_checkpoint(
        t.run_dir,
        t.global_step,
        model=t.model,
        tokenizer=t.tokenizer,
        optimizer=t.optimizer,
        scheduler=t.scheduler,
        trainer_state=trainer_state(t),
        max_to_keep=t.cfg.trainer.max_actor_ckpt_to_keep,
        extra_writer=save_sharded if not isinstance(t.actor, LocalActor) else None,
        weights_writer=t.weights_writer,
        log=t.print,
    )


def resume_trainer(t: Trainer) -> None:
    """Continue from the newest usable checkpoint (trainer.resume_mode), exactly; in ``auto``
    mode a damaged checkpoint is skipped, with a warning, for the one before it."""
    tr = t.cfg.trainer

    def warn(msg: str) -> None:
        t.print(f"warning: {msg}")

    loaded: dict[str, Any] = {}
    path = resume_checkpoint(
        t.run_dir,
        tr.resume_mode,
        tr.resume_from_path,
        lambda p: loaded.update(row=_load_trainer(t, p, warn)),
        warn=warn,
    )
    if path is not None:
        t.print(f"resumed from {path} (step {t.global_step})")
    if not tr.val_only:
        _reconcile_rows(t, t.global_step if path is not None else None, loaded.get("row"))


def _load_trainer(t: Trainer, path: Path, warn: Callable[[str], None]) -> dict[str, Any] | None:
    """Load ``path`` into ``t``; returns the metrics row the checkpoint keeps of its own step."""
    tr = t.cfg.trainer
    st = load_checkpoint(
        path,
        t.model if t.rank_weights is None else None,  # the ranks load their shards below
        t.optimizer,
        t.scheduler,
        generators={"rollout_generator": t.rollout.engine.generator},
        warn=warn,
    )
    t.global_step = int(st["global_step"])
    if not tr.val_only:
        warning = check_resume_config(path, st.get("config"), t.cfg)
        if warning:
            t.print(warning)
        if t.global_step > t.total_training_steps:
            raise RunDirError(
                f"{path} is step {t.global_step}, past the {t.total_training_steps} training steps this "
                "command asks for; raise trainer.total_training_steps, or set trainer.default_local_dir "
                "to a new directory"
            )
    dcp_dir = path / "actor" / "dcp"
    if not isinstance(t.actor, LocalActor) and not dcp_dir.exists():
        # not damage (older checkpoints would be tried in vain): a run written another way
        raise RunDirError(
            f"{path}: has no actor/dcp, the worker ranks' model and optimizer shards: it was written "
            "with the actor in the trainer's process (or by an earlier dapo with one process-backend "
            "rank, whose resume left the rank at its initial weights), so the ranks have nothing to "
            "load; resume it with trainer.worker_backend=inprocess and trainer.n_gpus_per_node=1, or "
            "set trainer.default_local_dir to a new directory"
        )
    if dcp_dir.exists():  # saved by worker ranks; loads at any world size
        if not isinstance(t.actor, LocalActor):
            t.actor.load_sharded(str(dcp_dir))
        else:
            from dapo.distributed.fsdp_worker import load_sharded

            load_sharded(t.model, t.optimizer, str(dcp_dir))
    try:
        t.sampler.load_state_dict(st["sampler"])
        t.batcher.load_state_dict(st["batcher"])
        if t.kl_ctrl is not None and st.get("kl_coef") is not None:
            t.kl_ctrl.value = float(st["kl_coef"])
        t.actor.nonfinite_steps = int(st["nonfinite_steps"])
        t.prefetcher.load_state_dict(st.get("prefetched"))
        t.rollout.engine.device_generators.update(st.get("rolloutdevice_generators") or {})
    except CheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 - a state that parses but does not fit: a damaged checkpoint
        raise CheckpointError(
            f"{path / STATE_FILE}: does not fit this trainer ({error_summary(e)})"
        ) from None
    t.validation = st.get("validation") or t.validation
    return st.get("metrics_row")


def _reconcile_rows(t: Trainer, step: int | None, saved_row: dict[str, Any] | None) -> None:
    """Each step's rows exactly once: drop what was logged after the checkpoint, and log the
    checkpoint's own step again if the run was killed before its row was written."""
    note = reconcile_rows(t.run_dir, step)
    if note:
        t.print(note)
    if step and saved_row is not None and not has_row(t.run_dir / "metrics.jsonl", step):
        replay(t.trackers, saved_row, step)
