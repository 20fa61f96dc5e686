"""The chat-form arithmetic task used by the smollm2 preset: schema, split, grading, summaries."""

from __future__ import annotations

import json

from dapo.data.parquet import read_rows
from dapo.reward.scorers import scorer_for
from dapo.tasks.arithmetic_chat import (
    EXAMPLE,
    SYSTEM,
    ChatProblem,
    all_problems,
    has_answer_line,
    split_problems,
    summarize_dumps,
    write_chat_task,
)


def test_rows_are_verl_schema_and_graded_by_math_dapo(tmp_path):
    train, test = write_chat_task(tmp_path, train_size=60, test_size=20)
    rows = read_rows(train)
    assert len(rows) == 60
    r = rows[0]
    assert r["data_source"] == "arithmetic" and r["ability"] == "math"
    prompt = list(r["prompt"])
    assert [m["role"] for m in prompt] == ["system", "user", "assistant", "user"]
    assert prompt[0]["content"] == SYSTEM and prompt[2]["content"] == EXAMPLE[1]
    assert prompt[3]["content"] == r["extra_info"]["question"]
    gt = r["reward_model"]["ground_truth"]
    score = scorer_for("arithmetic")
    assert score(f"so it is {gt}.\nAnswer: {gt}", gt)["acc"] is True
    assert score(f"it is {gt}", gt)["acc"] is False  # no Answer: line, no credit
    assert score(f"Answer: {int(gt) + 1}", gt)["acc"] is False


def test_split_is_disjoint_deterministic_and_excludes_the_example():
    tr, te = split_problems(0)
    assert {p.key for p in tr}.isdisjoint({p.key for p in te})
    assert split_problems(0) == (tr, te)
    assert "3+4" not in {p.key for p in all_problems()}


def test_questions_state_the_numbers_and_answers_are_right():
    p = ChatProblem(45, "+", 3, "medium")
    assert p.answer == 48
    for style in range(8):
        q = p.question(style)
        assert "45" in q and "3" in q
    m = ChatProblem(83, "-", 6, "medium")
    assert m.answer == 77 and "minus" in m.question(0) and "gives away" in m.question(2)


def test_every_tier_is_present(tmp_path):
    _, test = write_chat_task(tmp_path, train_size=40, test_size=100)
    tiers = {r["extra_info"]["tier"] for r in read_rows(test)}
    assert tiers == {"easy", "medium", "hard"}


def test_format_rate_and_accuracy_from_dumps(tmp_path):
    d = tmp_path / "val"
    d.mkdir()
    rows0 = [
        {"output": "45 plus 3 is 48.\nAnswer: 48", "acc": True},
        {"output": "It is 48", "acc": False},
        {"output": "answer : 7", "acc": False},
        {"output": "no idea", "acc": False},
    ]
    (d / "0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows0))
    (d / "10.jsonl").write_text(json.dumps({"output": "Answer: 5", "score": 1.0}) + "\n")
    (d / "2.jsonl").write_text(json.dumps({"output": "x", "score": -1.0}) + "\n")
    got = summarize_dumps(d)
    assert [g["step"] for g in got] == ["0", "2", "10"]  # numeric order, not text order
    assert got[0] == {"step": "0", "n": 4, "acc": 0.25, "format_rate": 0.5}
    assert got[2]["acc"] == 1.0 and got[2]["format_rate"] == 1.0
    assert has_answer_line("x" * 400 + "Answer: 3") and not has_answer_line("Answer: 3" + "x" * 400)
