"""``dapo data check FILE [--tokenizer DIR]``: find schema problems in a verl data file, by row,
and summarise it (rows, data sources, prompt lengths, how many exceed max_prompt_length).

Errors are problems training would fail on or mis-score (no ground truth, a prompt that is
not a chat list, ...); warnings are suspicious but usable (an unknown data_source needs
``custom_reward_function.path``; duplicated ``extra_info.index``; an unusual role).
The exit status is 1 when any error is found.

The CLI owner calls :func:`register` with an argparse subparsers object.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROLES = ("system", "user", "assistant", "tool")


@dataclass
class Problem:
    row: int | None
    column: str
    message: str
    severity: str = "error"

    def __str__(self) -> str:
        where = f"row {self.row}" if self.row is not None else "file"
        return f"{self.severity}: {where}: {self.column}: {self.message}"


@dataclass
class CheckReport:
    path: str
    rows: int = 0
    problems: list[Problem] = field(default_factory=list)
    data_sources: Counter = field(default_factory=Counter)
    prompt_lengths: list[int] = field(default_factory=list)
    length_unit: str = "characters"
    max_prompt_length: int | None = None

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "warning"]

    def rows_with_errors(self) -> set[int]:
        return {p.row for p in self.errors if p.row is not None}

    @property
    def over_limit(self) -> int:
        if self.max_prompt_length is None:
            return 0
        return sum(1 for n in self.prompt_lengths if n > self.max_prompt_length)

    def summary(self) -> dict[str, Any]:
        lengths = sorted(self.prompt_lengths)
        out: dict[str, Any] = {
            "file": self.path,
            "rows": self.rows,
            "errors": len(self.errors),
            "warnings": len(self.warnings),
            "rows_with_errors": len(self.rows_with_errors()),
            "data_sources": dict(self.data_sources.most_common()),
        }
        if lengths:
            out[f"prompt_length_{self.length_unit}"] = {
                "min": lengths[0],
                "mean": round(sum(lengths) / len(lengths), 1),
                "p95": lengths[min(len(lengths) - 1, int(0.95 * len(lengths)))],
                "max": lengths[-1],
            }
        if self.max_prompt_length is not None:
            out["max_prompt_length"] = self.max_prompt_length
            out["prompts_over_max_prompt_length"] = self.over_limit
        return out


def _load(path: Path, report: CheckReport) -> list[Any] | None:
    if not path.is_file():
        report.problems.append(Problem(None, "file", f"{path} does not exist"))
        return None
    try:
        if path.suffix.lower() == ".parquet":
            import pyarrow.parquet as pq

            return pq.read_table(str(path)).to_pylist()
        if path.suffix.lower() in (".jsonl", ".ndjson"):
            rows: list[Any] = []
            for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    report.problems.append(
                        Problem(len(rows), "json", f"line {lineno + 1} is not valid JSON ({exc.msg})")
                    )
                    rows.append(None)
            return rows
        if path.suffix.lower() == ".json":
            return list(json.loads(path.read_text(encoding="utf-8")))
    except Exception as exc:
        report.problems.append(Problem(None, "file", f"cannot read {path}: {exc}"))
        return None
    report.problems.append(
        Problem(None, "file", f"unsupported file type {path.suffix!r} (.parquet, .jsonl, .json)")
    )
    return None


def _check_prompt(i: int, value: Any, key: str, add) -> list[dict[str, str]] | None:
    if isinstance(value, str):
        add(i, key, "is a plain string; verl expects a chat list [{'role': 'user', 'content': ...}]")
        return None
    if hasattr(value, "tolist"):
        value = value.tolist()
    if not isinstance(value, list) or not value:
        add(i, key, f"must be a non-empty chat list, got {type(value).__name__}")
        return None
    ok = True
    for j, msg in enumerate(value):
        if not isinstance(msg, dict):
            add(i, f"{key}[{j}]", f"must be a mapping with role and content, got {type(msg).__name__}")
            ok = False
            continue
        role, content = msg.get("role"), msg.get("content")
        if not isinstance(content, str) or not content.strip():
            add(i, f"{key}[{j}].content", "is missing or empty")
            ok = False
        if role not in ROLES:
            add(
                i,
                f"{key}[{j}].role",
                f"{role!r} is not one of {ROLES}",
                "warning" if isinstance(role, str) else "error",
            )
    if ok and value[-1].get("role") == "assistant":
        add(i, key, "ends with an assistant message; generation would continue it", "warning")
    return value if ok else None


def check_rows(
    rows: list[Any], report: CheckReport, prompt_key: str = "prompt", reward_fn_key: str = "data_source"
) -> list[list[dict[str, str]] | None]:
    from dapo.reward.scorers import scorer_for

    def add(row: int | None, column: str, message: str, severity: str = "error") -> None:
        report.problems.append(Problem(row, column, message, severity))

    prompts: list[list[dict[str, str]] | None] = []
    seen_index: dict[Any, int] = {}
    unknown_sources: dict[str, int] = {}
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            if row is not None:
                add(i, "row", f"is not a record ({type(row).__name__})")
            prompts.append(None)
            continue
        prompts.append(_check_prompt(i, row.get(prompt_key), prompt_key, add) if prompt_key in row else None)
        if prompt_key not in row:
            add(i, prompt_key, "column is missing")

        ds = row.get(reward_fn_key)
        if not isinstance(ds, str) or not ds.strip():
            add(i, reward_fn_key, "is missing or empty; it selects the reward scorer")
        else:
            report.data_sources[ds] += 1
            try:
                scorer_for(ds)
            except NotImplementedError:
                unknown_sources.setdefault(ds, i)

        rm = row.get("reward_model")
        if isinstance(rm, str):
            try:
                rm = json.loads(rm)
            except json.JSONDecodeError:
                rm = None
        if not isinstance(rm, dict):
            add(i, "reward_model", "must be a mapping with ground_truth (and style)")
        else:
            gt = rm.get("ground_truth")
            if gt is None or (isinstance(gt, str) and not gt.strip()):
                add(i, "reward_model.ground_truth", "is missing or empty")
            elif not isinstance(gt, str | dict | list | int | float):
                add(i, "reward_model.ground_truth", f"has unexpected type {type(gt).__name__}")
            style = rm.get("style")
            if style not in (None, "rule", "model") and not str(style).startswith("rule"):
                add(i, "reward_model.style", f"{style!r} is not 'rule' or 'model'", "warning")

        extra = row.get("extra_info")
        if extra is not None and not isinstance(extra, dict):
            add(i, "extra_info", f"must be a mapping, got {type(extra).__name__}")
        elif isinstance(extra, dict) and extra.get("index") is not None:
            idx = extra["index"]
            if idx in seen_index:
                add(
                    i,
                    "extra_info.index",
                    f"{idx!r} repeats row {seen_index[idx]}; indices should be unique",
                    "warning",
                )
            else:
                seen_index[idx] = i
        if "ability" not in row:
            add(i, "ability", "column is missing (informational only)", "warning")
    for ds, first in unknown_sources.items():
        add(
            first,
            reward_fn_key,
            f"{ds!r} has no built-in scorer ({report.data_sources[ds]} rows); set custom_reward_function.path",
            "warning",
        )
    return prompts


def _measure(prompts: list, report: CheckReport, tokenizer_dir: str | None) -> None:
    tokenizer = None
    if tokenizer_dir:
        try:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
            report.length_unit = "tokens"
        except Exception as exc:
            report.problems.append(
                Problem(None, "--tokenizer", f"cannot load a tokenizer from {tokenizer_dir}: {exc}")
            )
    for messages in prompts:
        if messages is None:
            continue
        if tokenizer is None:
            report.prompt_lengths.append(sum(len(m["content"]) for m in messages))
            continue
        try:
            if getattr(tokenizer, "chat_template", None):
                ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            else:
                ids = tokenizer("\n".join(m["content"] for m in messages))["input_ids"]
            report.prompt_lengths.append(len(ids))
        except Exception as exc:
            report.problems.append(Problem(None, "--tokenizer", f"tokenizing failed: {exc}"))
            return


def check_file(
    path: str | Path,
    tokenizer_dir: str | None = None,
    prompt_key: str = "prompt",
    max_prompt_length: int | None = None,
    reward_fn_key: str = "data_source",
) -> CheckReport:
    p = Path(path).expanduser()
    report = CheckReport(str(p), max_prompt_length=max_prompt_length)
    rows = _load(p, report)
    if rows is None:
        return report
    report.rows = len(rows)
    if not rows:
        report.problems.append(Problem(None, "file", "has no rows"))
        return report
    prompts = check_rows(rows, report, prompt_key, reward_fn_key)
    _measure(prompts, report, tokenizer_dir)
    return report


def run(args: argparse.Namespace) -> int:
    report = check_file(
        args.file,
        tokenizer_dir=args.tokenizer,
        prompt_key=args.prompt_key,
        max_prompt_length=args.max_prompt_length,
        reward_fn_key=args.reward_fn_key,
    )
    shown = report.problems if args.all else report.problems[: args.max_problems]
    for problem in shown:
        print(problem)
    if len(shown) < len(report.problems):
        print(f"... {len(report.problems) - len(shown)} more problems (--all shows every one)")
    summary = report.summary()
    if args.json:
        print(json.dumps(summary, indent=2, ensure_ascii=False))
    else:
        print(
            f"{summary['file']}: {summary['rows']} rows, {summary['errors']} errors, {summary['warnings']} warnings"
        )
        print("data sources: " + ", ".join(f"{k} ({v})" for k, v in summary["data_sources"].items()))
        for key, stats in summary.items():
            if key.startswith("prompt_length_"):
                unit = key.removeprefix("prompt_length_")
                print(
                    f"prompt length ({unit}): min {stats['min']}, mean {stats['mean']}, p95 {stats['p95']}, max {stats['max']}"
                )
        if report.max_prompt_length is not None:
            print(f"prompts over max_prompt_length={report.max_prompt_length}: {report.over_limit}")
    return 1 if report.errors else 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="verl data file (.parquet, .jsonl or .json)")
    parser.add_argument(
        "--tokenizer", default=None, help="tokenizer directory: measure prompt lengths in tokens"
    )
    parser.add_argument("--max-prompt-length", type=int, default=None, help="count prompts longer than this")
    parser.add_argument("--prompt-key", default="prompt", help="prompt column (data.prompt_key)")
    parser.add_argument(
        "--reward-fn-key", default="data_source", help="data source column (data.reward_fn_key)"
    )
    parser.add_argument("--max-problems", type=int, default=50, help="print at most this many problems")
    parser.add_argument("--all", action="store_true", help="print every problem")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.set_defaults(func=run)


def register(data_subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``check`` to the ``dapo data`` command group's subparsers (``dapo data check``)."""
    parser = data_subparsers.add_parser("check", help="find schema problems by row; summarise the file")
    add_arguments(parser)
    return parser


register_check = register


def main(argv: list[str] | None = None) -> int:  # pragma: no cover - convenience
    parser = argparse.ArgumentParser(prog="dapo data check")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
