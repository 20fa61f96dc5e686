"""``dapo data check FILE [--tokenizer DIR]``: find schema problems in a verl data file, by row,
and summarise it (rows, data sources, prompt lengths, how many exceed max_prompt_length).

Errors are problems training would fail on or mis-score (no ground truth, a prompt that is
not a chat list, a role no chat template knows, a NUL byte, a data_source no built-in scorer
grades, a ground truth its scorer cannot compare); warnings are suspicious but usable
(duplicated ``extra_info.index``, no ``ability`` column). The exit status is 1 when any error is
found. ``dapo train`` runs the same check (:func:`refuse_bad_rows`, with the run's
:class:`RowRules`) before it loads the model, and refuses a file with any error.

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


@dataclass(frozen=True)
class RowRules:
    """What a row must hold for the run that reads it. ``builtin_scorer``: some reward function
    of the run is the built-in ``data_source`` router, so every row's data_source needs a built-in
    scorer and a ground truth that scorer can compare; ``ground_truth_as_str``: that router is
    given ``ground_truth_as_str=true`` (numbers are compared as strings)."""

    prompt_key: str = "prompt"
    reward_fn_key: str = "data_source"
    builtin_scorer: bool = True
    ground_truth_as_str: bool = False


def rules_from_config(cfg: Any) -> RowRules:
    """The rules of a run config (``dapo.run_config.build_run_config(...).cfg``): the built-in
    router scores the rows unless ``custom_reward_function.path`` is set or every one of
    ``reward_model.objectives`` names its own file."""
    objectives = list(cfg.reward_model.objectives or [])
    if objectives:
        builtin_kwargs = [dict(o.reward_kwargs) for o in objectives if not o.path]
    else:
        builtin_kwargs = (
            [] if cfg.custom_reward_function.path else [dict(cfg.custom_reward_function.reward_kwargs)]
        )
    return RowRules(
        prompt_key=cfg.data.prompt_key,
        reward_fn_key=cfg.data.reward_fn_key,
        builtin_scorer=bool(builtin_kwargs),
        ground_truth_as_str=bool(builtin_kwargs)
        and all(kw.get("ground_truth_as_str") for kw in builtin_kwargs),
    )


@dataclass
class Problem:
    row: int | None
    column: str
    message: str
    severity: str = "error"

    def __str__(self) -> str:
        if self.row is None and self.column == "file":  # not "file: file: ..."
            return f"{self.severity}: file: {self.message}"
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
        add(
            i,
            key,
            "is a plain string; verl expects a chat list: store it as "
            "[{'role': 'user', 'content': <the text>}] (`dapo preprocess` converts a file)",
        )
        return None
    if hasattr(value, "tolist"):
        value = value.tolist()
    if not isinstance(value, list) or not value:
        add(
            i,
            key,
            f"must be a non-empty chat list like [{{'role': 'user', 'content': '...'}}], got {type(value).__name__}",
        )
        return None
    ok = True
    for j, msg in enumerate(value):
        if not isinstance(msg, dict):
            add(i, f"{key}[{j}]", f"must be a mapping with role and content, got {type(msg).__name__}")
            ok = False
            continue
        role, content = msg.get("role"), msg.get("content")
        if not isinstance(content, str) or not content.strip():
            add(
                i, f"{key}[{j}].content", "is missing or empty; give every message its text (or drop the row)"
            )
            ok = False
        elif "\x00" in content:
            add(
                i,
                f"{key}[{j}].content",
                f"has a NUL byte (\\x00) at character {content.index(chr(0))}; tokenizers and chat "
                "templates mis-read it: remove it from the data",
            )
            ok = False
        if role not in ROLES:
            add(
                i,
                f"{key}[{j}].role",
                f"{role!r} is not a chat role; chat templates drop or refuse it: use one of {', '.join(ROLES)}",
            )
            ok = False
    if ok and value[-1].get("role") == "assistant":
        add(i, key, "ends with an assistant message; generation would continue it", "warning")
    return value if ok else None


def _as_mapping(value: Any) -> Any:
    """A mapping column as a mapping: verl files may hold it as JSON text."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def check_rows(
    rows: list[Any],
    report: CheckReport,
    prompt_key: str = "prompt",
    reward_fn_key: str = "data_source",
    rules: RowRules | None = None,
) -> list[list[dict[str, str]] | None]:
    """Add every row's problems to ``report``; returns each row's chat list (None when unusable).
    ``rules`` (default: ``RowRules(prompt_key, reward_fn_key)``) says what the run needs."""
    from dapo.reward.scorers import KNOWN_SOURCES, UnknownDataSourceError, ground_truth_problem, scorer_for

    rules = rules or RowRules(prompt_key=prompt_key, reward_fn_key=reward_fn_key)
    prompt_key, reward_fn_key = rules.prompt_key, rules.reward_fn_key

    def add(row: int | None, column: str, message: str, severity: str = "error") -> None:
        report.problems.append(Problem(row, column, message, severity))

    prompts: list[list[dict[str, str]] | None] = []
    seen_index: dict[Any, int] = {}
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            if row is not None:
                add(i, "row", f"is not a record ({type(row).__name__})")
            prompts.append(None)
            continue
        prompts.append(_check_prompt(i, row.get(prompt_key), prompt_key, add) if prompt_key in row else None)
        if prompt_key not in row:
            add(i, prompt_key, "column is missing; set data.prompt_key if the chat list has another name")

        ds = row.get(reward_fn_key)
        known = False
        if not isinstance(ds, str) or not ds.strip():
            add(i, reward_fn_key, "is missing or empty; it selects the reward scorer: set it on every row")
        else:
            report.data_sources[ds] += 1
            known = True
            if rules.builtin_scorer:
                try:
                    scorer_for(ds)
                except UnknownDataSourceError:
                    known = False
                    add(
                        i,
                        reward_fn_key,
                        f"{ds!r} has no built-in scorer (built-in: {', '.join(KNOWN_SOURCES)}); set "
                        "custom_reward_function.path to your reward function, or fix the data_source",
                    )

        rm = _as_mapping(row.get("reward_model"))
        if not isinstance(rm, dict):
            add(i, "reward_model", "must be a mapping like {'style': 'rule', 'ground_truth': '4'}")
        else:
            gt = rm.get("ground_truth")
            if gt is None or (isinstance(gt, str) and not gt.strip()):
                add(
                    i,
                    "reward_model.ground_truth",
                    "is missing or empty; every row needs the reference answer",
                )
            elif not isinstance(gt, str | dict | list | int | float):
                add(i, "reward_model.ground_truth", f"has unexpected type {type(gt).__name__}")
            elif (nul := _nul_byte_at(gt)) is not None:
                add(
                    i,
                    "reward_model.ground_truth",
                    f"has a NUL byte (\\x00) at {nul}; no answer can match it, "
                    "so every response would score wrong: remove it",
                )
            elif rules.builtin_scorer and known:
                why = ground_truth_problem(ds, gt, ground_truth_as_str=rules.ground_truth_as_str)
                if why:
                    add(i, "reward_model.ground_truth", why)
            style = rm.get("style")
            if style not in (None, "rule", "model") and not str(style).startswith("rule"):
                add(i, "reward_model.style", f"{style!r} is not 'rule' or 'model'", "warning")

        extra = _as_mapping(row.get("extra_info"))
        if extra is not None and not isinstance(extra, dict):
            add(i, "extra_info", f"must be a mapping (or null), got {type(extra).__name__}")
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
    rules: RowRules | None = None,
) -> CheckReport:
    """Every problem of one data file (``rules`` replaces ``prompt_key`` and ``reward_fn_key``)."""
    rules = rules or RowRules(prompt_key=prompt_key, reward_fn_key=reward_fn_key)
    p = Path(path).expanduser()
    report = CheckReport(str(p), max_prompt_length=max_prompt_length)
    rows = _load(p, report)
    if rows is None:
        return report
    report.rows = len(rows)
    if not rows:
        report.problems.append(Problem(None, "file", "has no rows"))
        return report
    prompts = check_rows(rows, report, rules=rules)
    _measure(prompts, report, tokenizer_dir)
    return report


