"""verl parquet loading: schema checks, templating, overlong prompts, the built-in task, the sampler."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dapo.data.dataset import PromptSampler, load_prompts, truncate
from dapo.data.parquet import DataError, read_rows, write_rows
from dapo.tasks.arithmetic import all_problems, split_problems, write_task


def _row(q="1+1=", gt="2", ds="arithmetic"):
    return {
        "data_source": ds,
        "prompt": [{"role": "user", "content": q}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": gt},
        "extra_info": {"index": 0},
    }


def test_missing_file_names_the_path_and_key(tmp_path):
    with pytest.raises(DataError, match=r"nope\.parquet does not exist.*data\.train_files"):
        read_rows(tmp_path / "nope.parquet")


def test_missing_columns_are_listed(tmp_path):
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist([{"question": "1+1", "answer": "2"}]), str(path))
    with pytest.raises(DataError, match=r"lacks column\(s\) \['prompt', 'data_source', 'reward_model'\]"):
        read_rows(path)


def test_row_without_ground_truth_is_named_by_index(tmp_path):
    path = tmp_path / "gt.parquet"
    rows = [_row(), _row(), _row(gt="")]
    write_rows(path, rows)
    with pytest.raises(DataError, match=r"row 2: reward_model.ground_truth is missing"):
        read_rows(path)


def test_overlong_prompt_without_filtering_is_an_error(tmp_path, char_tokenizer):
    path = tmp_path / "long.parquet"
    write_rows(path, [_row(), _row(q="9" * 100)])
    with pytest.raises(
        DataError, match=r"row 1: the prompt is \d+ tokens.*max_prompt_length=20.*filter_overlong_prompts"
    ):
        load_prompts(str(path), char_tokenizer, 20)
    rows, stats = load_prompts(str(path), char_tokenizer, 20, filter_overlong_prompts=True)
    assert len(rows) == 1 and stats["filtered_overlong"] == 1


def test_truncation_sides():
    ids = list(range(10))
    assert truncate(ids, 4, "left") == [6, 7, 8, 9]
    assert truncate(ids, 4, "right") == [0, 1, 2, 3]
    assert truncate(ids, 4, "middle") == [0, 1, 8, 9]


def test_chat_template_applied(tmp_path, char_tokenizer):
    path = tmp_path / "ok.parquet"
    write_rows(path, [_row(q="12+3=")])
    (row,), _ = load_prompts(str(path), char_tokenizer, 64)
    assert char_tokenizer.decode(row.prompt_ids) == "<|user|>12+3=<|end|><|assistant|>"
    assert row.reward_model["ground_truth"] == "2" and row.data_source == "arithmetic"


def test_builtin_task_schema_and_split(tmp_path):
    train, test = write_task(tmp_path, train_size=200, test_size=60)
    tr, te = read_rows(train), read_rows(test)
    assert len(tr) == 200 and len(te) == 60  # 15% easy, 70% medium, 15% hard
    assert {r["extra_info"]["tier"] for r in tr} == {"easy", "medium", "hard"}
    assert not ({r["prompt"][0]["content"] for r in tr} & {r["prompt"][0]["content"] for r in te})
    a, b = split_problems(0)
    assert len(a) + len(b) == len(all_problems())


def test_sampler_rolls_over_epochs_and_resumes():
    rows = list(range(5))
    from dapo.data.dataset import PromptRow

    prs = [PromptRow(i, [1], [], "s", {"ground_truth": "1"}, {}) for i in rows]
    s = PromptSampler(prs, seed=3)
    first = [r["index"] for r in s.take(7)]
    assert sorted(first[:5]) == rows and s.epoch == 1
    state = s.state_dict()
    nxt = [r["index"] for r in s.take(6)]
    s2 = PromptSampler(prs, seed=99)
    s2.load_state_dict(state)
    assert [r["index"] for r in s2.take(6)] == nxt


def test_saved_char_tokenizer_keeps_spaces(tiny_random_model_dir):
    """A model dir whose config says qwen2 still loads our character tokenizer as saved."""
    from dapo.model.loader import load_tokenizer

    tok = load_tokenizer(tiny_random_model_dir)
    assert tok.convert_ids_to_tokens(tok("a b", add_special_tokens=False)["input_ids"]) == ["a", " ", "b"]
    assert tok.decode(tok("What is 3 + 5?", add_special_tokens=False)["input_ids"]) == "What is 3 + 5?"
