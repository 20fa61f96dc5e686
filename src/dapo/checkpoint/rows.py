"""Tensors that arrive as blocks of rows (a weight sync from sharded ranks, a streamed
safetensors file): which rows have arrived, a block of rows in transit, and whole tensors put
together from their blocks."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch


def row_count(shape: tuple[int, ...] | torch.Size) -> int:
    """Rows of a tensor of ``shape`` (a 0-dim tensor is one row)."""
    return int(shape[0]) if len(shape) else 1


class RowCoverage:
    """Which rows of a tensor of ``rows`` rows have arrived: a block that overlaps one already
    written is refused (a count of rows alone would take a block twice for a missing one)."""

    def __init__(self, rows: int):
        self.seen = torch.zeros(max(rows, 1), dtype=torch.bool)
        self.rows = rows

    def add(self, what: str, start: int, k: int) -> None:
        block = self.seen[start : start + k]
        if bool(block.any()):
            raise ValueError(f"{what}: rows {start}..{start + k - 1} arrived twice")
        block.fill_(True)

    @property
    def complete(self) -> bool:
        return self.rows == 0 or bool(self.seen[: self.rows].all())


@dataclass(frozen=True)
class RowBlock:
    """Rows ``[start, stop)`` of a tensor of shape ``shape``: how a tensor too large to hold whole
    on the way travels (the receiver writes each block at its place)."""

    start: int
    rows: torch.Tensor
    shape: tuple[int, ...]

    @property
    def stop(self) -> int:
        return self.start + row_count(tuple(self.rows.shape))


def check_fits(what: str, start: int, rows: torch.Tensor, shape: tuple[int, ...] | torch.Size) -> None:
    """Refuse a block of rows that does not fit at row ``start`` of a tensor of ``shape``."""
    k = row_count(tuple(rows.shape))
    fits = (
        tuple(rows.shape) == tuple(shape)
        if len(shape) == 0
        else (tuple(rows.shape[1:]) == tuple(shape[1:]) and 0 <= start and start + k <= shape[0])
    )
    if not fits:
        raise ValueError(f"{what} rows {start}+{tuple(rows.shape)} do not fit {tuple(shape)}")


class RowAssembly:
    """Whole tensors put together from their blocks of rows, each handed back by :meth:`add` as
    its last rows arrive and then forgotten: what is held is the tensors still incomplete."""

    def __init__(self, what: str, max_numel: int | None = None):
        self.what = what
        self.max_numel = max_numel  # the largest whole tensor it will allocate (a shape is a claim)
        self.partial: dict[str, tuple[torch.Tensor, RowCoverage]] = {}

    def add(
        self,
        name: str,
        start: int,
        rows: torch.Tensor,
        dtype: torch.dtype,
        shape: tuple[int, ...] | torch.Size,
    ) -> torch.Tensor | None:
        """Write ``rows`` at row ``start`` of tensor ``name``; the whole tensor once complete."""
        what = f"{self.what}: {name}"
        shape = torch.Size(shape)
        entry = self.partial.get(name)
        if entry is None:
            if any(d < 0 for d in shape):
                raise ValueError(f"{what}: whole shape {tuple(shape)} has a negative size")
            if self.max_numel is not None and shape.numel() > self.max_numel:
                raise ValueError(
                    f"{what}: whole shape {tuple(shape)} is larger than any tensor taken here "
                    f"({self.max_numel} elements)"
                )
            check_fits(what, start, rows, shape)  # before the whole tensor is allocated
            entry = self.partial[name] = (torch.empty(shape, dtype=dtype), RowCoverage(row_count(shape)))
        full, seen = entry
        if full.dtype != dtype or full.shape != shape:
            raise ValueError(
                f"{what}: a block of {dtype} {tuple(shape)} after blocks of {full.dtype} {tuple(full.shape)}"
            )
        check_fits(what, start, rows, full.shape)
        k = row_count(tuple(rows.shape))
        seen.add(what, start, k)
        (full if full.dim() == 0 else full[start : start + k]).copy_(rows)
        if not seen.complete:
            return None
        del self.partial[name]
        return full

    def check_complete(self, also: Iterable[str] = ()) -> None:
        """Raise naming the tensors still incomplete (with ``also``, others the caller tracks)."""
        names = [*self.partial, *also]
        if names:
            raise KeyError(f"{self.what}: {len(names)} parameters incomplete, e.g. {names[:3]}")
