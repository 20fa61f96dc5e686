"""Row converters for each published data format, and the file reader/writer they share."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from dapo.errors import DapoError
from dapo.reward.scorers.math_dapo import last_boxed_only_string, remove_boxed

GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
MATH_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'


class PreprocessError(DapoError, ValueError):
    """A problem with the input, naming the file, row or column and how to fix it."""


class RowError(ValueError):
    """This row cannot be converted (the message says why)."""


# ------------------------------------------------------------------ reading / writing
def read_records(path: str | Path) -> list[dict[str, Any]]:
    p = Path(path).expanduser()
    if not p.is_file():
        raise PreprocessError(f"input file {p} does not exist")
    suffix = "".join(p.suffixes[-2:]).lower() if p.suffix == ".gz" else p.suffix.lower()
    try:
        if suffix == ".parquet":
            return pq.read_table(str(p)).to_pylist()
        if suffix in (".jsonl", ".ndjson"):
            rows = []
            with open(p, encoding="utf-8") as f:
                for lineno, line in enumerate(f, start=1):
                    if line.strip():
                        try:
                            rows.append(json.loads(line))
                        except json.JSONDecodeError as exc:
                            raise PreprocessError(f"{p} line {lineno}: not valid JSON ({exc.msg})") from exc
            return rows
        if suffix == ".json":
            data = json.loads(p.read_text(encoding="utf-8"))
            if isinstance(data, dict):  # {"data": [...]} or a single MATH problem
                data = data.get("data", data.get("rows", [data]))
            return list(data)
        if suffix in (".csv", ".tsv"):
            with open(p, encoding="utf-8", newline="") as f:
                return list(csv.DictReader(f, delimiter="\t" if suffix == ".tsv" else ","))
    except PreprocessError:
        raise
    except Exception as exc:
        raise PreprocessError(f"cannot read {p}: {exc}") from exc
    raise PreprocessError(f"{p}: unsupported file type {suffix!r}; use .jsonl, .json, .csv, .tsv or .parquet")


def write_parquet(rows: list[dict[str, Any]], out_dir: str | Path, split: str) -> Path:
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{split}.parquet"
    pq.write_table(pa.Table.from_pylist(rows), str(path))
    return path


# ------------------------------------------------------------------ helpers
def _get(record: dict[str, Any], *names: str) -> Any:
    """The first present, non-empty field among ``names`` (case-insensitive)."""
    lower = {str(k).lower(): v for k, v in record.items()}
    for name in names:
        value = lower.get(name.lower())
        if value is not None and value != "":
            return value
    return None


def _require(record: dict[str, Any], *names: str) -> Any:
    value = _get(record, *names)
    if value is None:
        raise RowError(f"no {' / '.join(names)} field")
    return value


def _row(
    data_source: str, content: str, ground_truth: str, split: str, index: int, ability: str = "math", **extra
):
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": content}],
        "ability": ability,
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"split": split, "index": index, **extra},
    }


def gsm8k_answer(answer: str) -> str:
    if "####" not in answer:
        raise RowError("answer has no '#### <number>' line")
    final = answer.split("####")[-1].strip().replace(",", "")
    if not final:
        raise RowError("nothing after '####' in the answer")
    return final


def boxed_answer(solution: str) -> str:
    boxed = last_boxed_only_string(solution)
    inner = remove_boxed(boxed) if boxed is not None else None
    if inner is None:
        raise RowError("solution has no closed \\boxed{...} answer")
    return inner


def _is_verl_row(record: dict[str, Any]) -> bool:
    return isinstance(record.get("prompt"), list) and isinstance(record.get("reward_model"), dict)


def _passthrough(record: dict[str, Any], split: str, index: int, data_source: str | None) -> dict[str, Any]:
    gt = record["reward_model"].get("ground_truth")
    if gt is None or gt == "":
        raise RowError("reward_model.ground_truth is missing")
    extra = dict(record.get("extra_info") or {})
    extra.setdefault("split", split)
    extra.setdefault("index", index)
    return {
        "data_source": data_source or record.get("data_source") or "math_dapo",
        "prompt": [
            {"role": str(m.get("role", "user")), "content": str(m.get("content", ""))}
            for m in record["prompt"]
        ],
        "ability": record.get("ability") or "math",
        "reward_model": {"style": record["reward_model"].get("style") or "rule", "ground_truth": str(gt)},
        "extra_info": extra,
    }


# ------------------------------------------------------------------ formats
def convert_gsm8k(record: dict[str, Any], split: str, index: int, opts: dict[str, Any]) -> dict[str, Any]:
    question = str(_require(record, "question"))
    answer = str(_require(record, "answer"))
    return _row(
        "openai/gsm8k",
        f"{question} {GSM8K_INSTRUCTION}",
        gsm8k_answer(answer),
        split,
        index,
        answer=answer,
        question=question,
    )


def convert_math(record: dict[str, Any], split: str, index: int, opts: dict[str, Any]) -> dict[str, Any]:
    problem = str(_require(record, "problem", "question"))
    answer = _get(record, "answer")
    gt = str(answer) if answer is not None else boxed_answer(str(_require(record, "solution")))
    extra = {
        k: str(v)
        for k, v in (("level", _get(record, "level")), ("type", _get(record, "type")))
        if v is not None
    }
    return _row(
        opts.get("data_source") or "DigitalLearningGmbH/MATH-lighteval",
        f"{problem} {MATH_INSTRUCTION}",
        gt,
        split,
        index,
        **extra,
    )


def dapo_prompt(problem: str) -> str:
    return f"{DAPO_PREFIX}{problem}{DAPO_SUFFIX}"


def convert_dapo_math(record: dict[str, Any], split: str, index: int, opts: dict[str, Any]) -> dict[str, Any]:
    if _is_verl_row(record):  # the published parquet already follows the verl schema
        return _passthrough(record, split, index, None)
    # flattened variants: prompt / problem text with a solution / answer column
    problem = str(_require(record, "prompt", "problem", "question"))
    gt = str(_require(record, "solution", "answer", "ground_truth"))
    if "Answer:" not in problem:
        problem = dapo_prompt(problem)
    return _row("math_dapo", problem, gt, split, index)


def convert_aime2024(record: dict[str, Any], split: str, index: int, opts: dict[str, Any]) -> dict[str, Any]:
    if _is_verl_row(record):
        return _passthrough(record, split, index, None)
    problem = str(_require(record, "problem", "question", "prompt"))
    answer = str(_require(record, "answer", "ground_truth")).strip()
    problem_id = _get(record, "id")
    extra = {"id": str(problem_id)} if problem_id is not None else {}
    return _row(opts.get("data_source") or "aime2024", dapo_prompt(problem), answer, split, index, **extra)


def convert_generic(record: dict[str, Any], split: str, index: int, opts: dict[str, Any]) -> dict[str, Any]:
    pcol, acol = opts.get("prompt_column") or "prompt", opts.get("answer_column") or "answer"
    if pcol not in record:
        raise RowError(f"no column {pcol!r} (set --prompt-column)")
    if acol not in record:
        raise RowError(f"no column {acol!r} (set --answer-column)")
    prompt, answer = record[pcol], record[acol]
    if prompt is None or str(prompt).strip() == "":
        raise RowError(f"column {pcol!r} is empty")
    if answer is None or str(answer).strip() == "":
        raise RowError(f"column {acol!r} is empty")
    extract = opts.get("answer_format") or "raw"
    answer = str(answer).strip()
    if extract == "gsm8k":
        answer = gsm8k_answer(answer)
    elif extract == "boxed":
        answer = boxed_answer(answer)
    if isinstance(prompt, list):
        messages = [
            {"role": str(m.get("role", "user")), "content": str(m.get("content", ""))} for m in prompt
        ]
    else:
        text = str(prompt)
        template = opts.get("template")
        if template:
            text = template.replace("{prompt}", text)
        elif opts.get("instruction"):
            text = f"{text} {opts['instruction']}"
        messages = [{"role": "user", "content": text}]
    if opts.get("system_prompt"):
        messages = [{"role": "system", "content": opts["system_prompt"]}] + messages
    extra = {c: record.get(c) for c in (opts.get("extra_columns") or []) if c in record}
    data_source = str(record.get(opts["data_source_column"])) if opts.get("data_source_column") else None
    row = _row(
        data_source or opts.get("data_source") or "math_dapo",
        "",
        answer,
        split,
        index,
        ability=opts.get("ability") or "math",
        **extra,
    )
    row["prompt"] = messages
    return row


@dataclass
class FormatSpec:
    convert: Callable[[dict[str, Any], str, int, dict[str, Any]], dict[str, Any]]
    help: str
    extra_args: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


_DS_ARG = ("--data-source", {"default": None, "help": "override the data_source written to each row"})

FORMATS: dict[str, FormatSpec] = {
    "gsm8k": FormatSpec(
        convert_gsm8k, "GSM8K (question, answer with '#### <number>') -> data_source openai/gsm8k"
    ),
    "math": FormatSpec(
        convert_math,
        "MATH / MATH-lighteval (problem, solution with \\boxed{}) -> DigitalLearningGmbH/MATH-lighteval",
        [_DS_ARG],
    ),
    "dapo-math-17k": FormatSpec(
        convert_dapo_math, "DAPO-Math-17k parquet (verl schema, or prompt/solution columns) -> math_dapo"
    ),
    "aime2024": FormatSpec(
        convert_aime2024,
        "AIME 2024 (problem, answer[, id]) -> aime2024 with the DAPO 'Answer:' prompt",
        [_DS_ARG],
    ),
    "generic": FormatSpec(
        convert_generic,
        "any jsonl/json/csv/parquet: choose the prompt and answer columns",
        [
            (
                "--prompt-column",
                {"default": "prompt", "help": "column with the question text (or a chat list)"},
            ),
            ("--answer-column", {"default": "answer", "help": "column with the reference answer"}),
            (
                "--data-source",
                {"default": "math_dapo", "help": "data_source for every row (selects the scorer)"},
            ),
            ("--data-source-column", {"default": None, "help": "take data_source from this column instead"}),
            (
                "--answer-format",
                {"choices": ["raw", "gsm8k", "boxed"], "default": "raw", "help": "how to extract the answer"},
            ),
            (
                "--instruction",
                {"default": None, "help": "text appended to each prompt (e.g. the answer format)"},
            ),
            (
                "--template",
                {"default": None, "help": "prompt template containing {prompt}; overrides --instruction"},
            ),
            ("--system-prompt", {"default": None, "help": "system message put before each prompt"}),
            ("--ability", {"default": "math", "help": "ability column value"}),
            ("--extra-columns", {"nargs": "*", "default": [], "help": "columns copied into extra_info"}),
        ],
    ),
}


def preprocess_file(
    fmt: str,
    input_path: str | Path,
    output_dir: str | Path,
    split: str = "train",
    limit: int | None = None,
    skip_invalid: bool = False,
    options: dict[str, Any] | None = None,
) -> tuple[Path, int, int]:
    """Convert ``input_path`` in format ``fmt``; returns (output path, rows written, rows skipped)."""
    if fmt not in FORMATS:
        raise PreprocessError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    opts = dict(options or {})
    records = read_records(input_path)
    if limit is not None:
        records = records[: max(0, limit)]
    if not records:
        raise PreprocessError(f"{input_path}: no rows to convert")
    rows, problems = [], []
    for i, record in enumerate(records):
        if not isinstance(record, dict):
            problems.append(f"row {i}: not a record ({type(record).__name__})")
            continue
        try:
            rows.append(FORMATS[fmt].convert(record, split, i, opts))
        except RowError as exc:
            problems.append(f"row {i}: {exc}")
    if problems and not skip_invalid:
        shown = "\n  ".join(problems[:10])
        more = f"\n  ... and {len(problems) - 10} more" if len(problems) > 10 else ""
        columns = sorted({str(k) for r in records[:50] if isinstance(r, dict) for k in r})
        raise PreprocessError(
            f"{input_path}: {len(problems)} of {len(records)} rows cannot be converted as {fmt} "
            f"(columns seen: {columns}):\n  {shown}{more}\nfix them, or pass --skip-invalid to drop them"
        )
    if not rows:
        raise PreprocessError(f"{input_path}: every row was invalid; nothing written")
    return write_parquet(rows, output_dir, split), len(rows), len(problems)
