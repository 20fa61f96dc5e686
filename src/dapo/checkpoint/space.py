"""Disk space for a checkpoint: an estimate checked before writing, and one clear error when short.

The estimate is the size of the newest complete checkpoint when there is one (the next is the
same size to within its JSON), else the bytes of the model's tensors and the optimizer's state.
A save that still runs out of space part-way (another writer filled the disk, the estimate was
low) is reported the same way; its partial files are removed by the caller.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from dapo.checkpoint.manifest import CheckpointError

# JSON, tokenizer files and per-file container overhead on top of the raw tensor bytes
_FIXED_OVERHEAD = 1 << 20
_PER_TENSOR_OVERHEAD = 1024
# a failed write with less than this left is taken as the disk having filled up
_NEARLY_FULL = 16 << 20


class DiskFullError(CheckpointError):
    """Not enough free space for a checkpoint; the message names the path, the bytes and the keys."""


def free_bytes(path: str | os.PathLike) -> int:
    """Bytes an unprivileged writer can still use on the filesystem holding ``path``."""
    return shutil.disk_usage(path).free


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> tuple[int, int]:
    """``(bytes, count)`` of distinct tensors (tied weights counted once)."""
    seen: set[tuple[int, int]] = set()
    total = count = 0
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            continue
        key = (t.untyped_storage().data_ptr(), t.storage_offset()) if t.device.type != "meta" else (id(t), 0)
        if key in seen:
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
        count += 1
    return total, count


def estimate_bytes(
    previous_bytes: int | None,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    extra_tensors: Iterable[torch.Tensor] = (),
    sharded_copy: bool = False,
) -> int:
    """Bytes one checkpoint will take: ``previous_bytes`` (the last complete one's size) when
    known, else model + optimizer state + extra tensors (twice model + optimizer when the worker
    ranks also write their shards)."""
    if previous_bytes:
        return int(previous_bytes) + _FIXED_OVERHEAD
    # keep_vars: the parameters themselves, so a tied pair on the meta device (a layout) is one tensor
    tensors: list[torch.Tensor] = list(model.state_dict(keep_vars=True).values())
    if optimizer is not None:
        for st in optimizer.state.values():
            tensors += [v for v in st.values() if isinstance(v, torch.Tensor)]
    total, count = tensor_bytes(tensors)
    if sharded_copy:
        total, count = 2 * total, 2 * count
    extra, n_extra = tensor_bytes(extra_tensors)
    return total + extra + (count + n_extra) * _PER_TENSOR_OVERHEAD + _FIXED_OVERHEAD


def is_disk_full(e: BaseException, free_now: int | None) -> bool:
    """True when a failed write failed for lack of space (the libraries word it differently)."""
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(e)
    if "No space left on device" in text or "os error 28" in text or "Disk quota exceeded" in text:
        return True
    return free_now is not None and free_now < _NEARLY_FULL


def disk_full_message(target: Path, needed: int, free: int, max_to_keep: Any = None) -> str:
    keep = (
        f"trainer.max_actor_ckpt_to_keep (now {max_to_keep}) lower"
        if max_to_keep
        else "trainer.max_actor_ckpt_to_keep=N to keep only the newest N checkpoints (older ones are "
        "pruned before a save when space is short)"
    )
    return (
        f"not enough disk space to save {target}: it needs about {needed:,} bytes ({_mib(needed)}), "
        f"{free:,} bytes ({_mib(free)}) are free there. Free space on that disk, or set {keep}, "
        "a larger trainer.save_freq (save less often), or trainer.default_local_dir on a larger disk; "
        "the last complete checkpoint is intact, run the same command to resume from it"
    )


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"
