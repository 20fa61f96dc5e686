"""Listing and describing `dapo` commands imports no model code: a command's module is imported
only when that command is parsed (`dapo.cli._Subcommands`)."""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys

import pyarrow.parquet as pq

from dapo.cli import _Subcommands, build_parser
from runs import subprocess_env

HELP = [
    ["--help"],
    ["train", "--help"],
    ["validate", "--help"],
    ["eval", "--help"],
    ["data", "--help"],
    ["data", "check", "--help"],
    ["data", "arithmetic-chat", "--help"],
    ["preprocess", "--help"],
    ["preprocess", "gsm8k", "--help"],
    ["view", "--help"],
    ["report", "--help"],
    ["model", "--help"],
    ["model", "import", "--help"],
    ["bench", "--help"],
]

# runs in a fresh interpreter: prints the usage line of each --help, then the heavy modules loaded
LIGHT_CHILD = """
import contextlib, io, json, sys
from dapo.cli import build_parser, main
build_parser()
usages = []
for argv in json.loads(sys.argv[1]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main(argv)
        except SystemExit as e:
            assert e.code == 0, (argv, e.code)
    usages.append(out.getvalue().splitlines()[0])
data = sys.argv[2:]
if data:
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["data", "arithmetic", "--output", data[0], "--train-size", "8", "--test-size", "4"]) == 0
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["data", "check", data[0] + "/train.parquet", "--json"]) == 0
    usages.append(out.getvalue())
print(json.dumps([usages, sorted(m for m in ("torch", "transformers") if m in sys.modules)]))
"""


def _light_child(*args: str) -> tuple[list[str], list[str]]:
    res = subprocess.run(
        [sys.executable, "-c", LIGHT_CHILD, *args], env=subprocess_env(), capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_help_of_every_command_imports_no_model_code():
    usages, heavy = _light_child(json.dumps(HELP))
    assert heavy == []
    # each --help printed its own command's usage, so each command was really parsed
    for usage, argv in zip(usages, HELP, strict=True):
        assert usage.startswith(" ".join(["usage: dapo", *argv[:-1], "[-h]"])), usage
    assert usages[0].startswith("usage: dapo [-h] COMMAND")


def test_data_arithmetic_and_check_import_no_model_code(tmp_path):
    (out,), heavy = _light_child("[]", str(tmp_path))
    assert heavy == []
    summary = json.loads(out)
    assert summary["rows"] == pq.read_metadata(tmp_path / "train.parquet").num_rows == 8
    assert summary["errors"] == 0


def _deferred(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command path, module, help listed) of every command whose module is imported on use."""
    for action in parser._actions:
        if isinstance(action, _Subcommands):
            listed = {a.dest: a.help for a in action._choices_actions}
            for name, module in action._modules.items():
                yield (*path, name), module, listed[name]
            for name, sub in action.choices.items():
                if name not in action._modules:
                    yield from _deferred(sub, (*path, name))


def test_listed_help_is_the_modules_own():
    deferred = list(_deferred(build_parser()))
    assert {p for p, _, _ in deferred} == {
        ("data", "check"),
        ("data", "arithmetic-chat"),
        ("preprocess",),
        ("view",),
        ("report",),
        ("model",),
        ("bench", "sampling"),
        ("bench", "rollout"),
        ("bench", "update"),
        ("bench", "cluster"),
    }
    for path, module, listed in deferred:
        scratch = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(module).register(scratch)
        (own,) = [a.help for a in scratch._choices_actions if a.dest == path[-1]]
        assert listed == own, path


def test_a_deferred_command_parses_with_its_modules_arguments():
    args = build_parser().parse_args(["bench", "sampling", "--steps", "3", "--skip", "threshold=0.2"])
    assert (args.command, args.bench_command, args.steps, args.skip) == (
        "bench",
        "sampling",
        3,
        [("threshold", 0.2)],
    )
    assert args.func.__module__ == "dapo.sampling.simulate"
    args = build_parser().parse_args(["model", "import", "x.gguf", "-o", "out"])
    assert (args.model_command, args.file, args.output, args.dtype) == ("import", "x.gguf", "out", "float32")
