"""`dapo data check`: every planted fault in the broken fixture is found at its row; summary."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from dapo.data.check import check_file, register

FIX = Path(__file__).parent / "fixtures"

# row -> (column, severity) planted in tests/fixtures/broken.jsonl
PLANTED = {
    1: ("reward_model.ground_truth", "error"),
    2: ("prompt", "error"),
    3: ("prompt[0].content", "error"),
    4: ("data_source", "error"),
    5: ("reward_model", "error"),
    6: ("extra_info.index", "warning"),
    7: ("data_source", "error"),
    8: ("prompt[0].role", "error"),
    9: ("json", "error"),
}


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dapo")
    data = parser.add_subparsers(dest="command").add_parser("data")
    register(data.add_subparsers(dest="data_command"))
    args = parser.parse_args(argv)
    return args.func(args)


def test_finds_each_planted_fault_by_row():
    report = check_file(FIX / "broken.jsonl")
    assert report.rows == 11
    found = {(p.row, p.column, p.severity) for p in report.problems}
    for row, (column, severity) in PLANTED.items():
        assert (row, column, severity) in found, (row, column, [str(p) for p in report.problems])
    flagged = {p.row for p in report.problems}
    assert 0 not in flagged and 10 not in flagged  # the clean rows
    assert report.rows_with_errors() == {r for r, (_, s) in PLANTED.items() if s == "error"}
    assert report.data_sources["math_dapo"] == 8 and report.data_sources["my/own_task"] == 1


def test_cli_output_and_exit_status(capsys):
    assert _cli(["data", "check", str(FIX / "broken.jsonl"), "--max-prompt-length", "20"]) == 1
    out = capsys.readouterr().out
    assert "error: row 1: reward_model.ground_truth: is missing or empty" in out
    assert "error: row 7: data_source: 'my/own_task' has no built-in scorer" in out
    assert "11 rows, 8 errors, 1 warnings" in out
    assert "prompts over max_prompt_length=20:" in out


def test_clean_parquet_with_tokenizer(tmp_path, capsys):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "what": 1, "is": 2, "1": 3, "+": 4, "?": 5}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(tmp_path / "tok")

    rows = [
        {
            "data_source": "arithmetic",
            "prompt": [{"role": "user", "content": "what is 1 + 1 ?" + " 1" * i}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": "2"},
            "extra_info": {"index": i},
        }
        for i in range(4)
    ]
    path = tmp_path / "clean.parquet"
    pq.write_table(pa.Table.from_pylist(rows), str(path))
    report = check_file(path, tokenizer_dir=str(tmp_path / "tok"), max_prompt_length=7)
    assert not report.problems
    assert report.length_unit == "tokens" and report.prompt_lengths == [6, 7, 8, 9]
    assert report.over_limit == 2
    code = _cli(
        [
            "data",
            "check",
            str(path),
            "--tokenizer",
            str(tmp_path / "tok"),
            "--max-prompt-length",
            "7",
            "--json",
        ]
    )
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["rows"] == 4 and summary["prompts_over_max_prompt_length"] == 2
    assert summary["data_sources"] == {"arithmetic": 4}
    assert summary["prompt_length_tokens"]["max"] == 9


def test_parquet_with_null_ground_truth_and_missing_column(tmp_path):
    rows = [
        {
            "data_source": "math_dapo",
            "prompt": [{"role": "user", "content": "q"}],
            "reward_model": {"ground_truth": g},
        }
        for g in ["1", None, ""]
    ]
    path = tmp_path / "gt.parquet"
    pq.write_table(pa.Table.from_pylist(rows), str(path))
    report = check_file(path)
    assert {p.row for p in report.errors} == {1, 2}
    assert all(p.column == "reward_model.ground_truth" for p in report.errors)

    path2 = tmp_path / "noprompt.parquet"
    pq.write_table(
        pa.Table.from_pylist([{"data_source": "math_dapo", "reward_model": {"ground_truth": "1"}}]),
        str(path2),
    )
    assert [str(p) for p in check_file(path2).errors] == [
        "error: row 0: prompt: column is missing; set data.prompt_key if the chat list has another name"
    ]


def test_missing_file():
    report = check_file(FIX / "nope.parquet")
    assert report.errors and "does not exist" in report.errors[0].message