def refuse_bad_rows(files: list[str], rules: RowRules, files_key: str = "data.train_files") -> None:
    """``dapo train``'s gate, before the model loads: raise a DataError naming the first error of
    the first file that has one (file, row, field, what is wrong and how to fix it) and how many
    more rows have errors, so that no row the run cannot score reaches a step. The files are read
    as training reads them (a missing or unreadable file gets the loader's message)."""
    from dapo.data.parquet import DataError, read_raw_rows

    bad: list[CheckReport] = []
    for path in files:
        report = CheckReport(str(Path(path).expanduser()))
        rows = read_raw_rows(path, rules.prompt_key)
        if not rows:
            raise DataError(
                f"{files_key}: {report.path} has no rows; point the key at a file with prompts "
                "(`dapo data check FILE` checks one)"
            )
        check_rows(rows, report, rules=rules)
        if report.errors:
            bad.append(report)
    if not bad:
        return
    first = bad[0].errors[0]
    more = sum(len(r.rows_with_errors()) for r in bad) - 1
    tail = f"; and {more} more row{'s' if more != 1 else ''} with errors" if more > 0 else ""
    raise DataError(
        f"{files_key}: {bad[0].path} row {first.row}: {first.column} {first.message}{tail} "
        f"(`dapo data check {bad[0].path}` lists every problem)"
    )


def run(args: argparse.Namespace) -> int:
    rules = RowRules(
        prompt_key=args.prompt_key,
        reward_fn_key=args.reward_fn_key,
        builtin_scorer=not args.custom_reward,
        ground_truth_as_str=args.ground_truth_as_str,
    )
    report = check_file(
        args.file, tokenizer_dir=args.tokenizer, max_prompt_length=args.max_prompt_length, rules=rules
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
    parser.add_argument(
        "--custom-reward",
        action="store_true",
        help="the rows are scored by custom_reward_function.path: any data_source and ground truth goes",
    )
    parser.add_argument(
        "--ground-truth-as-str",
        action="store_true",
        help="the run sets custom_reward_function.reward_kwargs.ground_truth_as_str=true (numbers compare as strings)",
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


def _nul_byte_at(value: Any, where: str = "") -> str | None:
    """Where a NUL byte is in a ground truth (a string, or one inside a list or dict)."""
    if isinstance(value, str):
        return f"{where + ' ' if where else ''}character {value.index(chr(0))}" if "\x00" in value else None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _nul_byte_at(item, f"{where}[{key!r}]")
        if found is not None:
            return found
    return None
