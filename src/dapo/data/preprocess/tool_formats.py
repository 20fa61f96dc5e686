"""Tool variants of ``dapo preprocess`` (verl's ``*_multiturn_w_tool`` preprocessors).

* ``gsm8k-tool``: the gsm8k row plus a system message asking the model to check its answer
  with the ``calc_gsm8k_reward`` tool before answering as ``#### <answer>``; ``extra_info``
  gains ``need_tools_kwargs``, ``tools_kwargs.calc_gsm8k_reward.create_kwargs.ground_truth``
  and ``interaction_kwargs`` ({query, ground_truth}).
* ``dapo-math-17k-tool``: the DAPO-Math row unchanged, ``extra_info`` gains
  ``need_tools_kwargs`` and ``tools_kwargs.code_interpreter.create_kwargs.ground_truth``.

Importing this module adds both to :data:`dapo.data.preprocess.formats.FORMATS`.
"""

from __future__ import annotations

from typing import Any

from dapo.data.preprocess.formats import FORMATS, FormatSpec, convert_dapo_math, convert_gsm8k

GSM8K_TOOL_SYSTEM = (
    "You are a careful math assistant. Reason step by step. Before giving your final answer, "
    "call the `calc_gsm8k_reward` tool at least once with your answer to check it; you may revise it and call "
    "the tool again. Then give the final answer after `####`."
)
GSM8K_TOOL_INSTRUCTION = "Let's think step by step and output the final answer after `####`."


def _with_tools(row: dict[str, Any], tool: str) -> dict[str, Any]:
    gt = row["reward_model"]["ground_truth"]
    row["extra_info"]["need_tools_kwargs"] = True
    row["extra_info"]["tools_kwargs"] = {tool: {"create_kwargs": {"ground_truth": gt}}}
    return row


def convert_gsm8k_tool(
    record: dict[str, Any], split: str, index: int, opts: dict[str, Any]
) -> dict[str, Any]:
    row = convert_gsm8k(record, split, index, opts)
    question = row["extra_info"]["question"]
    row["prompt"] = [
        {"role": "system", "content": GSM8K_TOOL_SYSTEM},
        {"role": "user", "content": f"{question} {GSM8K_TOOL_INSTRUCTION}"},
    ]
    row = _with_tools(row, "calc_gsm8k_reward")
    row["extra_info"]["interaction_kwargs"] = {
        "query": question,
        "ground_truth": row["reward_model"]["ground_truth"],
    }
    return row


def convert_dapo_math_tool(
    record: dict[str, Any], split: str, index: int, opts: dict[str, Any]
) -> dict[str, Any]:
    return _with_tools(convert_dapo_math(record, split, index, opts), "code_interpreter")


FORMATS.setdefault(
    "gsm8k-tool",
    FormatSpec(
        convert_gsm8k_tool,
        "GSM8K for multi-turn with the calc_gsm8k_reward tool (system prompt, tools_kwargs) -> openai/gsm8k",
    ),
)
FORMATS.setdefault(
    "dapo-math-17k-tool",
    FormatSpec(
        convert_dapo_math_tool,
        "DAPO-Math-17k for multi-turn with the code_interpreter tool (tools_kwargs) -> math_dapo",
    ),
)
