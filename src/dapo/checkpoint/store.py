"""Atomic, verified checkpoints and exact resume.

Layout of one checkpoint (``<run_dir>/global_step_<N>/``)::

    actor/huggingface/     the model and tokenizer, Hugging Face format (``from_pretrained`` loads it)
    actor/optimizer.pt     optimizer state_dict
    actor/scheduler.pt     LR scheduler state_dict
    actor/dcp/             the worker ranks' model and optimizer shards (only with several ranks)
    rng_state.pt           python, numpy, torch CPU (and CUDA) RNG states + every torch.Generator
                           found in the trainer state
    trainer_state.json     the JSON-able trainer state (global step, sampler position, batcher
                           state with its carried-over pool, KL coefficient, ...)
    dapo_checkpoint.json   the manifest, written last: step, format, every file's size and sha256

A checkpoint is written into a hidden temporary directory next to its final place, flushed, and
renamed onto ``global_step_<N>`` in one ``os.rename``; ``latest_checkpointed_iteration.txt``
(verl's name, holding ``N``) is then replaced atomically. A directory without a manifest was cut
off and is never resumed from. Resume verifies the whole checkpoint against its manifest
(:mod:`dapo.checkpoint.manifest`) and never unpickles anything but plain data: ``.pt`` files go
through ``torch.load(weights_only=True)``, DCP metadata through a restricted unpickler
(:mod:`dapo.checkpoint.dcp`). In ``trainer.resume_mode=auto`` a damaged checkpoint is skipped,
with a warning naming the file, for the newest earlier one that is whole. Before writing, the
free space is checked against an estimate (:mod:`dapo.checkpoint.space`).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import torch

from dapo.atomic import WriteError, write_text
from dapo.checkpoint import space as checkpoint_space
from dapo.checkpoint.manifest import (
    FORMAT_VERSION,
    MANIFEST,
    CheckpointError,
    Manifest,
    check_complete,
    error_summary,
    read_manifest,
    verify,
    write_manifest,
)
from dapo.checkpoint.space import DiskFullError

__all__ = [
    "CKPT_PREFIX",
    "FORMAT_VERSION",
    "HF_SUBDIR",
    "LATEST_FILE",
    "MANIFEST",
    "RESUME_MODES",
    "CheckpointError",
    "DiskFullError",
    "checkpoint_dir",
    "checkpoint_step",
    "find_resume_checkpoint",
    "hf_model_dir",
    "is_complete",
    "list_checkpoints",
    "load_checkpoint",
    "load_model_weights",
    "prune_checkpoints",
    "read_latest",
    "resume_checkpoint",
    "save_checkpoint",
    "save_model_dir",
    "verify_checkpoint",
]

CKPT_PREFIX = "global_step_"
LATEST_FILE = "latest_checkpointed_iteration.txt"
HF_SUBDIR = Path("actor") / "huggingface"
DCP_SUBDIR = Path("actor") / "dcp"
RESUME_MODES = ("auto", "disable", "resume_path")

_STEP_RE = re.compile(rf"^{CKPT_PREFIX}(\d+)$")
_GEN_TAG = "__torch_generator__"
_TENSOR_TAG = "__torch_tensor__"
TENSORS_FILE = "trainer_tensors.pt"

Warn = Callable[[str], None]

RESUME_HINT = "The checkpoints are complete; run the same command again to resume from the newest"


def _warn(msg: str) -> None:
    warnings.warn(msg, UserWarning, stacklevel=3)


# ------------------------------------------------------------------------------------ paths


def checkpoint_dir(run_dir: str | os.PathLike, step: int) -> Path:
    return Path(run_dir) / f"{CKPT_PREFIX}{int(step)}"


def checkpoint_step(path: str | os.PathLike) -> int | None:
    """``N`` for a path named ``global_step_N``, else None."""
    m = _STEP_RE.match(Path(path).name)
    return int(m.group(1)) if m else None


def hf_model_dir(path: str | os.PathLike) -> Path:
    """The Hugging Face model directory inside a checkpoint (or ``path`` itself if it is one)."""
    p = Path(path)
    if (p / "config.json").exists():
        return p
    return p / HF_SUBDIR


def is_complete(path: str | os.PathLike) -> bool:
    """True when ``path`` holds a manifest whose every listed file exists with its listed size
    (a cheap test: :func:`verify_checkpoint` also checks hashes, unlisted files and the step)."""
    return check_complete(Path(path)) is None


def list_checkpoints(run_dir: str | os.PathLike, complete_only: bool = True) -> list[tuple[int, Path]]:
    """``(step, path)`` of the ``global_step_N`` directories in ``run_dir``, by step."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    out = []
    for p in run_dir.iterdir():
        step = checkpoint_step(p)
        if step is None or not p.is_dir():
            continue
        if complete_only and check_complete(p) is not None:
            continue
        out.append((step, p))
    return sorted(out)


