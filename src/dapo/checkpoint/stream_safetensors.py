"""A safetensors file written piece by piece, and a Hugging Face directory written from pieces.

A safetensors file is an 8-byte little-endian header length, a JSON header naming every
tensor's dtype, shape and byte range, then the tensors' raw row-major bytes. Everything in the
header is known from names, dtypes and shapes alone, so the file can be laid out before any
value exists; a block of whole rows of one tensor (what an FSDP2 rank holds: dim 0 is sharded)
is then one contiguous byte range, written where it belongs in whatever order the blocks come.
The file is the one ``safetensors.torch.save_file`` writes for the same tensors, byte for byte:
the tensors' order in the file is asked of safetensors itself (one element per tensor) and the
header is serialised as it serialises it.

:func:`save_pretrained_streamed` writes a model directory this way: transformers'
``save_pretrained`` runs on a model whose parameters are on the meta device and decides
everything it decides for a real model (config files, which of two tied names is kept, the
shard files and their index), while the tensors' bytes come from the pieces.
"""

from __future__ import annotations

import json
import os
import struct
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from dapo.checkpoint.rows import RowCoverage

# (tensor name, first row, the rows): what a worker rank sends (dapo.distributed.weight_sync)
Piece = tuple[str, int, torch.Tensor]

_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}

Spec = tuple[torch.dtype, tuple[int, ...]]


def _file_order(specs: Mapping[str, Spec]) -> list[str]:
    """The names in the order safetensors places their bytes (by dtype, then name), read from
    the header safetensors writes for one element of each."""
    from safetensors.torch import save

    raw = save({n: torch.zeros(1, dtype=d) for n, (d, _) in specs.items()})
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    header.pop("__metadata__", None)
    return sorted(header, key=lambda k: header[k]["data_offsets"][0])


def _rows(shape: tuple[int, ...]) -> int:
    return shape[0] if shape else 1


class SafetensorsLayout:
    """Where each tensor's bytes go in the file ``save_file(tensors, metadata=metadata)`` writes."""

    def __init__(self, specs: Mapping[str, Spec], metadata: Mapping[str, str] | None = None):
        bad = [f"{n} ({d})" for n, (d, _) in specs.items() if d not in _DTYPES]
        if bad:
            raise ValueError(
                f"streamed safetensors: unsupported dtype for {', '.join(bad[:3])}; supported: "
                f"{', '.join(str(d).removeprefix('torch.') for d in _DTYPES)}"
            )
        self.specs = {n: (d, tuple(int(x) for x in s)) for n, (d, s) in specs.items()}
        header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
        self.offsets: dict[str, int] = {}
        pos = 0
        for name in _file_order(self.specs) if self.specs else []:
            dtype, shape = self.specs[name]
            nbytes = dtype.itemsize * int(torch.Size(shape).numel())
            header[name] = {
                "dtype": _DTYPES[dtype],
                "shape": list(shape),
                "data_offsets": [pos, pos + nbytes],
            }
            self.offsets[name] = pos
            pos += nbytes
        text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
        text += b" " * (-len(text) % 8)  # safetensors pads the header to 8 bytes with spaces
        self.prefix = struct.pack("<Q", len(text)) + text
        self.data_bytes = pos

    @property
    def size(self) -> int:
        return len(self.prefix) + self.data_bytes

    def row_bytes(self, name: str) -> int:
        dtype, shape = self.specs[name]
        rows = _rows(shape)
        return dtype.itemsize * int(torch.Size(shape).numel()) // rows if rows else 0


