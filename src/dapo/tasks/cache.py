"""The dapo cache (``$DAPO_CACHE``, default ``~/.cache/dapo``) and the one way anything is built into it."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def cache_dir() -> Path:
    return Path(os.environ.get("DAPO_CACHE", Path.home() / ".cache" / "dapo")).expanduser()


def ensure_built(
    target: Path,
    build: Callable[[Path], dict],
    log: Callable[[str], None],
    force: bool = False,
    record: str = "dapo_warm_start.json",
) -> Path:
    """``target`` if a finished build is there (its ``record`` file, written last, exists);
    otherwise ``build(tmp_dir)``, which returns the record's contents, into a temporary sibling
    that then replaces ``target`` in one rename, so a killed build never leaves a half folder."""
    if (target / record).exists() and not force:
        return target
    log(f"building {target.name} (first use) into {target} ...")
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=_mkdir(target.parent)))
    try:
        info = build(tmp)
        (tmp / record).write_text(json.dumps(info, indent=2))
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def ensure_model(
    name: str,
    fingerprint: str,
    build: Callable[[Path], dict],
    log: Callable[[str], None],
    force: bool = False,
) -> Path:
    """``models/<name>-<fingerprint>/`` in the cache, ``build(dir)`` (the warm start) on first use."""
    return ensure_built(cache_dir() / "models" / f"{name}-{fingerprint}", build, log, force)


def ensure_task_files(
    name: str, fingerprint: str, write: Callable[[Path], object], log: Callable[[str], None]
) -> tuple[Path, Path]:
    """``data/<name>-<fingerprint>/{train,test}.parquet`` in the cache, ``write(dir)`` on first use."""
    d = cache_dir() / "data" / f"{name}-{fingerprint}"
    ensure_built(d, lambda tmp: (write(tmp), {"fingerprint": fingerprint})[1], log, record="dapo_task.json")
    return d / "train.parquet", d / "test.parquet"


def _mkdir(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p
