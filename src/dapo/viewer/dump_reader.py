"""Lazy access to verl-format JSONL dumps (``<dir>/<step>.jsonl``, docs/verl_compat.md, Dumps).

Opening a directory only lists its files. Opening a step scans its file once for line offsets
(bytes, no JSON parsing); a row is parsed when it is shown (a small cache keeps recent rows).
Scores, for sorting, are parsed on demand and cached. All of this is thread-safe, so the
browser does it in worker threads and never freezes on a large dump.
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from dapo.errors import DapoError
from dapo.outputs.records import VIEWER_FILE

SCORE_KEYS = ("score", "score_1")


class DumpError(DapoError, ValueError):
    pass


def _step_of(p: Path) -> int | None:
    try:
        return int(p.stem)
    except ValueError:
        return None


def step_files(d: Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every ``<int>.jsonl`` in ``d``, by step."""
    if not d.is_dir():
        return []
    out = [(s, p) for p in d.glob("*.jsonl") if (s := _step_of(p)) is not None and p.is_file()]
    return sorted(out)


class DumpFile:
    def __init__(self, path: Path, step: int, cache_size: int = 256) -> None:
        self.path = Path(path)
        self.step = step
        self._offsets: list[int] | None = None
        self._scores: list[float | None] | None = None
        self._previews: list[str] | None = None
        self._cache: OrderedDict[int, dict[str, Any]] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.RLock()
        self.rows_parsed = 0  # how many times a line was parsed (tests check laziness)

    @property
    def indexed(self) -> bool:
        return self._offsets is not None

    def index(self) -> int:
        """Scan for line starts (blank lines skipped); returns the number of rows."""
        with self._lock:
            if self._offsets is None:
                offsets: list[int] = []
                pos = 0
                with self.path.open("rb") as f:
                    for line in f:
                        if line.strip():
                            offsets.append(pos)
                        pos += len(line)
                self._offsets = offsets
            return len(self._offsets)

    def __len__(self) -> int:
        return self.index()

    def raw(self, i: int) -> bytes:
        offsets = self._offsets if self._offsets is not None else None
        if offsets is None:
            self.index()
            offsets = self._offsets
        assert offsets is not None
        with self.path.open("rb") as f:
            f.seek(offsets[i])
            return f.readline()

    def row(self, i: int) -> dict[str, Any]:
        with self._lock:
            if i in self._cache:
                self._cache.move_to_end(i)
                return self._cache[i]
        line = self.raw(i)
        try:
            obj = json.loads(line)
            if not isinstance(obj, dict):
                obj = {"value": obj}
        except ValueError as e:
            obj = {"_error": f"line {i + 1} is not valid JSON: {e}", "_raw": line.decode("utf-8", "replace")}
        with self._lock:
            self.rows_parsed += 1
            self._cache[i] = obj
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return obj

    def scores(self) -> list[float | None]:
        """``score`` (else ``score_1``) of every row; None where missing or not a number."""
        with self._lock:
            if self._scores is not None:
                return self._scores
        rows = [self.row(i) for i in range(len(self))]
        scores, previews = [row_score(r) for r in rows], [row_preview(r) for r in rows]
        with self._lock:
            self._scores, self._previews = scores, previews
        return scores

    def previews(self) -> list[str]:
        """A one-line start of every row's response (read with the scores)."""
        self.scores()
        assert self._previews is not None
        return self._previews

    @property
    def scores_ready(self) -> bool:
        return self._scores is not None


def row_score(row: dict[str, Any]) -> float | None:
    for k in SCORE_KEYS:
        v = row.get(k)
        if isinstance(v, bool):
            return float(v)
        if isinstance(v, int | float) and math.isfinite(v):
            return float(v)
    return None


PREVIEW_KEYS = ("output", "response", "responses")


def row_preview(row: dict[str, Any], width: int = 24) -> str:
    """The start of the row's response on one line (whitespace collapsed), at most ``width``
    characters; empty when the row has no response field."""
    for k in PREVIEW_KEYS:
        v = row.get(k)
        if isinstance(v, str):
            text = " ".join(v.split())
            return text if len(text) <= width else text[: width - 1] + "…"
    return ""


def sort_order(scores: list[float | None], mode: str) -> list[int]:
    """Row order for ``mode`` ``original`` | ``score_asc`` | ``score_desc`` (missing scores last,
    ties in file order)."""
    idx = list(range(len(scores)))
    if mode == "original":
        return idx
    sign = 1.0 if mode == "score_asc" else -1.0
    return sorted(idx, key=lambda i: (scores[i] is None, sign * (scores[i] or 0.0), i))


class DumpDir:
    def __init__(self, path: str | Path, label: str = "") -> None:
        self.path = Path(path)
        self.label = label or self.path.name
        files = step_files(self.path)
        if not files:
            raise DumpError(f"{self.path}: no <step>.jsonl dump files")
        self.steps = [s for s, _ in files]
        self._files = {s: DumpFile(p, s) for s, p in files}

    def file(self, step: int) -> DumpFile:
        return self._files[step]


def find_dumps(path: str | Path) -> list[DumpDir]:
    """The dump directories behind ``path``: ``path`` itself when it holds ``<step>.jsonl``
    files; else the rollout/validation dirs named in ``viewer.json``; else its subdirectories
    that hold dumps (rollout before validation)."""
    path = Path(path).expanduser()
    if not path.exists():
        raise DumpError(f"{path}: no such file or directory")
    if path.is_file():
        if _step_of(path) is None or path.suffix != ".jsonl":
            raise DumpError(f"{path}: expected a directory of <step>.jsonl dumps")
        path = path.parent
    if step_files(path):
        return [DumpDir(path)]
    found: list[DumpDir] = []
    seen: set[Path] = set()
    info_path = path / VIEWER_FILE
    if info_path.is_file():
        try:
            info = json.loads(info_path.read_text())
        except ValueError:
            info = {}
        for key, label in (("rollout_data_dir", "rollout"), ("validation_data_dir", "validation")):
            d = info.get(key)
            if d and step_files(Path(d)):
                found.append(DumpDir(d, label))
                seen.add(Path(d).resolve())
    subdirs = sorted(
        (p for p in path.iterdir() if p.is_dir()), key=lambda p: ("val" in p.name.lower(), p.name)
    )
    for d in subdirs:
        if d.resolve() not in seen and step_files(d):
            found.append(DumpDir(d, d.name))
    if not found:
        raise DumpError(
            f"{path}: no rollout dumps found. Point dapo view at trainer.rollout_data_dir or "
            "trainer.validation_data_dir (a directory of <step>.jsonl files), or at a run directory that has them"
        )
    return found


DEFAULT_MASK = r"<\|image_pad\|>|<\|imgpad\|>"


def format_value(v: Any, mask: re.Pattern[str] | None = None) -> str:
    s = v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, indent=2, default=str)
    return mask.sub("*", s) if mask is not None else s


def row_matches(row: dict[str, Any], query: str, fields: list[str] | None = None) -> bool:
    q = query.lower()
    keys = row.keys() if fields is None else [k for k in fields if k in row]
    return any(q in format_value(row[k]).lower() for k in keys)
