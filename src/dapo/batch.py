"""The batch container: per-trajectory tensors plus per-trajectory Python objects.

Every tensor and every non-tensor column has the number of trajectories as its first
dimension. Trajectories of one prompt (a group) share a ``uid`` and sit next to each
other (verl's ``repeat(n, interleave=True)`` order).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch


@dataclass
class Batch:
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    non_tensors: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.non_tensors = {k: _as_object_array(v) for k, v in self.non_tensors.items()}
        sizes = {k: int(v.shape[0]) for k, v in self.tensors.items()}
        sizes.update({k: len(v) for k, v in self.non_tensors.items()})
        if len(set(sizes.values())) > 1:
            raise ValueError(f"batch columns disagree on the number of rows: {sizes}")

    def __len__(self) -> int:
        for v in self.tensors.values():
            return int(v.shape[0])
        for v in self.non_tensors.values():
            return len(v)
        return 0

    def __contains__(self, key: str) -> bool:
        return key in self.tensors or key in self.non_tensors

    def __getitem__(self, key: str) -> Any:
        if key in self.tensors:
            return self.tensors[key]
        return self.non_tensors[key]

    def __setitem__(self, key: str, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            self.tensors[key] = value
        else:
            self.non_tensors[key] = _as_object_array(value)

    def select(self, indices: Sequence[int] | np.ndarray | torch.Tensor) -> Batch:
        """Rows at ``indices``, in that order."""
        idx = torch.as_tensor(np.asarray(indices, dtype=np.int64))
        np_idx = idx.numpy()
        return Batch(
            tensors={k: v.index_select(0, idx.to(v.device)) for k, v in self.tensors.items()},
            non_tensors={k: v[np_idx] for k, v in self.non_tensors.items()},
            meta=dict(self.meta),
        )

    def to(self, device: torch.device | str) -> Batch:
        """The same rows with every tensor on ``device`` (this batch itself when all are there)."""
        device = torch.device(device)
        if all(v.device == device for v in self.tensors.values()):
            return self
        return Batch({k: v.to(device) for k, v in self.tensors.items()}, self.non_tensors, dict(self.meta))

    def slice(self, start: int, stop: int) -> Batch:
        return self.select(np.arange(start, min(stop, len(self))))

    @staticmethod
    def concat(batches: Sequence[Batch]) -> Batch:
        batches = [b for b in batches if len(b) > 0]
        if not batches:
            return Batch()
        if len(batches) == 1:
            return batches[0]
        keys_t = set(batches[0].tensors)
        keys_n = set(batches[0].non_tensors)
        for b in batches[1:]:
            if set(b.tensors) != keys_t or set(b.non_tensors) != keys_n:
                raise ValueError("cannot concatenate batches with different columns")
        return Batch(
            tensors={k: torch.cat([b.tensors[k] for b in batches], dim=0) for k in keys_t},
            non_tensors={k: np.concatenate([b.non_tensors[k] for b in batches]) for k in keys_n},
            meta=dict(batches[0].meta),
        )

    def group_slices(self, key: str = "uid") -> Iterator[tuple[Any, np.ndarray]]:
        """(group id, row indices) in first-appearance order."""
        order: dict[Any, list[int]] = {}
        for i, u in enumerate(self.non_tensors[key]):
            order.setdefault(u, []).append(i)
        for u, rows in order.items():
            yield u, np.asarray(rows, dtype=np.int64)

    def num_groups(self, key: str = "uid") -> int:
        return len(set(self.non_tensors[key].tolist()))


def _as_object_array(values: Any) -> np.ndarray:
    if isinstance(values, np.ndarray) and values.ndim == 1:
        return values
    arr = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        arr[i] = v
    return arr
