"""A custom reward function, the way verl takes one.

    dapo train custom_reward_function.path=examples/custom_reward.py

dapo imports this file in its reward worker processes (not in the trainer) and calls
``compute_score`` once per response, with verl's arguments: the row's ``data_source``, the
decoded response, ``reward_model.ground_truth`` and ``extra_info``. A call that runs past
``reward_model.scoring.timeout_s`` scores ``reward_model.scoring.failure_score`` instead of
stalling the run. Return a float, or a dict with a ``score`` and any other values: each becomes
a column of the batch and a field of the rollout dumps (``trainer.rollout_data_dir``). Dynamic
sampling filters groups on ``acc`` (``algorithm.filter_groups.metric``), so return it when
correctness is not simply ``score > 0``. ``custom_reward_function.name`` picks another function
name in the file.
"""

from __future__ import annotations

import re

_NUMBER = re.compile(r"-?\d+")


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """Right when the last integer in the response is the ground truth; a response that gives no
    number at all loses a little more than a wrong one, which steers early training toward
    answering."""
    numbers = _NUMBER.findall(solution_str)
    acc = bool(numbers) and numbers[-1] == str(ground_truth).strip()
    score = 1.0 if acc else (0.0 if numbers else -0.1)
    return {"score": score, "acc": acc, "numbers_given": len(numbers)}
