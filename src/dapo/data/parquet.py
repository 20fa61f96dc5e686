"""Reading and writing verl-format parquet (docs/verl_compat.md, Data)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from dapo.errors import DapoError


class DataError(DapoError, ValueError):
    """A problem with a data file, naming the file, the row and how to fix it."""


REQUIRED_COLUMNS = ("data_source", "reward_model")


def write_rows(path: str | Path, rows: list[dict[str, Any]]) -> None:
    """Write rows as parquet with nested columns, as verl's preprocessors do.

    ``extra_info`` dicts can differ between rows, so they are stored as structs when
    their keys agree and as JSON strings otherwise.
    """
    table = pa.Table.from_pylist(rows)
    pq.write_table(table, str(path))


def write_train_test(
    out_dir: str | Path, train_rows: list[dict[str, Any]], test_rows: list[dict[str, Any]]
) -> tuple[Path, Path]:
    """``train.parquet`` and ``test.parquet`` under ``out_dir`` (created); returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train_path, test_path = out / "train.parquet", out / "test.parquet"
    write_rows(train_path, train_rows)
    write_rows(test_path, test_rows)
    return train_path, test_path


def read_raw_rows(path: str | Path, prompt_key: str = "prompt") -> list[dict[str, Any]]:
    """The rows of a verl parquet file as stored, once the file is found readable and has the
    columns training needs (``dapo.data.check`` then checks each row)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise DataError(
            f"data file {p} does not exist: point data.train_files / data.val_files at a verl parquet file"
        )
    try:
        table = pq.read_table(str(p))
    except Exception as e:  # pyarrow raises several unrelated types for a bad file
        raise DataError(f"data file {p} is not readable parquet ({e})") from e
    missing = [c for c in (prompt_key, *REQUIRED_COLUMNS) if c not in table.column_names]
    if missing:
        raise DataError(
            f"data file {p} lacks column(s) {missing} (has {table.column_names}); verl data needs "
            f"'{prompt_key}' (chat list), 'data_source' and 'reward_model' with 'ground_truth' "
            f"(see `dapo preprocess` to convert your data; set data.prompt_key if the prompt column has another name)"
        )
    return table.to_pylist()


def read_rows(path: str | Path, prompt_key: str = "prompt") -> list[dict[str, Any]]:
    """All rows of a verl parquet file, checked for the columns training needs."""
    p = Path(path).expanduser()
    rows = read_raw_rows(p, prompt_key)
    for i, row in enumerate(rows):
        row["prompt"] = _normalise_prompt(row.get(prompt_key), p, i, prompt_key)
        gt = row.get("reward_model") or {}
        if isinstance(gt, str):
            gt = json.loads(gt)
            row["reward_model"] = gt
        if not isinstance(gt, dict) or gt.get("ground_truth") in (None, ""):
            raise DataError(
                f"{p} row {i}: reward_model.ground_truth is missing; every row needs the reference answer "
                "(fix or drop the row)"
            )
        extra = row.get("extra_info")
        if isinstance(extra, str):
            extra = json.loads(extra)
        row["extra_info"] = dict(extra or {})
    return rows


def _normalise_prompt(value: Any, path: Path, i: int, key: str) -> list[dict[str, str]]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            value = [{"role": "user", "content": value}]
    if hasattr(value, "tolist"):
        value = value.tolist()
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(m, dict) and "content" in m for m in value)
    ):
        raise DataError(
            f"{path} row {i}: column '{key}' must be a chat list like [{{'role': 'user', 'content': '...'}}], "
            f"got {str(value)[:80]!r}"
        )
    return [{"role": str(m.get("role", "user")), "content": str(m["content"])} for m in value]
