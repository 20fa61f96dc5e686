"""A :class:`~dapo.batch.Batch` as plain data and back, for checkpoints (the pool's carried groups,
a prefetched step): tensors stay tensors, which a checkpoint stores in a binary file; non-tensor
columns become lists of plain values."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from dapo.batch import Batch


def plain(v: Any) -> Any:
    """A numpy scalar as the Python value it holds; anything else unchanged."""
    if isinstance(v, np.generic):
        return v.item()
    return v


def batch_to_state(b: Batch) -> dict[str, Any]:
    """A Batch as plain data: tensors stay tensors (checkpoints store them in a binary file),
    non-tensor columns become lists."""
    return {
        "tensors": {k: t.detach().cpu() for k, t in b.tensors.items()},
        "non_tensors": {k: [plain(x) for x in v.tolist()] for k, v in b.non_tensors.items()},
    }


def batch_from_state(d: dict[str, Any]) -> Batch:
    tensors = {k: _tensor_from_state(t) for k, t in d["tensors"].items()}
    return Batch(tensors=tensors, non_tensors={k: list(v) for k, v in d["non_tensors"].items()})


def _tensor_from_state(t: Any) -> torch.Tensor:
    if isinstance(t, torch.Tensor):
        return t
    # the earlier JSON form: {"dtype", "shape", "data"}
    return torch.tensor(t["data"], dtype=getattr(torch, t["dtype"])).reshape(t["shape"])
