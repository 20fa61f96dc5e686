"""One run per run directory: an exclusive lock, a finished-run marker, the config a resume
must agree with, and per-step rows that hold each step exactly once.

* ``dapo.lock``: ``dapo train`` holds an exclusive ``flock`` on it while it runs (the pid is
  written inside for the refusal message). The kernel drops the lock when the process dies,
  however it dies, so a crashed run never leaves a stale lock behind.
* ``finished.json``: written when a run trains its last step; the same command run again says
  the run is finished and changes nothing.
* A checkpoint's trainer state holds the resolved config it was trained with; a resume whose
  config differs in a key that changes training stops and names the keys, unless
  ``trainer.resume_allow_config_change=true``. Keys that only say how the run is logged,
  saved, placed or batched in memory (:data:`FREE_KEYS`) may differ freely.
* ``metrics.jsonl`` / ``groups.jsonl``: on every start the rows of steps after the checkpoint
  resumed from (all rows when there is none) are dropped, so the steps trained again are
  logged once.
"""

from __future__ import annotations

import errno
import fcntl
import fnmatch
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dapo.atomic import replacing, write_text
from dapo.errors import DapoError

LOCK_FILE = "dapo.lock"
FINISHED_FILE = "finished.json"
ROW_FILES = ("metrics.jsonl", "groups.jsonl")
# the way on after a file could not be written at the end of a run
RERUN = (
    "run the same command again (it resumes from the last checkpoint, or trains again when "
    "trainer.save_freq=-1 saved none)"
)
_ROWS_THEN = "No row was changed; run the same command again"

# keys a resume may change: how the run is logged, saved, validated, placed and micro-batched;
# none of them changes what an optimizer step computes (micro-batching and placement change
# only the order of floating-point sums)
FREE_KEYS = (
    "trainer.total_epochs",
    "trainer.total_training_steps",
    # resolved from trainer.total_training_steps
    "actor_rollout_ref.actor.optim.total_training_steps",
    "trainer.project_name",
    "trainer.experiment_name",
    "trainer.logger",
    "trainer.log_val_generations",
    "trainer.rollout_data_dir",
    "trainer.validation_data_dir",
    "trainer.save_freq",
    "trainer.test_freq",
    "trainer.resume_mode",
    "trainer.resume_from_path",
    "trainer.resume_allow_config_change",
    "trainer.val_before_train",
    "trainer.val_only",
    "trainer.default_local_dir",
    "trainer.max_actor_ckpt_to_keep",
    "trainer.worker_backend",
    "trainer.device",
    "trainer.nnodes",
    "trainer.n_gpus_per_node",
    "trainer.balance_batch",
    "trainer.torch_threads",
    "trainer.profile_steps",
    "trainer.report_freq",
    "trainer.save_final_model",
    "data.val_files",
    "data.val_batch_size",
    "data.val_max_samples",
    "data.validation_shuffle",
    "data.dataloader_num_workers",
    "actor_rollout_ref.rollout.val_kwargs.*",
    "actor_rollout_ref.*micro_batch_size*",
    "actor_rollout_ref.*max_token_len_per_gpu",
    "actor_rollout_ref.*use_dynamic_bsz",
    "actor_rollout_ref.*fsdp_config.param_offload",
    "actor_rollout_ref.*fsdp_config.optimizer_offload",
    "actor_rollout_ref.model.enable_gradient_checkpointing",
    "actor_rollout_ref.rollout.gpu_memory_utilization",
    "actor_rollout_ref.rollout.placement",
    "actor_rollout_ref.rollout.weight_transfer",
    "actor_rollout_ref.rollout.cpu_kvcache_space_gb",
    "actor_rollout_ref.rollout.server_startup_timeout_s",
    "trainer.auto_budget.*",
    "reward_model.scoring.num_workers",
)
# the run's length: free on a resume (extending a run), but a finished run of another length
# is not the same run
LENGTH_KEYS = (
    "trainer.total_epochs",
    "trainer.total_training_steps",
    "actor_rollout_ref.actor.optim.total_training_steps",
)


class RunDirError(DapoError, RuntimeError):
    """The run directory cannot be used as asked; the message says why and what to do."""


class RunFinished(Exception):
    """The run in this directory has already trained every step of this command."""


def run_dir_of(cfg: Any) -> Path:
    """The run directory of a resolved config (``trainer.default_local_dir``)."""
    return Path(cfg.trainer.default_local_dir).expanduser()


# ------------------------------------------------------------------------------------ the lock


