"""Reading torch.distributed.checkpoint (DCP) directories without running code from them.

DCP's own reader unpickles ``.metadata`` with :mod:`pickle` and the non-tensor items (optimizer
hyper-parameters) with ``torch.load(weights_only=False)``: a crafted file runs code on load. Here
the metadata goes through an unpickler that can build only DCP's metadata classes, ``torch.Size``,
dtypes, layouts and paths, and the items go through ``torch.load(weights_only=True)``. The
metadata's file references must be plain names of files in the directory (no ``..``, no other
directory). Writing is DCP's own (``dcp.save``); the on-disk format is unchanged.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch

from dapo.checkpoint.manifest import CheckpointError, error_summary

_METADATA_CLASSES = (
    "Metadata",
    "MetadataIndex",
    "StorageMeta",
    "TensorStorageMetadata",
    "BytesStorageMetadata",
    "ChunkStorageMetadata",
    "TensorProperties",
    "_MEM_FORMAT_ENCODING",
)
_ALLOWED = frozenset(
    {("torch.distributed.checkpoint.metadata", name) for name in _METADATA_CLASSES}
    | {
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),
        ("pathlib", "PosixPath"),
        ("pathlib", "PurePosixPath"),
        ("pathlib._local", "PosixPath"),
        ("pathlib._local", "PurePosixPath"),
        ("collections", "OrderedDict"),
    }
)


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not a DCP metadata type")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("persistent ids are not DCP metadata")


def read_metadata(path: str | Path) -> Any:
    """The ``Metadata`` in DCP metadata file ``path``, unpickled by the restricted loader."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import Metadata

    path = Path(path)
    try:
        with open(path, "rb") as f:
            md = _MetadataUnpickler(f).load()
    except (OSError, EOFError, pickle.UnpicklingError, ValueError, TypeError, AttributeError, KeyError) as e:
        raise CheckpointError(f"{path}: not DCP metadata dapo can read safely ({error_summary(e)})") from None
    if not isinstance(md, Metadata) or not isinstance(md.storage_data, dict):
        raise CheckpointError(f"{path}: not DCP metadata (holds a {type(md).__name__})")
    for info in md.storage_data.values():
        rel = getattr(info, "relative_path", None) if isinstance(info, _StorageInfo) else None
        if not isinstance(rel, str) or not rel or "/" in rel or "\\" in rel or rel in (".", ".."):
            raise CheckpointError(f"{path}: refers to {rel!r}, which is not a file beside it")
        if not (path.parent / rel).is_file():
            raise CheckpointError(f"{path}: refers to {rel}, which is missing")
    return md


def load(state: dict[str, Any], path: str | Path, allow_partial_load: bool = False) -> None:
    """``dcp.load(state, checkpoint_id=path)`` through the restricted reader and planner."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.metadata import StorageMeta

    class Reader(dcp.FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            rank = kwargs.get("rank")
            md = read_metadata(Path(self.path) / (".metadata" if rank is None else f"__{rank}.metadata"))
            if getattr(md, "storage_meta", None) is None:
                md.storage_meta = StorageMeta()
            md.storage_meta.load_id = self.load_id
            return md

    class Planner(dcp.DefaultLoadPlanner):
        error: CheckpointError | None = None

        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            # torch internals (bounded by torch.distributed.checkpoint's DefaultLoadPlanner layout)
            from torch.distributed.checkpoint._traverse import set_element

            try:
                obj = torch.load(value, weights_only=True)
            except pickle.UnpicklingError as e:
                self.error = CheckpointError(
                    f"{path}: item {read_item.dest_index.fqn} is not plain data ({error_summary(e)})"
                )
                raise self.error from None
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
            else:
                self.state_dict[read_item.dest_index.fqn] = obj

    read_metadata(Path(path) / ".metadata")  # its own clear error before DCP wraps any
    planner = Planner(allow_partial_load=allow_partial_load)
    try:
        dcp.load(state, storage_reader=Reader(str(path)), planner=planner)
    except CheckpointError:
        raise
    except (Exception, CheckpointException) as e:  # DCP wraps each rank's failure in a BaseException
        if planner.error is not None:
            raise planner.error from None
        lines = [x for x in str(e).strip().splitlines() if x.strip()]
        raise CheckpointError(
            f"{path}: does not load ({lines[-1].strip()[:300] if lines else e!r})"
        ) from None
