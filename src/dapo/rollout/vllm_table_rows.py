"""Blocks of rows of vLLM's token-embedding tables, written straight into the tables' storage.

A table larger than the sync's bucket reaches the worker as :class:`RowBlock` s (the trainer
never holds it whole: ``dapo.distributed.weight_sync.assemble``). vLLM's own loader for these
layers (``VocabParallelEmbedding.weight_loader``) takes the whole checkpoint tensor only: it
keeps this worker's shard of the vocabulary (rows ``org_vocab_start_index`` to
``org_vocab_end_index``) at the top of the parameter and zeroes the rest (the padding up to a
multiple of 64, and the rows of added vocabulary). :class:`TableRows` does the same block by
block, so the result is the whole load's, bit for bit: each block's rows that fall in the shard
are copied at their place, and after vLLM's reload, once every row of the shard is checked to
have arrived, the rest is zeroed (:meth:`TableRows.finish`).

The parameters are held from before vLLM's reload starts: the reload puts every layer's
parameters on the meta device until it ends and then registers the same tensors again, so the
blocks written meanwhile are in them (:meth:`TableRows.finish` checks that it did).
"""

from __future__ import annotations

import torch

from dapo.checkpoint.rows import RowBlock, RowCoverage, check_fits


class TableRows:
    """Writes blocks of the tables' weights (vLLM's names) into ``tables``' own parameters."""

    def __init__(self, tables: dict[str, torch.nn.Module]):
        self.layers: dict[str, torch.nn.Module] = {}
        self.params: dict[str, torch.nn.Parameter] = {}
        for prefix, m in tables.items():
            for p_name, p in m.named_parameters(recurse=False):
                # vLLM's loader shards along dim 0 here only; other parameters are loaded whole
                if getattr(p, "output_dim", None) == 0 and getattr(p, "packed_dim", None) is None:
                    self.layers[f"{prefix}.{p_name}"], self.params[f"{prefix}.{p_name}"] = m, p
        self.seen: dict[str, RowCoverage] = {}

    def takes(self, name: str) -> bool:
        return name in self.params

    @torch.no_grad()
    def write(self, name: str, block: RowBlock) -> None:
        """Copy the rows of ``block`` (of the checkpoint's whole table ``name``) that belong to
        this worker's shard into the parameter."""
        layer, param = self.layers[name], self.params[name]
        lo, hi = layer.shard_indices.org_vocab_start_index, layer.shard_indices.org_vocab_end_index
        if len(block.shape) != param.dim() or block.shape[0] != layer.org_vocab_size:
            raise ValueError(
                f"{name}: a table of shape {tuple(block.shape)} sent, vLLM's vocabulary has "
                f"{layer.org_vocab_size} rows"
            )
        if tuple(block.shape[1:]) != tuple(param.shape[1:]):
            raise ValueError(
                f"{name}: a table of shape {tuple(block.shape)} sent, vLLM's rows are {tuple(param.shape[1:])}"
            )
        check_fits(name, block.start, block.rows, (block.shape[0], *param.shape[1:]))
        seen = self.seen.setdefault(name, RowCoverage(hi - lo))
        s, e = max(block.start, lo), min(block.stop, hi)
        if e <= s:
            return
        seen.add(name, s - lo, e - s)
        param.data[s - lo : e - lo].copy_(block.rows[s - block.start : e - block.start])

    @torch.no_grad()
    def finish(self, tables: dict[str, torch.nn.Module]) -> None:
        """After vLLM's reload: every table written to has all its rows, is the same tensor again,
        and has its rows past the shard zeroed (as vLLM's loader leaves them)."""
        for name, seen in self.seen.items():
            if not seen.complete:
                raise KeyError(f"weight sync: rows of {name} missing at the end of the stream")
            prefix, _, p_name = name.rpartition(".")
            if getattr(tables[prefix], p_name) is not self.params[name]:
                raise RuntimeError(f"vLLM's reload replaced {name}: the rows written into it are lost")
            self.params[name].data[seen.rows :].fill_(0)

    @property
    def written(self) -> bool:
        return bool(self.seen)
