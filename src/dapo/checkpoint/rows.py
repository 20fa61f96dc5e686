"""Which rows of a tensor have arrived, for tensors that arrive as blocks of rows (a weight sync
from sharded ranks, a streamed safetensors file)."""

from __future__ import annotations

import torch


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
