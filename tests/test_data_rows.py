"""Rows a run cannot score are refused before step 1: `dapo data check` flags them and `dapo train`
refuses them with one line (file, row, field, what is wrong, the fix, how many more rows), through
one check (dapo.data.check). Real parquet files, the real CLI; a refused run loads no model and
logs no step."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dapo.cli import main
from dapo.data.check import RowRules, check_file, rules_from_config
from dapo.data.dataset import refuse_bad_data
from dapo.data.parquet import DataError
from fixtures.config_helpers import run_config
from runs import jsonl_rows, metric_rows, run_summary, train_args

NUL = chr(0)


def _rows(n: int, *, gt=lambda i: str(i), prompt=None, ds="arithmetic") -> list[dict]:
    prompt = prompt or (lambda i: [{"role": "user", "content": f"what is {i} + 0?"}])
    return [
        {
            "data_source": ds(i) if callable(ds) else ds,
            "prompt": prompt(i),
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": gt(i)},
            "extra_info": {"index": i},
        }
        for i in range(n)
    ]


def _write(tmp_path, name: str, rows: list[dict]):
    path = tmp_path / f"{name}.parquet"
    pq.write_table(pa.Table.from_pylist(rows), str(path))
    return path


def _errors(path, rules: RowRules | None = None) -> list[str]:
    return [str(p) for p in check_file(path, rules=rules).errors]


# name -> (rows, the field, the start of what check says about row 0)
BAD = {
    "list_ground_truth": (
        _rows(32, gt=lambda i: [str(i)]),
        "reward_model.ground_truth",
        "is a list ['0']; the math_dapo scorer for data_source 'arithmetic' compares the answer "
        "with one string, so every response would score wrong: store the reference answer as a "
        'string (e.g. "4", not ["4"])',
    ),
    "plain_string_prompt": (
        _rows(32, prompt=lambda i: f"what is {i}?"),
        "prompt",
        "is a plain string; verl expects a chat list: store it as [{'role': 'user', 'content': <the text>}]",
    ),
    "nul_byte": (
        _rows(32, prompt=lambda i: [{"role": "user", "content": f"what{NUL} is {i}?"}]),
        "prompt[0].content",
        "has a NUL byte (\\x00) at character 4",
    ),
    "nul_byte_ground_truth": (
        _rows(32, gt=lambda i: f"{i}{NUL}"),
        "reward_model.ground_truth",
        "has a NUL byte (\\x00) at character 1; no answer can match it, so every response would score wrong",
    ),
    "made_up_role": (
        _rows(32, prompt=lambda i: [{"role": "wizard", "content": f"what is {i}?"}]),
        "prompt[0].role",
        "'wizard' is not a chat role; chat templates drop or refuse it: use one of system, user, assistant, tool",
    ),
    "unknown_data_source": (
        _rows(32, ds="my/task"),
        "data_source",
        "'my/task' has no built-in scorer (built-in: openai/gsm8k, gsm8k, lighteval/MATH,",
    ),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_data_check_flags_every_row(name, tmp_path, capsys):
    rows, field, message = BAD[name]
    path = _write(tmp_path, name, rows)
    errors = _errors(path)
    assert len(errors) == 32 and errors[0].startswith(f"error: row 0: {field}: {message}")
    assert [e.split(":")[1] for e in errors] == [f" row {i}" for i in range(32)]
    assert main(["data", "check", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"error: row 31: {field}: " in out and f"{path}: 32 rows, 32 errors, 0 warnings" in out


@pytest.mark.parametrize("name", sorted(BAD))
def test_train_refuses_before_the_model_loads(name, tmp_path, tiny_random_model_dir, capsys):
    rows, field, message = BAD[name]
    bad = _write(tmp_path, name, rows)
    good = _write(tmp_path, "good", _rows(8))
    run_dir = tmp_path / "run"
    argv = train_args(run_dir, tiny_random_model_dir, bad, good, 2, "trainer.logger=[console,jsonl]")
    capsys.readouterr()
    assert main(argv) == 2
    out, err = capsys.readouterr()
    line = err.splitlines()[-1]
    assert line.startswith(f"dapo: data.train_files: {bad} row 0: {field} {message}")
    assert line.endswith(f"; and 31 more rows with errors (`dapo data check {bad}` lists every problem)")
    assert "Traceback" not in err
    assert "data: " not in out  # the prompts were never templated: no tokenizer, no model
    assert not (run_dir / "metrics.jsonl").exists()


def test_validation_files_are_checked_too_and_one_bad_row_is_named_alone(tmp_path):
    rows = _rows(8)
    rows[5]["prompt"][0]["role"] = "wizard"
    bad = _write(tmp_path, "val", rows)
    cfg = run_config()
    refuse_bad_data(cfg, [str(_write(tmp_path, "train", _rows(8)))], None)
    with pytest.raises(DataError) as e:
        refuse_bad_data(cfg, [str(_write(tmp_path, "train", _rows(8)))], [str(bad)])
    assert str(e.value).startswith(f"data.val_files: {bad} row 5: prompt[0].role 'wizard' is not a chat role")
    assert "more row" not in str(e.value)


def test_a_file_with_no_rows_is_refused_before_the_model_loads(tmp_path):
    """`dapo data check` says it has no rows; train said so only after loading the model, and
    blamed the prompt length."""
    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.Table.from_pylist(_rows(1)).slice(0, 0), str(empty))
    assert [str(p) for p in check_file(empty).problems] == ["error: file: has no rows"]
    with pytest.raises(DataError) as e:
        refuse_bad_data(run_config(), [str(empty)], None)
    assert str(e.value).startswith(
        f"data.train_files: {empty} has no rows; point the key at a file with prompts"
    )


def test_ground_truth_rules_follow_the_scorer_of_each_data_source(tmp_path):
    cases = [
        # (data_source, ground truth, flagged?)
        ("math_dapo", "4", False),
        ("math_dapo", ["4"], True),
        ("math_dapo", {"answer": "4"}, True),
        ("math_dapo", 4, True),  # verl's math_dapo fails on a number; ground_truth_as_str compares str(4)
        ("gsm8k", "4", False),
        ("gsm8k", 4, True),  # "4" == 4 is never true: every answer would score 0
        ("lighteval/MATH", 4, False),  # the symbolic verifier compares str(4)
        ("lighteval/MATH", ["4"], True),
        ("countdown", {"target": 24, "numbers": [4, 6]}, False),
        ("countdown", json.dumps({"target": 24, "numbers": [4, 6]}), False),
        ("countdown", [24, 4, 6], True),
        ("countdown", "24", True),
    ]
    # a parquet column has one type: one file per case
    flagged = []
    for k, (ds, gt, _) in enumerate(cases):
        path = _write(tmp_path, f"case{k}", _rows(1, gt=lambda i, gt=gt: gt, ds=ds))
        errors = _errors(path)
        assert all("reward_model.ground_truth" in e for e in errors), errors
        flagged.append(bool(errors))
    assert flagged == [bad for _, _, bad in cases]
    as_str = RowRules(ground_truth_as_str=True)
    for k in (3, 5):  # numbers compared as strings: fine; a list still is not a string
        assert _errors(tmp_path / f"case{k}.parquet", as_str) == []
    assert _errors(tmp_path / "case1.parquet", as_str) != []
    custom = RowRules(builtin_scorer=False)  # a custom reward function grades any shape
    for k in range(len(cases)):
        assert _errors(tmp_path / f"case{k}.parquet", custom) == []


def test_the_run_config_says_when_the_built_in_scorers_grade_the_rows(tmp_path):
    reward = tmp_path / "reward.py"
    reward.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n"
    )
    assert rules_from_config(run_config()) == RowRules()
    custom = rules_from_config(run_config(f"custom_reward_function.path={reward}"))
    assert custom.builtin_scorer is False
    as_str = rules_from_config(run_config("+custom_reward_function.reward_kwargs.ground_truth_as_str=true"))
    assert as_str == RowRules(ground_truth_as_str=True)
    both = "reward_model.objectives=[{name: a, reward_kwargs: {ground_truth_as_str: true}}, "
    mixed = rules_from_config(run_config(both + f"{{name: b, path: '{reward}'}}]"))
    assert mixed == RowRules(builtin_scorer=True, ground_truth_as_str=True)  # objective a is built-in
    only_files = f"reward_model.objectives=[{{name: a, path: '{reward}'}}, {{name: b, path: '{reward}'}}]"
    assert rules_from_config(run_config(only_files)).builtin_scorer is False
    # an unknown data_source passes the gate once a custom reward function scores it
    unknown = [str(_write(tmp_path, "unknown", _rows(4, ds="my/task")))]
    refuse_bad_data(run_config(f"custom_reward_function.path={reward}"), unknown, None)
    with pytest.raises(DataError, match="'my/task' has no built-in scorer"):
        refuse_bad_data(run_config(), unknown, None)
    assert main(["data", "check", unknown[0], "--custom-reward"]) == 0


NEVER_RIGHT = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return {"score": 0.0, "acc": False}
"""


