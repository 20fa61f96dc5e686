"""Coverage of the prompt pool: how much of the data dynamic sampling rolls out and trains on.

A sampler that skips prompts before rollout can look efficient (few filtered groups) while it
trains on a small corner of the data: the prompts it keeps rolling out, and none of those it
stopped looking at. These figures make that visible, per step, from the prompt history's size
and the per-prompt count of trained groups (pure functions; the batcher and the simulator feed
them):

* ``rolled_out_prompts``: distinct prompts rolled out so far (a group was generated and scored);
* ``trained_prompts``: distinct prompts with at least one trained group so far;
* ``skipped_with_spread``: distinct prompts skipped before rollout this step whose last group had
  spread (was kept by the filter), so the skip went against the prompt's own latest evidence;
* ``top10_trained_share``: share of all trained groups so far that went to the 10% most-trained
  prompts of the pool (``ceil(0.1 * pool)`` prompts; ~0.1 when training is spread evenly over the
  whole pool, 1.0 when it all went to a tenth of it or less);
* ``never_rolled_out``: prompts of the pool never rolled out (only with the pool's size).

The pool is the prompt source's length when it has one, else the prompts rolled out so far.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

C = "dynamic_sampling/coverage/"
TOP_FRACTION = 0.1


def top_share(counts: Iterable[int], pool: int, fraction: float = TOP_FRACTION) -> float:
    """Share of the trained groups (``counts``: trained groups per prompt, prompts never trained
    may be left out) that went to the ``ceil(fraction * pool)`` most-trained prompts; 0 when
    nothing was trained. ``pool``: prompts that could have been trained (at least 1)."""
    c = np.sort(np.fromiter((int(x) for x in counts if x), dtype=np.int64))[::-1]
    total = int(c.sum())
    if total == 0:
        return 0.0
    k = max(1, math.ceil(fraction * max(int(pool), 1)))
    return float(c[:k].sum()) / total


def coverage_metrics(
    *,
    rolled_out: int,
    trained_counts: Iterable[int],
    skipped_with_spread: int,
    pool_size: int | None,
) -> dict[str, float]:
    """The ``dynamic_sampling/coverage/*`` figures of one step (see the module docstring).

    ``rolled_out``: distinct prompts rolled out so far; ``trained_counts``: trained groups per
    prompt so far; ``skipped_with_spread``: distinct prompts skipped this step whose last group
    had spread; ``pool_size``: the prompt pool's size, when known."""
    counts = [int(x) for x in trained_counts if x]
    pool = int(pool_size) if pool_size else max(int(rolled_out), 1)
    m = {
        C + "rolled_out_prompts": float(rolled_out),
        C + "trained_prompts": float(len(counts)),
        C + "skipped_with_spread": float(skipped_with_spread),
        C + "top10_trained_share": top_share(counts, pool),
    }
    if pool_size:
        m[C + "never_rolled_out"] = float(max(int(pool_size) - int(rolled_out), 0))
    return m
