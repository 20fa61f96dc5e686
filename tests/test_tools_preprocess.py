"""Tool variants of dapo preprocess, and the built-in tool task."""

from __future__ import annotations

from pathlib import Path

import pytest

import dapo.data.preprocess.tool_formats  # noqa: F401  (registers the tool formats)
from dapo.data.parquet import read_rows
from dapo.data.preprocess import preprocess_file

FIXTURES = Path(__file__).parent / "fixtures"


def test_gsm8k_tool_rows(tmp_path):
    out, n, _ = preprocess_file("gsm8k-tool", FIXTURES / "gsm8k.jsonl", tmp_path, split="train")
    rows = read_rows(out)
    assert n == len(rows) > 0
    r = rows[0]
    assert r["data_source"] == "openai/gsm8k" and r["reward_model"]["ground_truth"] == "91"
    assert [m["role"] for m in r["prompt"]] == ["system", "user"]
    assert "calc_gsm8k_reward" in r["prompt"][0]["content"] and r["prompt"][1]["content"].endswith("`####`.")
    e = r["extra_info"]
    assert e["need_tools_kwargs"] is True
    assert e["tools_kwargs"] == {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "91"}}}
    assert e["interaction_kwargs"]["ground_truth"] == "91" and e["index"] == 0


def test_dapo_math_tool_rows(tmp_path):
    out, n, _ = preprocess_file("dapo-math-17k-tool", FIXTURES / "dapo_math_17k.parquet", tmp_path)
    r = read_rows(out)[0]
    gt = r["reward_model"]["ground_truth"]
    assert r["extra_info"]["tools_kwargs"] == {"code_interpreter": {"create_kwargs": {"ground_truth": gt}}}
    assert r["extra_info"]["need_tools_kwargs"] is True


def test_cli_lists_the_tool_formats():
    import argparse

    from dapo.data.preprocess import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["preprocess", "gsm8k-tool", "--input", "x", "--output", "y"])
    assert args.format == "gsm8k-tool"


def test_builtin_tool_task(tmp_path):
    from dapo.tasks.arithmetic_tools import write_tool_task

    train, test = write_tool_task(tmp_path, train_size=200, test_size=40)
    tr, te = read_rows(train), read_rows(test)
    assert len(tr) == 200 and len(te) == 40
    assert not {r["prompt"][0]["content"] for r in tr} & {r["prompt"][0]["content"] for r in te}
    hard = [r for r in tr if r["extra_info"]["tier"] == "hard"]
    assert len(hard) == 150 and all("*" in r["prompt"][0]["content"] for r in hard)
    r = hard[0]
    a, b = r["prompt"][0]["content"].rstrip("=").split("*")
    assert r["reward_model"]["ground_truth"] == str(int(a) * int(b))
    assert r["extra_info"]["tools_kwargs"]["calculator"]["create_kwargs"]["ground_truth"] == str(
        int(a) * int(b)
    )


@pytest.mark.parametrize("fmt", ["gsm8k-tool", "dapo-math-17k-tool"])
def test_formats_registered(fmt):
    from dapo.data.preprocess.formats import FORMATS

    assert fmt in FORMATS