def test_a_step_that_trains_nothing_dumps_its_groups_and_says_how_often_it_drew(
    tmp_path, tiny_random_model_dir, capsys
):
    reward = tmp_path / "never.py"
    reward.write_text(NEVER_RIGHT)
    data = _write(tmp_path, "train", _rows(32))
    run_dir, dumps = tmp_path / "run", tmp_path / "rollouts"
    argv = train_args(
        run_dir,
        tiny_random_model_dir,
        data,
        data,
        1,
        "trainer.logger=[console,jsonl]",
        "trainer.val_before_train=false",
        "data.val_max_samples=2",
        f"custom_reward_function.path={reward}",
        f"trainer.rollout_data_dir={dumps}",
        "algorithm.filter_groups.enable=true",
        "algorithm.filter_groups.max_num_gen_batches=6",
        # the posterior rule skips a prompt after one group without spread, so the step walks
        # the data over and over (the trend rule would confirm each one first)
        "algorithm.filter_groups.skip.rule=posterior",
    )
    capsys.readouterr()
    assert main(argv) == 1  # nothing was trained
    out = capsys.readouterr().out
    (row,) = metric_rows(run_dir)
    assert row["training/skipped_step"] == 1.0 and run_summary(run_dir)["updates"] == 0
    # the last round's groups: data.gen_batch_size=8 prompts x rollout.n=4, every one filtered
    dumped = jsonl_rows(dumps / "1.jsonl")
    assert len(dumped) == 8 * 4
    assert all(r["trained"] is False and r["score"] == 0.0 and r["step"] == 1 for r in dumped)
    assert {r["gts"] for r in dumped} <= {str(i) for i in range(32)}
    # the step line's skip count reads against the data's size: every prompt was drawn over
    # and over (each hopeless after its first group), so the line says how many passes
    skipped = int(row["dynamic_sampling/skipped_prompts"])
    drawn = skipped + int(row["dynamic_sampling/generated_groups"])
    assert row["dynamic_sampling/generated_groups"] == 6 * 8 and drawn > 2 * 32
    (line,) = [x for x in out.splitlines() if x.startswith("step 1 |")]
    assert f" | skipped {skipped} draws ({drawn / 32:.1f} passes over 32 prompts) | " in line


def test_a_nul_byte_inside_a_list_or_dict_ground_truth_is_found_for_any_reward(tmp_path):
    custom = RowRules(builtin_scorer=False)  # a custom reward function grades any shape, not NULs
    for gt, where in ((["1", f"4{NUL}"], "[1] character 1"), ({"a": [f"x{NUL}"]}, "['a'][0] character 1")):
        path = _write(tmp_path, "nul", _rows(4, gt=lambda i, gt=gt: gt))
        errors = _errors(path, custom)
        assert len(errors) == 4
        assert errors[0].startswith(
            f"error: row 0: reward_model.ground_truth: has a NUL byte (\\x00) at {where}; "
        )