class StreamedSafetensors:
    """``save_file`` of tensors that arrive as blocks of rows: :meth:`write_rows` puts each block
    at its place in the file (any order; several blocks per tensor), :meth:`close` checks that
    every row of every tensor came."""

    def __init__(
        self, path: str | os.PathLike, specs: Mapping[str, Spec], metadata: Mapping[str, str] | None = None
    ):
        self.path = Path(path)
        self.layout = SafetensorsLayout(specs, metadata)
        self.rows_seen = {n: RowCoverage(_rows(shape)) for n, (_, shape) in self.layout.specs.items()}
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            self._pwrite(memoryview(self.layout.prefix), 0)
            os.ftruncate(self._fd, self.layout.size)
        except BaseException:
            self.close(check=False)
            raise

    def _pwrite(self, view: memoryview, pos: int) -> None:
        assert self._fd is not None
        while len(view):
            n = os.pwrite(self._fd, view, pos)
            view, pos = view[n:], pos + n

    def write_rows(self, name: str, start: int, rows: torch.Tensor) -> int:
        """Rows ``[start, start + len(rows))`` of tensor ``name`` (the whole of a 0-dim one);
        cast to the file's dtype. Returns the bytes written."""
        if name not in self.layout.specs:
            raise KeyError(f"{self.path.name}: has no tensor {name}")
        dtype, shape = self.layout.specs[name]
        k = rows.shape[0] if rows.dim() else 1
        want = (k, *shape[1:]) if shape else ()
        if tuple(rows.shape) != want or start < 0 or start + k > _rows(shape):
            raise ValueError(
                f"{self.path.name}: {name} rows {start}+{tuple(rows.shape)} do not fit its shape {shape}"
            )
        self.rows_seen[name].add(f"{self.path.name}: {name}", start, k)
        data = rows.detach().to(device="cpu", dtype=dtype).contiguous().reshape(-1)
        view = memoryview(data.view(torch.uint8).numpy()) if data.numel() else memoryview(b"")
        self._pwrite(
            view, len(self.layout.prefix) + self.layout.offsets[name] + start * self.layout.row_bytes(name)
        )
        return len(view)

    def close(self, check: bool = True) -> None:
        """Close the file; with ``check``, raise if a tensor did not get all its rows."""
        if self._fd is None:
            return
        os.close(self._fd)
        self._fd = None
        if not check:
            return
        missing = [
            n
            for n, (_, shape) in self.layout.specs.items()
            if not self.rows_seen[n].complete and torch.Size(shape).numel() > 0
        ]
        if missing:
            raise ValueError(f"{self.path.name}: {len(missing)} tensors incomplete, e.g. {missing[:3]}")


def saved_names(model: torch.nn.Module, names: Iterable[str]) -> dict[str, str]:
    """For each parameter name of ``model`` (``named_parameters()``: a tied pair under its first
    name), the name among ``names`` (what a checkpoint keeps) that holds the same parameter."""
    keep = set(names)
    out: dict[str, str] = {}
    by_param: dict[int, list[str]] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        by_param.setdefault(id(p), []).append(n)
    for aliases in by_param.values():
        kept = [a for a in aliases if a in keep]
        if kept:
            out[aliases[0]] = kept[0]
    return out


# the swap below is of a module global: two streamed saves at once would restore each other's
_SWAP = threading.Lock()


@contextmanager
def _layout_only_saves(files: dict[str, StreamedSafetensors]) -> Iterator[None]:
    """``save_pretrained`` with its safetensors writer replaced by one that lays each file out
    (header, size) and writes only the tensors that are real (buffers); the parameters, on the
    meta device, are written from the pieces afterwards."""
    import transformers.modeling_utils as modeling_utils

    def lay_out(
        tensors: Mapping[str, torch.Tensor], filename: str, metadata: Mapping[str, str] | None = None
    ) -> None:
        w = StreamedSafetensors(
            filename, {n: (t.dtype, tuple(t.shape)) for n, t in tensors.items()}, metadata
        )
        files[str(filename)] = w
        for n, t in tensors.items():
            if t.device.type != "meta":
                w.write_rows(n, 0, t)

    original = getattr(modeling_utils, "safe_save_file", None)
    if original is None:
        raise RuntimeError(
            "transformers.modeling_utils has no safe_save_file (a transformers version dapo does not "
            "know): checkpoints cannot be written from the worker ranks; pin transformers to the "
            "range in pyproject.toml"
        )
    with _SWAP:
        modeling_utils.safe_save_file = lay_out
        try:
            yield
        finally:
            modeling_utils.safe_save_file = original


def save_pretrained_streamed(
    model: Any, out_dir: str | os.PathLike, pieces: Iterable[Piece], **save_kwargs: Any
) -> int:
    """``model.save_pretrained(out_dir, safe_serialization=True)`` for a model whose parameters
    are on the meta device, their values given as ``pieces`` (``(parameter name, first row,
    rows)``, names as ``model.named_parameters()`` gives them, in any order). The directory is
    the one ``save_pretrained`` writes for the model holding those values. Returns the bytes of
    the pieces written. ``save_kwargs`` go to ``save_pretrained`` (``max_shard_size``)."""
    files: dict[str, StreamedSafetensors] = {}
    ok = False
    try:
        with _layout_only_saves(files):
            model.save_pretrained(out_dir, safe_serialization=True, **save_kwargs)
        where = {n: w for w in files.values() for n in w.layout.specs}
        target = saved_names(model, where)
        nbytes = 0
        for name, start, rows in pieces:
            saved = target.get(name)
            if saved is None:
                raise KeyError(f"streamed checkpoint: {name} is not among the tensors save_pretrained keeps")
            nbytes += where[saved].write_rows(saved, start, rows)
        ok = True
    finally:
        for w in files.values():
            w.close(check=ok)  # after a failure, its own error is the one to see
    return nbytes
