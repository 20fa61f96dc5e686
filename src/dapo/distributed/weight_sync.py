"""Trained weights from the ranks, one bounded piece at a time: copied into the rollout model in
place, or assembled into whole parameters one at a time (:func:`assemble`) for a driver that
holds no copy (``dapo.distributed.rank_weights``).

With FSDP ranks, each rank holds rows of every parameter (FSDP2 shards dim 0). A sync never
gathers a whole model anywhere: every rank cuts its own rows into pieces, plans them into
rounds of at most ``update_weights_bucket_megabytes / world`` bytes, and the driver asks all
ranks for round ``i`` at once (no collective: each rank sends what it holds), copies the pieces
into the rollout model's tensors at their row offsets and drops them before asking for the
next round (or passes them to :func:`assemble`). The driver's memory grows by at most one
bucket (plus, assembling, the parameters no larger than a bucket whose rows are still arriving:
larger ones are passed on block by block); rank 0 carries no more than any other rank. Ranks of an HSDP replica other than the first send nothing (they hold copies).

The rollout model is updated in place, so engines that hold references to its tensors (the
fast CPU engine re-fuses them at every ``generate``, vLLM reads them as views) see the new
values. Only trainable parameters travel (buffers such as rotary tables do not change), and
nothing is sent when the update took no optimizer step.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import torch

from dapo.checkpoint.rows import RowAssembly, RowBlock, RowCoverage, check_fits, row_count

# (parameter name, first row in the full parameter, the rows)
WeightPiece = tuple[str, int, torch.Tensor]


@dataclass(frozen=True)
class PieceSpec:
    """Rows ``[start, stop)`` of parameter ``name``, of which this rank holds local rows
    ``[start - offset, stop - offset)``."""

    name: str
    start: int
    stop: int
    offset: int
    nbytes: int


def bucket_bytes(megabytes: float) -> int:
    return max(1, int(float(megabytes) * 2**20))


def local_rows(param: torch.Tensor) -> tuple[torch.Tensor, int, bool]:
    """This rank's rows of ``param`` (a DTensor under FSDP2, else a plain tensor), the index of
    its first row in the full parameter, and whether this rank is the one that sends them (the
    first replica of an HSDP mesh)."""
    from torch.distributed.tensor import DTensor

    if not isinstance(param, DTensor):
        return param.detach(), 0, True
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    mesh, placements = param.device_mesh, param.placements
    _, offset = compute_local_shape_and_global_offset(param.shape, mesh, placements)
    coords = mesh.get_coordinate() or []
    sender = all(c == 0 for c, p in zip(coords, placements) if p.is_replicate())
    local = param.to_local().detach()
    return local, int(offset[0]) if param.dim() else 0, sender


def plan_rounds(model: torch.nn.Module, budget: int) -> list[list[PieceSpec]]:
    """This rank's trainable rows cut into pieces of at most ``budget`` bytes (a row larger than
    that travels alone) and grouped into rounds of at most ``budget`` bytes, in parameter order."""
    rounds: list[list[PieceSpec]] = []
    current: list[PieceSpec] = []
    used = 0
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        local, offset, sender = local_rows(p)
        if not sender or local.numel() == 0:
            continue
        rows = local.shape[0] if local.dim() else 1
        row_bytes = local.numel() * local.element_size() // rows
        per_piece = max(1, budget // max(row_bytes, 1))
        for r0 in range(0, rows, per_piece):
            r1 = min(rows, r0 + per_piece)
            nbytes = (r1 - r0) * row_bytes
            if current and used + nbytes > budget:
                rounds.append(current)
                current, used = [], 0
            current.append(PieceSpec(name, offset + r0, offset + r1, offset, nbytes))
            used += nbytes
    if current:
        rounds.append(current)
    return rounds


def round_pieces(model: torch.nn.Module, specs: list[PieceSpec]) -> list[WeightPiece]:
    """The tensors of one planned round, on the CPU (copies: they leave this process)."""
    params = dict(model.named_parameters())
    out = []
    for s in specs:
        local, _, _ = local_rows(params[s.name])
        rows = local if local.dim() == 0 else local[s.start - s.offset : s.stop - s.offset]
        out.append((s.name, s.start, rows.to("cpu", copy=True)))
    return out


def load_pieces_into(model: torch.nn.Module, pieces: Iterable[WeightPiece]) -> int:
    """Copy each piece into ``model``'s parameter of that name at its row offset; bytes copied."""
    params = dict(model.named_parameters())
    nbytes = 0
    with torch.no_grad():
        for name, start, value in pieces:
            p = params.get(name)
            if p is None:
                raise KeyError(f"weight sync: the rollout model has no parameter {name}")
            dst = p if p.dim() == 0 else p[start : start + value.shape[0]]
            if dst.shape != value.shape:
                raise ValueError(
                    f"weight sync: {name} rows {start}+{tuple(value.shape)} do not fit {tuple(p.shape)}"
                )
            dst.copy_(value.to(device=p.device, dtype=p.dtype))
            nbytes += value.numel() * value.element_size()
    return nbytes