class RunLock:
    """An exclusive ``flock`` on ``<run_dir>/dapo.lock`` for as long as it is held.

    The lock belongs to the open file, so the kernel releases it when the process exits or is
    killed; the pid inside is only for the message another run prints when it is refused, and is
    cleared on release, so a command that is refused or finds the run finished leaves the file as
    it found it. A lock file the lock created in a directory nothing else was written to (a
    command that stopped on its config) is removed again on release, and so is the directory
    when the lock created that too.
    """

    def __init__(self, run_dir: str | os.PathLike):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self._fd: int | None = None
        self._created: list[Path] = []
        self._before: frozenset[str] | None = None

    def acquire(self) -> RunLock:
        try:
            return self._acquire()
        except OSError as e:
            # a path that is a file, under /proc, unwritable, or a lock file that is a directory
            raise RunDirError(
                f"trainer.default_local_dir={self.run_dir}: cannot take the run directory's lock "
                f"{self.path} ({e.strerror or e}); set trainer.default_local_dir to a directory you can "
                "write, or remove what stands at that path"
            ) from None

    def _acquire(self) -> RunLock:
        self._created = [p for p in (self.run_dir, *self.run_dir.parents) if not p.exists()]
        # what was there before: a lock file this command made is removed again when the command
        # wrote nothing else (a refused command leaves a directory of the user's as it was)
        self._before = None if self.path.exists() else _names(self.run_dir)
        while True:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except FileNotFoundError:
                continue  # removed by a holder that had made it and wrote nothing else
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(fd)
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
                raise RunDirError(_in_use(self.run_dir, _read_pid(self.path))) from None
            if _same_file(fd, self.path):
                break
            # the holder removed the file (and the directory it made) before we locked it: a lock
            # on that unlinked file guards nothing, so lock the one at the path now
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        if self._before is not None and _names(self.run_dir) == self._before | {LOCK_FILE}:
            # still locked: whoever opened the file meanwhile sees it unlinked once locked, and retries
            self.path.unlink()
            for d in self._created:
                try:
                    d.rmdir()
                except OSError:
                    break
        else:
            os.ftruncate(self._fd, 0)
        os.close(self._fd)  # closing the only descriptor drops the flock
        self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _in_use(run_dir: Path, holder: int | None) -> str:
    who = f"pid {holder}" if holder is not None else "a process that has not written its pid yet"
    stop = f" (kill -TERM {holder} saves a checkpoint and stops it)" if holder is not None else ""
    return (
        f"run directory {run_dir} is in use by another dapo train ({who}); wait for it to "
        f"finish or stop it{stop}, or set trainer.default_local_dir to another directory"
    )


def _names(run_dir: Path) -> frozenset[str] | None:
    try:
        return frozenset(p.name for p in run_dir.iterdir())
    except FileNotFoundError:
        return frozenset()
    except OSError:
        return None


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = path.stat()
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


# ------------------------------------------------------------------------------------ configs


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists and other values are leaves, an empty
    mapping is a leaf ``{}``."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = dict(v) if isinstance(v, Mapping) else v
    return out


def config_snapshot(cfg: Any) -> dict[str, Any]:
    """The resolved config as a plain nested dict (what a checkpoint and finished.json keep)."""
    import dataclasses

    from omegaconf import OmegaConf

    # the trainer holds the schema's dataclasses, the command line the resolved DictConfig
    tree = (
        dataclasses.asdict(cfg)
        if dataclasses.is_dataclass(cfg)
        else OmegaConf.to_container(cfg, resolve=True)
    )
    return json.loads(json.dumps(tree, default=str))


def _is_free(key: str, free: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(key, pat) for pat in free)


_MISSING = object()


def config_differences(
    old: Mapping[str, Any], new: Mapping[str, Any], free: tuple[str, ...] = FREE_KEYS
) -> list[tuple[str, Any, Any]]:
    """``(key, old value, new value)`` of every leaf that differs outside ``free`` (a key one
    side lacks shows as the string ``"(absent)"`` on that side)."""
    a, b = flatten(old), flatten(new)
    out = []
    for key in sorted(set(a) | set(b)):
        if _is_free(key, free):
            continue
        va, vb = a.get(key, _MISSING), b.get(key, _MISSING)
        if va != vb:
            out.append((key, "(absent)" if va is _MISSING else va, "(absent)" if vb is _MISSING else vb))
    return out


def describe_differences(diffs: list[tuple[str, Any, Any]], limit: int = 6) -> str:
    parts = [f"{k} ({old!r} then, {new!r} now)" for k, old, new in diffs[:limit]]
    if len(diffs) > limit:
        parts.append(f"and {len(diffs) - limit} more")
    return ", ".join(parts)


def check_resume_config(
    checkpoint: Path, saved: Mapping[str, Any] | None, cfg: Any, free: tuple[str, ...] = FREE_KEYS
) -> str | None:
    """Stop a resume whose config changes training (names the keys outside ``free``); with
    ``trainer.resume_allow_config_change=true`` return a warning line instead. None when the
    configs agree or the checkpoint predates saving its config."""
    if not saved:
        return None
    diffs = config_differences(saved, config_snapshot(cfg), free)
    if not diffs:
        return None
    what = describe_differences(diffs)
    if cfg.trainer.resume_allow_config_change:
        return (
            f"warning: resuming from {checkpoint} with a config that changes training "
            f"(trainer.resume_allow_config_change=true): {what}"
        )
    raise RunDirError(
        f"{checkpoint} was trained with another config, and these keys change training: {what}. "
        "Run with the checkpoint's values to resume, set trainer.default_local_dir to a new directory "
        "to start a new run, or set trainer.resume_allow_config_change=true to go on with the new values"
    )


