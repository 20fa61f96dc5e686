"""The tiny tool model's warm-start examples: what is trained, what is context, and the cache key."""

from __future__ import annotations

import random

import torch

from dapo.tasks import tiny_tool_model as tm
from dapo.tasks.arithmetic import Problem
from dapo.tools.template import build_tool_tokenizer

torch.set_num_threads(1)


def _render() -> tm.ContextRenderer:
    tok = build_tool_tokenizer()
    return tm.ContextRenderer(tok, tok)


def _text(tok, ids, weights, keep) -> str:
    return tok.decode([i for i, w in zip(ids, weights) if keep(w)], skip_special_tokens=False)


def test_call_example_trains_call_and_copy_not_tool_message(monkeypatch):
    monkeypatch.setattr(tm, "COPY_SHARE", 0.0)
    monkeypatch.setattr(tm, "RANDOM_RESULT_RATE", 0.0)
    monkeypatch.setattr(tm, "CLEAN_CALL_RATE", 1.0)
    r = _render()
    ids, w = tm.warm_start_example(r, Problem(37, "*", 48, "hard"), random.Random(0), clean=True)
    tok = r.target
    prompt = r.prompt("37*48=")
    assert ids[: len(prompt)] == prompt and set(w[: len(prompt)]) == {0.0}
    trained_call = _text(tok, ids, w, lambda x: x == 1.0)
    assert (
        trained_call
        == '<tool_call>{"name": "calculator", "arguments": {"expression": "37*48"}}</tool_call><|end|>'
    )
    assert _text(tok, ids, w, lambda x: x == tm.ANSWER_WEIGHT) == "Answer: 1776<|end|>"
    context = _text(tok, ids, w, lambda x: x == 0.0)
    assert context.endswith("<|tool|>1776<|end|><|assistant|>")  # the tool message is context only


def test_copy_drill_call_is_context_and_random_result_is_copied(monkeypatch):
    monkeypatch.setattr(tm, "COPY_SHARE", 1.0)
    monkeypatch.setattr(tm, "RANDOM_RESULT_RATE", 1.0)
    r = _render()
    ids, w = tm.warm_start_example(r, Problem(37, "*", 48, "hard"), random.Random(3))
    tok = r.target
    assert 1.0 not in w  # the call of a drill is not a target
    answer = _text(tok, ids, w, lambda x: x == tm.ANSWER_WEIGHT)
    value = answer.removeprefix("Answer: ").removesuffix("<|end|>")
    assert value.isdigit() and value != "1776"
    assert f"<|tool|>{value}<|end|>" in _text(tok, ids, w, lambda x: x == 0.0)


def test_sums_and_uncalled_products_answer_directly(monkeypatch):
    monkeypatch.setattr(tm, "COPY_SHARE", 0.0)
    monkeypatch.setattr(tm, "CALL_RATE", 0.0)
    r = _render()
    tok = r.target
    ids, w = tm.warm_start_example(r, Problem(3, "+", 4, "easy"), random.Random(0), clean=True)
    assert _text(tok, ids, w, lambda x: x > 0) == "Answer: 7<|end|>"
    ids, w = tm.warm_start_example(r, Problem(37, "*", 48, "hard"), random.Random(0))
    out = _text(tok, ids, w, lambda x: x > 0)
    assert out.startswith("Answer: ") and out != "Answer: 1776<|end|>"  # a near miss, never the product


def test_context_matches_the_rollout_loop():
    from types import SimpleNamespace

    from dapo.rollout.multiturn import MultiTurnRollout
    from dapo.tools.calculator import CalculatorTool

    r = _render()
    loop = MultiTurnRollout(SimpleNamespace(pad_token_id=0), r.target, [CalculatorTool()])
    assert r.prompt("12*34=") == loop.prompt_ids({"raw_prompt": [{"role": "user", "content": "12*34="}]})
    assert r.tool_message("408") == loop.tool_message_ids(["408"])
    ids, w = tm.short_copy_drill(r, random.Random(1))
    text = _text(r.target, ids, w, lambda x: x > 0)
    ctx = _text(r.target, ids, w, lambda x: x == 0)
    value = text.removeprefix("Answer: ").removesuffix("<|end|>")
    assert ctx == f"<|end|><|tool|>{value}<|end|><|assistant|>"


def test_fingerprint_follows_the_recipe(monkeypatch):
    base = tm.recipe_fingerprint()
    for name, value in (
        ("CALL_RATE", 0.31),
        ("SHORT_DRILLS", 7),
        ("RANDOM_RESULT_RATE", 0.2),
        ("RECIPE_VERSION", 99),
    ):
        with monkeypatch.context() as m:
            m.setattr(tm, name, value)
            assert tm.recipe_fingerprint() != base, name
    assert tm.recipe_fingerprint() == base