def read_latest(run_dir: str | os.PathLike) -> int | None:
    """The step in ``latest_checkpointed_iteration.txt``, or None when absent or unreadable."""
    f = Path(run_dir) / LATEST_FILE
    try:
        return int(f.read_text().strip())
    except (OSError, ValueError):
        return None


# ------------------------------------------------------------------------------------ save


def save_checkpoint(
    run_dir: str | os.PathLike,
    step: int,
    *,
    model: torch.nn.Module,
    tokenizer: Any = None,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    trainer_state: Mapping[str, Any] | None = None,
    max_to_keep: int | None = None,
    fsync: bool = True,
    extra_writer: Any = None,
    weights_writer: Callable[[Path], Any] | None = None,
    log: Warn | None = None,
) -> Path:
    """Write ``<run_dir>/global_step_<step>/`` atomically, then ``latest_checkpointed_iteration.txt``.

    ``trainer_state`` must be JSON-able except for ``torch.Generator`` values (at any depth),
    whose states go to ``rng_state.pt`` and come back as generators from :func:`load_checkpoint`,
    and ``torch.Tensor`` values (e.g. the dynamic-sampling pool's batches), which go to
    ``trainer_tensors.pt`` (binary, not JSON number lists) and come back as tensors.
    ``max_to_keep`` (``trainer.max_actor_ckpt_to_keep``): keep only the newest that many complete
    checkpoints; None or <= 0 keeps all. When the free space is short of the estimate, the older
    ones beyond it are pruned first (never the newest); if it is still short, or the disk fills
    up part-way, :class:`DiskFullError` says so and nothing that looks like a checkpoint is left.
    ``extra_writer(tmp_dir)`` writes more files (sharded worker state) into the checkpoint before
    its manifest. ``weights_writer(hf_dir)``, when given, writes the Hugging Face files in place
    of ``model.save_pretrained`` (a model whose weights live on worker ranks:
    ``dapo.distributed.rank_weights``). ``log`` receives a line per checkpoint pruned for space.
    Returns the directory.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    final = checkpoint_dir(run_dir, step)
    _remove_stale_tmp(run_dir)
    generators: dict[str, torch.Generator] = {}
    tensors: dict[str, torch.Tensor] = {}
    state_json = _extract(dict(trainer_state or {}), generators, tensors, "")
    state_text = json.dumps({"global_step": int(step), **state_json}, default=_json_default)
    done = list_checkpoints(run_dir)
    previous = _manifest_bytes(done[-1][1]) if done else None
    needed = checkpoint_space.estimate_bytes(
        previous, model, optimizer, tensors.values(), sharded_copy=extra_writer is not None
    )
    _ensure_space(run_dir, final, needed, max_to_keep, log)
    with _staging(final, needed, max_to_keep) as tmp:
        hf = tmp / HF_SUBDIR
        hf.mkdir(parents=True)
        _save_pretrained(model, hf, weights_writer)
        if tokenizer is not None:
            tokenizer.save_pretrained(hf)
        if optimizer is not None:
            torch.save(optimizer.state_dict(), tmp / "actor" / "optimizer.pt")
        if scheduler is not None:
            torch.save(scheduler.state_dict(), tmp / "actor" / "scheduler.pt")
        torch.save(_capture_rng(generators), tmp / "rng_state.pt")
        if tensors:
            torch.save(tensors, tmp / TENSORS_FILE)
        (tmp / "trainer_state.json").write_text(state_text)
        if extra_writer is not None:
            extra_writer(tmp)
        if fsync:
            _fsync_tree(tmp)
        write_manifest(tmp, step)  # last, flushed: the directory is complete from here on
        _publish(tmp, final, fsync)
    _write_atomic(run_dir / LATEST_FILE, f"{int(step)}\n", fsync=fsync)
    if max_to_keep is not None and max_to_keep > 0:
        prune_checkpoints(run_dir, max_to_keep, keep=final)
    return final


def _ensure_space(run_dir: Path, final: Path, needed: int, max_to_keep: int | None, log: Warn | None) -> None:
    """Raise DiskFullError unless ``needed`` bytes are free, pruning beyond ``max_to_keep`` first."""
    free = checkpoint_space.free_bytes(run_dir)
    if needed <= free:
        return
    if max_to_keep is not None and max_to_keep > 0:
        # the new checkpoint will be one of the max_to_keep; the newest complete one always stays
        for p in prune_checkpoints(run_dir, max(1, max_to_keep - 1)):
            if log is not None:
                log(f"pruned {p} before saving {final.name}: the disk is short of space")
        free = checkpoint_space.free_bytes(run_dir)
        if needed <= free:
            return
    raise DiskFullError(checkpoint_space.disk_full_message(final, needed, free, max_to_keep))


def _save_pretrained(model: Any, out: Path, weights_writer: Callable[[Path], Any] | None) -> None:
    if weights_writer is not None:
        weights_writer(out)
    else:
        model.save_pretrained(out, safe_serialization=True)


def save_model_dir(
    model_dir: str | os.PathLike,
    model: torch.nn.Module,
    tokenizer: Any = None,
    weights_writer: Callable[[Path], Any] | None = None,
) -> Path:
    """A Hugging Face model directory (``final_model``) written like a checkpoint: space checked
    first, staged beside its place and renamed into it, DiskFullError when the disk is short.
    ``weights_writer`` as for :func:`save_checkpoint`."""
    model_dir = Path(model_dir)
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp(model_dir.parent, model_dir.name)
    needed = checkpoint_space.estimate_bytes(None, model, None)
    free = checkpoint_space.free_bytes(model_dir.parent)
    if needed > free:
        raise DiskFullError(checkpoint_space.disk_full_message(model_dir, needed, free))
    with _staging(model_dir, needed, None) as tmp:
        _save_pretrained(model, tmp, weights_writer)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        _publish(tmp, model_dir, fsync=True)
    return model_dir


@contextmanager
def _staging(final: Path, needed: int, max_to_keep: int | None) -> Iterator[Path]:
    """A fresh hidden directory beside ``final``; on any failure it is removed, and a failure
    for lack of space becomes DiskFullError."""
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        yield tmp
    except BaseException as e:
        free_now = _free_or_none(final.parent) if isinstance(e, Exception) else None
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, Exception) and not isinstance(e, TypeError | CheckpointError):
            if checkpoint_space.is_disk_full(e, free_now):
                raise DiskFullError(
                    checkpoint_space.disk_full_message(final, needed, free_now or 0, max_to_keep)
                ) from e
        raise


def _publish(tmp: Path, final: Path, fsync: bool) -> None:
    """Rename the finished ``tmp`` onto ``final`` (replacing what is there) and flush the parent."""
    if fsync:
        _fsync_dir(tmp)
    if final.exists():  # re-saving a step (or replacing a cut-off directory of that name)
        trash = final.parent / f".{final.name}.old-{os.getpid()}"
        os.rename(final, trash)
        os.rename(tmp, final)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.rename(tmp, final)
    if fsync:
        _fsync_dir(final.parent)


def _free_or_none(path: Path) -> int | None:
    try:
        return checkpoint_space.free_bytes(path)
    except OSError:
        return None


def _manifest_bytes(path: Path) -> int | None:
    try:
        return read_manifest(path).total_bytes
    except CheckpointError:
        return None


def prune_checkpoints(run_dir: str | os.PathLike, max_to_keep: int, keep: Path | None = None) -> list[Path]:
    """Delete all but the newest ``max_to_keep`` complete checkpoints (never ``keep``); returns the deleted."""
    done = list_checkpoints(run_dir)
    doomed = [p for _, p in done[: max(0, len(done) - max_to_keep)] if keep is None or p != keep]
    for p in doomed:
        # rename first so a crash mid-delete never leaves a half-deleted dir under a step name
        trash = p.parent / f".{p.name}.deleting-{os.getpid()}"
        os.rename(p, trash)
        shutil.rmtree(trash, ignore_errors=True)
    return doomed


def _remove_stale_tmp(run_dir: Path, prefix: str = CKPT_PREFIX) -> None:
    """Remove what interrupted saves left behind (hidden ``.<prefix>*.tmp-<pid>`` and the like)."""
    for p in run_dir.glob(f".{prefix}*"):
        if p.is_dir() and re.search(r"\.(tmp|old|deleting)-\d+$", p.name):
            shutil.rmtree(p, ignore_errors=True)


def _write_atomic(path: Path, text: str, fsync: bool = True) -> None:
    """``text`` as ``path`` in one rename; a failed write leaves no temporary file and raises
    CheckpointError naming the file (the checkpoints themselves are whole either way)."""
    try:
        write_text(path, text, fsync=fsync, then=RESUME_HINT)
    except WriteError as e:
        raise CheckpointError(str(e)) from e
    if fsync:
        _fsync_dir(path.parent)


def _fsync_tree(root: Path) -> None:
    for p in root.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    for d in [root, *[p for p in root.rglob("*") if p.is_dir()]]:
        _fsync_dir(d)


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _json_default(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        return v.item()
    raise TypeError(f"trainer_state holds a {type(v).__name__}, which is not JSON-able")


def _extract(obj: Any, gens: dict[str, torch.Generator], tensors: dict[str, torch.Tensor], path: str) -> Any:
    """``obj`` with generators and tensors replaced by tags naming where they were taken from."""
    if isinstance(obj, torch.Generator):
        gens[path] = obj
        return {_GEN_TAG: path}
    if isinstance(obj, torch.Tensor):
        tensors[path] = obj.detach().cpu()
        return {_TENSOR_TAG: path}
    if isinstance(obj, Mapping):
        return {k: _extract(v, gens, tensors, f"{path}/{k}") for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_extract(v, gens, tensors, f"{path}/{i}") for i, v in enumerate(obj)]
    return obj


def _capture_rng(generators: Mapping[str, torch.Generator]) -> dict[str, Any]:
    st = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "name": st[0],
            "keys": torch.from_numpy(np.asarray(st[1], dtype=np.int64)),
            "pos": int(st[2]),
            "has_gauss": int(st[3]),
            "cached_gaussian": float(st[4]),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "generators": {k: {"device": str(g.device), "state": g.get_state()} for k, g in generators.items()},
    }
    return state


# ------------------------------------------------------------------------------------ resume


def resume_checkpoint(
    run_dir: str | os.PathLike,
    resume_mode: str,
    resume_from_path: str | None,
    load: Callable[[Path], Any],
    warn: Warn = _warn,
) -> Path | None:
    """Resume (``trainer.resume_mode`` / ``trainer.resume_from_path``): call ``load(path)`` on the
    checkpoint to continue from and return that path, or None for a fresh start.

    * ``disable``: None.
    * ``resume_path``: ``resume_from_path`` (a ``global_step_N`` directory); a CheckpointError
      from ``load`` stops the run.
    * ``auto``: the ``global_step_N`` directories of ``run_dir``, newest first, until one loads;
      each that raises CheckpointError is skipped with a warning naming the file and why. None
      only when ``run_dir`` has no checkpoint at all; when it has some and none loads, a
      CheckpointError says so (a damaged run is never silently restarted from step 0).
    """
    if resume_mode not in RESUME_MODES:
        raise CheckpointError(f"trainer.resume_mode={resume_mode!r} is not one of {', '.join(RESUME_MODES)}")
    if resume_mode == "disable":
        return None
    if resume_mode == "resume_path":
        if not resume_from_path:
            raise CheckpointError(
                "trainer.resume_mode=resume_path needs trainer.resume_from_path (a global_step_N directory)"
            )
        p = Path(resume_from_path).expanduser()
        try:
            load(p)
        except CheckpointError as e:
            raise CheckpointError(f"trainer.resume_from_path: {e}") from None
        return p
    run_dir = Path(run_dir)
    candidates = sorted(list_checkpoints(run_dir, complete_only=False), reverse=True)
    latest = read_latest(run_dir)
    if latest is not None and not any(s == latest for s, _ in candidates):
        if not candidates:
            raise CheckpointError(
                f"{run_dir / LATEST_FILE} names step {latest}, but {run_dir} holds no global_step_N "
                "checkpoint; put it back, or set trainer.resume_mode=disable to start from step 0"
            )
        warn(f"{run_dir / LATEST_FILE} names step {latest}, which has no checkpoint directory")
    failures: list[str] = []
    for _, p in candidates:
        try:
            load(p)
        except CheckpointError as e:
            failures.append(str(e))
            warn(f"skipping checkpoint {p.name}: {e}")
            continue
        return p
    if not failures:
        return None
    more = f" (and {len(failures) - 1} older checkpoint(s), see the warnings)" if len(failures) > 1 else ""
    raise CheckpointError(
        f"no usable checkpoint in {run_dir}: {failures[0]}{more}. Repair or remove the damaged "
        "checkpoints, or set trainer.resume_mode=disable to start from step 0"
    )


def find_resume_checkpoint(
    run_dir: str | os.PathLike,
    resume_mode: str = "auto",
    resume_from_path: str | None = None,
    warn: Warn = _warn,
) -> Path | None:
    """The checkpoint :func:`resume_checkpoint` would continue from, checked with
    :func:`verify_checkpoint` (no state is loaded), or None for a fresh start."""
    return resume_checkpoint(
        run_dir, resume_mode, resume_from_path, lambda p: verify_checkpoint(p, warn=lambda m: None), warn
    )


def verify_checkpoint(path: str | os.PathLike, warn: Warn = _warn) -> Manifest:
    """Check ``path`` against its manifest (:func:`dapo.checkpoint.manifest.verify`) and its DCP
    metadata, if any, with the restricted reader; CheckpointError naming the file that fails.
    A checkpoint of the earlier manifest format (sizes, no hashes) passes with a warning."""
    path = Path(path)
    m = verify(path)
    if not m.hashed:
        warn(
            f"{path / MANIFEST}: written by an earlier dapo (manifest format {m.format}: names and "
            "sizes, no hashes); its contents are not verified"
        )
    dcp_dir = path / DCP_SUBDIR
    if dcp_dir.exists():
        from dapo.checkpoint.dcp import read_metadata

        read_metadata(dcp_dir / ".metadata")
    return m


def load_checkpoint(
    path: str | os.PathLike,
    model: torch.nn.Module | None,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    *,
    generators: Mapping[str, torch.Generator] | None = None,
    restore_rng: bool = True,
    warn: Warn = _warn,
) -> dict[str, Any]:
    """Verify ``path`` (:func:`verify_checkpoint`), then restore weights, optimizer, scheduler and
    RNG states from it; return the trainer state. ``model`` None: the weights are left to the
    caller (worker ranks load their shards from ``actor/dcp``). Any file that cannot be read or does not fit
    raises CheckpointError naming it.

    Generators saved from the trainer state come back in the returned dict as new
    ``torch.Generator`` objects; when ``generators`` maps the same keys (e.g.
    ``{"rollout_generator": rollout.generator}``) their states are also set in place.
    """
    path = Path(path)
    verify_checkpoint(path, warn)
    if model is not None:
        load_model_weights(model, path / HF_SUBDIR)
    if optimizer is not None:
        f = path / "actor" / "optimizer.pt"
        if not f.exists():
            raise CheckpointError(f"{f}: missing (the checkpoint has no optimizer state)")
        with _reading(f):
            optimizer.load_state_dict(_torch_load(f))
    if scheduler is not None:
        f = path / "actor" / "scheduler.pt"
        if not f.exists():
            raise CheckpointError(f"{f}: missing (the checkpoint has no scheduler state)")
        with _reading(f):
            scheduler.load_state_dict(_torch_load(f))
    f = path / "rng_state.pt"
    with _reading(f):
        rng = _torch_load(f)
        if restore_rng:
            _restore_rng(rng)
        restored: dict[str, torch.Generator] = {}
        for key, g in rng["generators"].items():
            gen = torch.Generator(device=g["device"]) if _device_ok(g["device"]) else torch.Generator()
            gen.set_state(g["state"])
            restored[key] = gen
    f = path / "trainer_state.json"
    with _reading(f):
        state = json.loads(f.read_text())
    tfile = path / TENSORS_FILE
    with _reading(tfile):
        tensors = _torch_load(tfile) if tfile.exists() else {}
    with _reading(path / "trainer_state.json"):
        state = _insert(state, restored, tensors)
    for key, live in (generators or {}).items():
        k = key if key.startswith("/") else f"/{key}"
        if k not in restored:
            raise CheckpointError(f"{path / 'rng_state.pt'}: no state for generator {key!r}")
        live.set_state(restored[k].get_state())
    return state


def _torch_load(f: Path) -> Any:
    # plain data only: a checkpoint is input from whoever wrote it, never code
    return torch.load(f, map_location="cpu", weights_only=True)


@contextmanager
def _reading(f: Path) -> Iterator[None]:
    """Turn any failure while reading or applying ``f`` into one CheckpointError naming it."""
    try:
        yield
    except CheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 - safetensors, pickle, JSON, shape and key errors alike
        raise CheckpointError(f"{f}: unreadable or does not fit ({error_summary(e)})") from None


def _device_ok(device: str) -> bool:
    return device == "cpu" or (device.startswith("cuda") and torch.cuda.is_available())


def _insert(obj: Any, gens: Mapping[str, torch.Generator], tensors: Mapping[str, torch.Tensor]) -> Any:
    if isinstance(obj, dict):
        if set(obj) == {_GEN_TAG}:
            return gens[obj[_GEN_TAG]]
        if set(obj) == {_TENSOR_TAG}:
            return tensors[obj[_TENSOR_TAG]]
        return {k: _insert(v, gens, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_insert(v, gens, tensors) for v in obj]
    return obj


def _restore_rng(rng: Mapping[str, Any]) -> None:
    random.setstate(_tuplify(rng["python"]))
    n = rng["numpy"]
    np.random.set_state(
        (n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )
    torch.set_rng_state(rng["torch"])
    if rng.get("cuda") is not None and torch.cuda.is_available():
        cuda = rng["cuda"]
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
        else:
            warnings.warn(
                f"checkpoint has CUDA RNG states for {len(cuda)} devices, this machine has "
                f"{torch.cuda.device_count()}; CUDA RNG not restored",
                stacklevel=3,
            )


def _tuplify(x: Any) -> Any:
    return tuple(_tuplify(v) for v in x) if isinstance(x, list | tuple) else x


def load_model_weights(model: torch.nn.Module, hf_dir: str | os.PathLike) -> None:
    """Copy the safetensors weights in ``hf_dir`` into ``model`` in place (bitwise; tied weights allowed)."""
    from safetensors.torch import load_file

    hf_dir = Path(hf_dir)
    index = hf_dir / "model.safetensors.index.json"
    if index.exists():
        with _reading(index):
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        for s in shards:
            if not isinstance(s, str) or PurePosixPath(s).name != s or s in ("", ".", ".."):
                raise CheckpointError(f"{index}: names shard {s!r}, which is not a file beside it")
        files = [hf_dir / s for s in shards]
    else:
        files = [hf_dir / "model.safetensors"]
    missing_files = [str(f) for f in files if not f.exists()]
    if missing_files:
        raise CheckpointError(f"model weights not found: {', '.join(missing_files)}")
    sd: dict[str, torch.Tensor] = {}
    for f in files:
        with _reading(f):
            sd.update(load_file(str(f), device="cpu"))
    with _reading(files[0]):
        result = model.load_state_dict(sd, strict=False)
    if result.unexpected_keys:
        raise CheckpointError(f"{hf_dir}: weights not in the model: {result.unexpected_keys[:5]}")
    if result.missing_keys:
        # a missing key is fine only when it is tied to (shares storage with) a loaded one
        params = dict(model.named_parameters(remove_duplicate=False))
        loaded_ptrs = {params[k].data_ptr() for k in sd if k in params}
        untied = [
            k for k in result.missing_keys if k not in params or params[k].data_ptr() not in loaded_ptrs
        ]
        if untied:
            raise CheckpointError(f"{hf_dir}: the checkpoint lacks weights {untied[:5]}")
