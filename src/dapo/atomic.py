"""Files a run writes whole: written beside their place under a hidden temporary name and renamed
onto it, so a reader sees the old file or the new one, never half of one.

A write that fails (a full disk, a read-only or vanished directory, a rename refused) removes
its temporary file and raises :class:`WriteError`, which names the file and what to do; the file
it was replacing is left as it was.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from dapo.errors import DapoError


class WriteError(DapoError, OSError):
    """A file of the run could not be written; the message names it, the reason and the fix."""


def temp_name(path: Path) -> Path:
    """The hidden sibling ``path`` is written to first (one per process)."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


@contextlib.contextmanager
def replacing(
    path: str | os.PathLike, fsync: bool = False, then: str = "", binary: bool = False
) -> Iterator[IO[Any]]:
    """A text (or, with ``binary``, bytes) file to write ``path``'s new contents to; when the block ends it replaces ``path``
    in one rename (flushed to disk first with ``fsync``). On any failure the temporary file is
    removed; an ``OSError`` becomes :class:`WriteError`, whose message ends with ``then`` (what
    the failure means for the run) when given."""
    path = Path(path)
    tmp = temp_name(path)
    try:
        with open(tmp, "wb") if binary else open(tmp, "w", encoding="utf-8") as f:
            yield f
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(e, OSError) and not isinstance(e, WriteError):
            raise WriteError(write_failed(path, e, then)) from e
        raise


def write_text(path: str | os.PathLike, text: str, fsync: bool = False, then: str = "") -> None:
    """``text`` as the whole of ``path``, atomically (see :func:`replacing`)."""
    with replacing(path, fsync=fsync, then=then) as f:
        f.write(text)


def write_bytes(path: str | os.PathLike, data: bytes, then: str = "") -> None:
    """``data`` as the whole of ``path``, atomically (see :func:`replacing`)."""
    with replacing(path, then=then, binary=True) as f:
        f.write(data)


def write_failed(path: Path, e: OSError, then: str = "") -> str:
    """The line that says ``path`` could not be written because of ``e``, and what to do."""
    reason = e.strerror or str(e) or type(e).__name__
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = "free space on that disk"
    elif e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        fix = "make its directory writable"
    else:
        fix = "check the disk that holds it"
    return f"cannot write {path}: {reason}; {fix}{'. ' + then if then else ''}"
