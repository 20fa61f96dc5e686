"""verl's ``calc_gsm8k_reward`` tool (``verl.tools.gsm8k_tool.Gsm8kTool`` behaviour; docs/tools.md).

``create(ground_truth=...)`` stores the reference answer (from the sample's
``tools_kwargs.calc_gsm8k_reward.create_kwargs``); each ``execute(answer=...)`` prefixes
``#### `` when missing, scores with the gsm8k ``flexible`` rule, answers
``Current parsed answer=... reward=...`` and returns a step reward of 0.0 when the new
reward is strictly higher than the previous one, else -0.05.
"""

from __future__ import annotations

from typing import Any

from dapo.reward.scorers.gsm8k import compute_score
from dapo.tools.base import BaseTool, ToolResponse, register_tool


@register_tool("gsm8k")
class Gsm8kTool(BaseTool):
    default_schema = {
        "type": "function",
        "function": {
            "name": "calc_gsm8k_reward",
            "description": "A tool for calculating the reward of gsm8k. (1.0 if parsed answer is correct, 0.0 if "
            "parsed answer is incorrect or not correctly parsed)",
            "parameters": {
                "type": "object",
                "properties": {
                    "answer": {
                        "type": "string",
                        "description": "The model's answer to the GSM8K math problem, must be a digits",
                    }
                },
                "required": ["answer"],
            },
        },
    }

    def create(self, instance_id: str | None = None, ground_truth: Any = None, **kwargs: Any) -> str:
        instance_id = super().create(instance_id, **kwargs)
        self._instances[instance_id].update(response="", ground_truth=ground_truth, reward=0.0)
        return instance_id

    def run(self, state: dict[str, Any], **arguments: Any) -> ToolResponse:
        answer = str(arguments.get("answer", ""))
        state["response"] = answer if answer.startswith("#### ") else "#### " + answer
        reward = float(compute_score(state["response"], state.get("ground_truth"), method="flexible"))
        step_reward = 0.0 if reward > state["reward"] else -0.05
        state["reward"] = reward
        return ToolResponse(f"Current parsed answer={answer!r} reward={reward!r}", reward=step_reward)