# ------------------------------------------------------------------------------------ finished runs


def read_finished(run_dir: Path) -> dict[str, Any] | None:
    try:
        d = json.loads((Path(run_dir) / FINISHED_FILE).read_text())
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) and isinstance(d.get("config"), dict) else None


def mark_finished(run_dir: Path, cfg: Any, steps: int) -> None:
    """Record that this config's run trained all ``steps`` (written atomically; a failed write
    leaves no file and raises :class:`dapo.atomic.WriteError` saying what to do)."""
    write_text(
        Path(run_dir) / FINISHED_FILE,
        json.dumps({"steps": int(steps), "config": config_snapshot(cfg)}, indent=1) + "\n",
        then=f"The run trained to its last step ({int(steps)}) and wrote its summary; to record it as "
        f"finished, {RERUN}",
    )


def clear_finished(run_dir: Path) -> None:
    """A run that starts training again is not finished until it ends."""
    try:
        (Path(run_dir) / FINISHED_FILE).unlink()
    except FileNotFoundError:
        pass


def check_finished(run_dir: Path, cfg: Any, has_checkpoint: bool) -> None:
    """Before a ``dapo train``: raise :class:`RunFinished` when ``run_dir`` holds a finished run
    of this same command, or :class:`RunDirError` when it holds a finished run of another
    command with no checkpoint to continue from (starting over would overwrite it)."""
    done = read_finished(run_dir)
    if done is None or cfg.trainer.resume_mode == "disable":
        return
    free = tuple(k for k in FREE_KEYS if k not in LENGTH_KEYS)
    diffs = config_differences(done["config"], config_snapshot(cfg), free)
    if not diffs:
        raise RunFinished(
            f"run directory {run_dir} holds this run, finished after {done.get('steps')} steps; nothing to "
            "do. Raise trainer.total_training_steps to train further, or set trainer.default_local_dir "
            "to a new directory to train again"
        )
    if not has_checkpoint:
        raise RunDirError(
            f"run directory {run_dir} holds a finished {done.get('steps')}-step run that saved no checkpoint "
            f"to continue from (trainer.save_freq=-1), and this command differs in {describe_differences(diffs)}; "
            "set trainer.default_local_dir to a new directory, or delete this one to start over"
        )


# ------------------------------------------------------------------------------------ rows


def keep_rows_through(path: Path, step: int | None) -> list[int]:
    """Keep the rows of ``path`` (JSON lines with a ``step``) whose step is at most ``step``
    (none when ``step`` is None), one per step (the last), in file order; drop torn lines.
    Rewrites the file atomically when anything changes; returns the dropped rows' steps."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    except FileNotFoundError:
        return []
    rows: list[tuple[int | None, str]] = []
    for line in lines:
        try:
            s = int(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError):
            s = None  # a line torn by a kill mid-write, or not a row
        rows.append((s, line if line.endswith("\n") else line + "\n"))
    last = {s: i for i, (s, _) in enumerate(rows) if s is not None}
    kept = [
        line
        for i, (s, line) in enumerate(rows)
        if s is not None and step is not None and s <= step and last[s] == i
    ]
    dropped = sorted({s for s, _ in rows if s is not None and (step is None or s > step)})
    if len(kept) == len(lines) and all(a == b for a, b in zip(kept, lines, strict=True)):
        return []
    with replacing(path, fsync=True, then=_ROWS_THEN) as f:
        f.writelines(kept)
    return dropped


def has_row(path: Path, step: int) -> bool:
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    if int(json.loads(line)["step"]) == step:
                        return True
                except (ValueError, KeyError, TypeError):
                    continue
    except FileNotFoundError:
        pass
    return False


def reconcile_rows(run_dir: Path, step: int | None) -> str | None:
    """Drop the rows logged after ``step`` (the checkpoint resumed from; None for a start from
    scratch) from metrics.jsonl and groups.jsonl; returns a line saying what was dropped."""
    dropped: set[int] = set()
    names = []
    for name in ROW_FILES:
        d = keep_rows_through(Path(run_dir) / name, step)
        if d:
            dropped.update(d)
            names.append(name)
    if not dropped:
        return None
    steps = _span(sorted(dropped))
    if step is None:
        return (
            f"no checkpoint in {run_dir}: training from the start, and the rows an earlier attempt "
            f"logged in {' and '.join(names)} (steps {steps}) are dropped so no step is logged twice"
        )
    return (
        f"dropped the rows of steps {steps} from {' and '.join(names)}: they were logged after the "
        f"checkpoint of step {step} and are logged again as those steps are trained again"
    )


def _span(steps: list[int]) -> str:
    return str(steps[0]) if len(steps) == 1 else f"{steps[0]}-{steps[-1]}"
