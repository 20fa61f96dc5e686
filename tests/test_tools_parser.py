"""Hermes tool-call parsing, the calculator, the gsm8k checker and verl-shaped tool configs."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo.tools import (
    CalculatorTool,
    Gsm8kTool,
    ToolConfigError,
    load_tool_config,
    parse_hermes,
    tools_from_config,
)
from dapo.tools.base import resolve_tool_class
from dapo.tools.calculator import CalculatorError, evaluate
from dapo.tools.parser import format_hermes_call
from dapo.tools.sandbox import os_boundary_problem

# ------------------------------------------------------------------ parser


def test_well_formed_calls():
    text = (
        "Let me compute.\n"
        '<tool_call>{"name": "calculator", "arguments": {"expression": "37*48"}}</tool_call>\n'
        '<tool_call>\n{"name": "code_interpreter", "arguments": "{\\"code\\": \\"print(1)\\"}"}\n</tool_call>'
    )
    p = parse_hermes(text)
    assert p.content == "Let me compute."
    assert [(c.name, c.arguments, c.error) for c in p.calls] == [
        ("calculator", {"expression": "37*48"}, None),
        ("code_interpreter", {"code": "print(1)"}, None),  # arguments given as a JSON string
    ]


def test_no_call():
    p = parse_hermes("Answer: 12")
    assert p.calls == [] and p.content == "Answer: 12"


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ("<tool_call>{'name': 'calculator'}</tool_call>", "not valid JSON"),
        ("<tool_call>[1, 2]</tool_call>", "must be a JSON object"),
        ('<tool_call>{"arguments": {}}</tool_call>', 'no "name"'),
        ('<tool_call>{"name": "", "arguments": {}}</tool_call>', 'no "name"'),
        ('<tool_call>{"name": "calculator", "arguments": [1]}</tool_call>', "must be a JSON object"),
        ('<tool_call>{"name": "calculator", "arguments": "{bad"}</tool_call>', "not valid JSON"),
        ('<tool_call>{"name": "calculator", "arguments": {"expression": "1"}', "not closed"),
        ("<tool_call></tool_call>", "not valid JSON"),
    ],
)
def test_malformed_calls_are_reported_not_raised(body, says):
    p = parse_hermes("text " + body)
    assert len(p.calls) == 1
    call = p.calls[0]
    assert call.error == "malformed" and says in call.message and call.message.startswith("Error")


def test_round_trip_of_format_hermes_call():
    args = {"expression": "(1+2)*3", "note": 'quote " and \\ backslash'}
    p = parse_hermes(format_hermes_call("calculator", args))
    assert p.calls[0].name == "calculator" and p.calls[0].arguments == args


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_parser_never_raises(text):
    p = parse_hermes(text)
    assert all(c.error in (None, "malformed") for c in p.calls)


# ------------------------------------------------------------------ calculator


@pytest.mark.parametrize(
    ("expr", "value"),
    [
        ("37*48", 1776),
        ("2 + 3 * 4", 14),
        ("(2+3)*4", 20),
        ("-7 // 2", -4),
        ("7 % 3", 1),
        ("2**10", 1024),
        ("1/4", 0.25),
        ("3^2", 9),
        ("12*34=", 408),
        ("1.5*2", 3.0),
    ],
)
def test_calculator_values(expr, value):
    assert evaluate(expr) == value


@pytest.mark.parametrize(
    "expr",
    [
        "__import__('os').system('true')",
        "open('x')",
        "x + 1",
        "'a' * 3",
        "[1] * 3",
        "1 if 1 else 2",
        "lambda: 1",
        "1 < 2",
        "2 ** 100000",
        "10 ** 30 * 10 ** 30",
        "1/0",
        "-" * 40 + "1",
        "",
        "1 +",
        "9" * 300,
        "True + 1",
        "(-8) ** 0.5",
    ],
)
def test_calculator_refuses(expr):
    with pytest.raises(CalculatorError):
        evaluate(expr)


def test_calculator_tool_messages():
    tool = CalculatorTool()
    iid = tool.create()
    assert tool.execute(iid, {"expression": "37*48"}).text == "1776"
    assert tool.execute(iid, {"expression": "1/3"}).text == "0.333333333333"
    r = tool.execute(iid, {"expression": "import os"})
    assert r.text.startswith("Error") and r.error == "tool_error"
    r = tool.execute(iid, {"expression": "1", "extra": 2})
    assert r.error == "bad_arguments" and "unknown argument" in r.text
    r = tool.execute(iid, "37*48")
    assert r.error == "bad_arguments"


@settings(max_examples=200, deadline=None)
@given(st.integers(-(10**6), 10**6), st.integers(-(10**6), 10**6), st.sampled_from(["+", "-", "*"]))
def test_calculator_matches_python_on_integers(a, b, op):
    expected = {"+": a + b, "-": a - b, "*": a * b}[op]
    assert evaluate(f"{a} {op} ({b})") == expected


# ------------------------------------------------------------------ gsm8k tool (verl's calc_gsm8k_reward)


def test_gsm8k_tool_lifecycle_and_step_rewards():
    tool = Gsm8kTool()
    assert tool.name == "calc_gsm8k_reward"
    iid = tool.create(ground_truth="72")
    r1 = tool.execute(iid, {"answer": "70"})
    assert r1.text == "Current parsed answer='70' reward=0.0" and r1.reward == -0.05  # not strictly higher
    r2 = tool.execute(iid, {"answer": "72"})
    assert r2.text == "Current parsed answer='72' reward=1.0" and r2.reward == 0.0
    r3 = tool.execute(iid, {"answer": "#### 72"})  # no double prefix; same reward is not an improvement
    assert r3.reward == -0.05 and tool.calc_reward(iid) == 1.0
    r4 = tool.execute(iid, {"answer": "the total is 72 dollars"})  # flexible: the last number
    assert "reward=1.0" in r4.text
    tool.release(iid)
    assert tool.calc_reward(iid) == 0.0


# ------------------------------------------------------------------ configs


def test_verl_gsm8k_tool_config_loads_unchanged():
    (tool,) = load_tool_config("gsm8k_tool_config")
    assert isinstance(tool, Gsm8kTool)
    assert tool.get_openai_tool_schema()["function"]["parameters"]["required"] == ["answer"]


def test_shipped_configs_load(tmp_path):
    assert [t.name for t in load_tool_config("calculator")] == ["calculator"]
    if (
        os_boundary_problem() is None
    ):  # without bubblewrap the code tool refuses to start (test_tools_sandbox)
        assert [t.name for t in load_tool_config("code_interpreter")] == ["code_interpreter"]
    path = tmp_path / "tools.yaml"
    path.write_text(
        "tools:\n  - class_name: calculator\n    config: {}\n"
        "    tool_schema: {type: function, function: {name: calc, parameters: {type: object, "
        "properties: {expr: {type: string}}, required: [expr]}}}\n"
    )
    (tool,) = load_tool_config(path)
    assert tool.name == "calc" and tool.execute(tool.create(), {"expr": "6*7"}).text == "42"


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({}, "'tools:' list"),
        ({"tools": [{"config": {}}]}, "needs class_name"),
        ({"tools": [{"class_name": "no.such.Tool"}]}, "cannot be imported"),
        ({"tools": [{"class_name": "json.JSONDecoder"}]}, "not a dapo.tools.BaseTool"),
        ({"tools": [{"class_name": "calculator"}, {"class_name": "calculator"}]}, "unique"),
        ({"tools": [{"class_name": "calculator", "tool_schema": {"type": "function"}}]}, "function.name"),
    ],
)
def test_bad_tool_configs_name_the_problem(data, says):
    with pytest.raises(ToolConfigError, match=says):
        tools_from_config(json.loads(json.dumps(data)))


def test_missing_config_file_names_the_key():
    with pytest.raises(ToolConfigError, match="tool_config_path"):
        load_tool_config("/no/such/file.yaml")


def test_resolve_by_class_path():
    assert resolve_tool_class("dapo.tools.calculator.CalculatorTool") is CalculatorTool
    assert resolve_tool_class("verl.tools.gsm8k_tool.Gsm8kTool") is Gsm8kTool
