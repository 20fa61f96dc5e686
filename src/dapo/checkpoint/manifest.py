"""A checkpoint's manifest: every file it holds, with its size and sha256, and the checks against it.

``dapo_checkpoint.json`` (format 2)::

    {"format": 2, "step": N, "files": {"actor/optimizer.pt": {"size": 123, "sha256": "..."}, ...}}

It is written last, into the checkpoint's temporary directory, after every other file is written
and flushed; the directory is then renamed into place, so a directory without a manifest was cut
off and is never a checkpoint. :func:`verify` is what resume trusts: the manifest parses, its
step agrees with the directory name and with ``trainer_state.json``, every listed file is there
with its size and hash, and nothing else is there (no unlisted file, no symbolic link).

Format 1 (written by earlier versions of dapo) listed sizes only: :func:`verify` still checks
names, sizes, the step and unlisted files, and reports the checkpoint as unverified so the caller
can say so. The hashes detect corruption (a flipped byte, a truncated copy), not malice: whoever
can write a checkpoint can write a matching manifest.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from dapo.errors import DapoError

MANIFEST = "dapo_checkpoint.json"
FORMAT_VERSION = 2
STATE_FILE = "trainer_state.json"
_CHUNK = 1 << 20
_STEP_RE = re.compile(r"^global_step_(\d+)$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


class CheckpointError(DapoError, RuntimeError):
    """A checkpoint that cannot be used; the message names the file and says why."""


@dataclass(frozen=True)
class Manifest:
    step: int
    format: int
    files: dict[str, tuple[int, str | None]]  # relative path -> (size, sha256 or None in format 1)

    @property
    def hashed(self) -> bool:
        return self.format >= 2

    @property
    def total_bytes(self) -> int:
        return sum(size for size, _ in self.files.values())


def file_sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def checkpoint_files(root: Path) -> tuple[list[str], list[str]]:
    """``(regular files, other entries)`` under ``root`` as POSIX relative paths, sorted; links,
    sockets and the like are "other" (never followed)."""
    files, other = [], []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        d = Path(dirpath)
        for name in dirnames:
            if (d / name).is_symlink():
                other.append((d / name).relative_to(root).as_posix())
        for name in filenames:
            p = d / name
            rel = p.relative_to(root).as_posix()
            (files if p.is_file() and not p.is_symlink() else other).append(rel)
    return sorted(files), sorted(other)


def write_manifest(root: Path, step: int) -> Manifest:
    """Hash every file under ``root`` and write the manifest there (the caller flushes and renames)."""
    files, other = checkpoint_files(root)
    if other:
        raise CheckpointError(f"{root / other[0]}: a checkpoint holds only regular files")
    entries = {
        rel: (os.path.getsize(root / rel), file_sha256(root / rel)) for rel in files if rel != MANIFEST
    }
    doc = {
        "format": FORMAT_VERSION,
        "step": int(step),
        "files": {rel: {"size": size, "sha256": digest} for rel, (size, digest) in entries.items()},
    }
    with open(root / MANIFEST, "w", encoding="utf-8") as f:
        f.write(json.dumps(doc, indent=1))
        f.flush()
        os.fsync(f.fileno())
    return Manifest(int(step), FORMAT_VERSION, entries)


def read_manifest(root: Path) -> Manifest:
    """The manifest of checkpoint directory ``root``; CheckpointError naming it when absent or malformed."""
    mpath = root / MANIFEST
    if not root.is_dir():
        raise CheckpointError(f"{root}: not a directory")
    if not mpath.is_file():
        raise CheckpointError(f"{mpath}: missing (the checkpoint was cut off mid-write or copied in part)")
    try:
        doc = json.loads(mpath.read_text(encoding="utf-8"))
        if not isinstance(doc, dict):
            raise TypeError("not a JSON object")
        fmt = _whole(doc.get("format", 1), "format")
        step = _whole(doc["step"], "step")
        raw = doc["files"]
        if not isinstance(raw, dict):
            raise TypeError("'files' is not an object")
        files: dict[str, tuple[int, str | None]] = {}
        for rel, entry in raw.items():
            if fmt >= 2:
                digest = entry["sha256"]
                if not isinstance(digest, str) or not _SHA256_RE.match(digest):
                    raise ValueError(f"{rel!r}: sha256 is not 64 hex digits")
                files[rel] = (_whole(entry["size"], f"{rel!r} size"), digest)
            else:
                files[rel] = (_whole(entry, f"{rel!r} size"), None)
    # RecursionError: JSON nested past the parser's depth limit
    except (
        OSError,
        UnicodeDecodeError,
        ValueError,
        KeyError,
        TypeError,
        AttributeError,
        RecursionError,
    ) as e:
        raise CheckpointError(f"{mpath}: unreadable ({error_summary(e)})") from None
    if fmt > FORMAT_VERSION:
        raise CheckpointError(
            f"{mpath}: format {fmt} is newer than this dapo reads ({FORMAT_VERSION}); upgrade"
        )
    for rel in files:
        p = PurePosixPath(rel)
        if p.is_absolute() or ".." in p.parts or rel in ("", ".", MANIFEST) or "\\" in rel:
            raise CheckpointError(f"{mpath}: lists {rel!r}, which is not a file inside the checkpoint")
    return Manifest(step, fmt, files)


def _whole(v: object, what: str) -> int:
    """A manifest number: a non-negative JSON integer (not a float, a bool or infinity)."""
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"{what} is {v!r}, not a non-negative integer")
    return v


def check_complete(root: Path) -> str | None:
    """Cheap completeness (manifest, step, listed files present with their sizes): None, or why not."""
    try:
        m = read_manifest(root)
        _check_step_name(root, m)
    except CheckpointError as e:
        return str(e)
    for rel, (size, _) in m.files.items():
        f = root / rel
        if not f.is_file():
            return f"{f}: missing"
        if f.stat().st_size != size:
            return f"{f}: {f.stat().st_size} bytes, the manifest says {size} (truncated or overwritten)"
    return None


def verify(root: Path) -> Manifest:
    """Every check resume relies on; CheckpointError naming the first file that fails."""
    m = read_manifest(root)
    _check_step_name(root, m)
    files, other = checkpoint_files(root)
    if other:
        raise CheckpointError(f"{root / other[0]}: not a regular file; a checkpoint holds only regular files")
    unlisted = [rel for rel in files if rel != MANIFEST and rel not in m.files]
    if unlisted:
        raise CheckpointError(f"{root / unlisted[0]}: not listed in {MANIFEST}; remove it or the checkpoint")
    for rel, (size, digest) in m.files.items():
        f = root / rel
        if not f.is_file():
            raise CheckpointError(f"{f}: missing")
        actual = f.stat().st_size
        if actual != size:
            raise CheckpointError(f"{f}: {actual} bytes, the manifest says {size} (truncated or overwritten)")
        if digest is not None and file_sha256(f) != digest:
            raise CheckpointError(f"{f}: sha256 differs from {MANIFEST} (the file is corrupted)")
    state = root / STATE_FILE
    if STATE_FILE not in m.files:
        raise CheckpointError(f"{state}: missing")
    try:
        st_step = json.loads(state.read_text(encoding="utf-8"))["global_step"]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, RecursionError) as e:
        raise CheckpointError(f"{state}: unreadable ({error_summary(e)})") from None
    if type(st_step) is not int or st_step != m.step:
        raise CheckpointError(f"{state}: global_step is {st_step!r}, the manifest says {m.step}")
    return m


def _check_step_name(root: Path, m: Manifest) -> None:
    named = _STEP_RE.match(root.name)
    if named is not None and int(named.group(1)) != m.step:
        raise CheckpointError(
            f"{root / MANIFEST}: says step {m.step}, the directory is step {named.group(1)}"
        )


def error_summary(e: BaseException) -> str:
    """``Type: first line`` of an exception (the informative line of a weights-only refusal)."""
    lines = [x.strip() for x in str(e).splitlines() if x.strip()]
    pick = next((x for x in lines if x.startswith("WeightsUnpickler error:")), lines[0] if lines else "")
    pick = pick.split(". ")[0][:200]
    return f"{type(e).__name__}: {pick}" if pick else type(e).__name__