def check_covered(model: torch.nn.Module, rows_seen: Mapping[str, int]) -> None:
    """Every trainable parameter of ``model`` received all its rows (tied weights count once)."""
    missing = [
        n
        for n, p in model.named_parameters()
        if p.requires_grad and rows_seen.get(n, 0) < (p.shape[0] if p.dim() else 1)
    ]
    if missing:
        raise KeyError(f"weight sync: {len(missing)} parameters incomplete, e.g. {missing[:3]}")


def load_weights_into(model: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> int:
    """Copy whole tensors ``state`` into ``model``'s parameters of the same names; returns bytes
    copied. Every trainable parameter of the model must be present (tied weights count once)."""
    params = dict(model.named_parameters())
    missing = [n for n, p in params.items() if p.requires_grad and n not in state]
    if missing:
        raise KeyError(f"weight sync: {len(missing)} parameters missing, e.g. {missing[:3]}")
    return load_pieces_into(model, ((n, 0, v) for n, v in state.items() if n in params))


def assemble(
    pieces: Iterable[WeightPiece],
    targets: Mapping[str, tuple[torch.dtype, torch.Size]],
    max_whole_bytes: int | None = None,
) -> Iterator[tuple[str, torch.Tensor | RowBlock]]:
    """Whole parameters from their pieces, each yielded (in ``targets``' dtype) as soon as its
    last rows arrive and then forgotten: what is held at once is the parameters whose pieces are
    still arriving. A piece that is a whole parameter passes through without a copy. A parameter
    of more than ``max_whole_bytes`` is not put together: its pieces pass on as they come, as
    :class:`RowBlock` s, so that it is never held whole here. Parameters with no elements (never
    sent) come last, empty. Raises if a parameter stays incomplete."""
    assembly = RowAssembly("weight sync")
    passing: dict[str, RowCoverage] = {}  # parameters passed on block by block: rows seen
    done: set[str] = set()
    for name, start, rows in pieces:
        if name not in targets:
            raise KeyError(f"weight sync: the policy has no parameter {name}")
        if name in done:  # it was yielded already: taking it again would load it twice
            raise ValueError(f"weight sync: rows {start}+ of {name} arrived after it was complete")
        dtype, shape = targets[name]
        whole = row_count(tuple(rows.shape)) == row_count(shape) and start == 0
        if whole and name not in assembly.partial and name not in passing:
            if tuple(rows.shape) != tuple(shape):
                raise ValueError(f"weight sync: {name} is {tuple(rows.shape)}, the policy's {tuple(shape)}")
            done.add(name)
            yield name, rows.to(dtype)
            del rows
            continue
        if max_whole_bytes is not None and torch.Size(shape).numel() * dtype.itemsize > max_whole_bytes:
            check_fits(f"weight sync: {name}", start, rows, shape)
            seen = passing.setdefault(name, RowCoverage(row_count(shape)))
            seen.add(f"weight sync: {name}", start, row_count(tuple(rows.shape)))
            if seen.complete:
                del passing[name]
                done.add(name)
            yield name, RowBlock(start, rows.to(dtype), tuple(shape))
            del rows  # held by the taker alone while the next round is fetched
            continue
        full = assembly.add(name, start, rows, dtype, shape)
        del rows
        if full is not None:
            done.add(name)
            yield name, full
            del full
    assembly.check_complete(also=passing)
    for name, (dtype, shape) in targets.items():
        if name not in done:
            if torch.Size(shape).numel():
                raise KeyError(f"weight sync: no rows of {name} arrived")
            yield name, torch.empty(shape, dtype=dtype)
