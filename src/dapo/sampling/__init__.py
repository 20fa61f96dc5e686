"""Dynamic sampling: group filter, pre-rollout skipping and the dynamic batcher.

Free of model code: the batcher sees a prompt source and a rollout+score function, so it is
tested and simulated with fakes (``dapo.sampling.fakes``).

* ``batcher``: :class:`DynamicBatcher`, the front: config, one strategy per step, state;
* ``strategies/``: ``unfiltered``, ``verl``, ``default``, ``stream``, and ``base`` (the sampler
  state and round steps they share);
* ``filter``: the group filter; ``pool``: carried-over groups; ``skip``: the skip policy over
  ``history`` (per-prompt outcomes) and ``posterior`` (solve-rate posteriors);
* ``step_stats``: per-step counts, group records and metrics; ``batch_state``: a batch as plain
  data for checkpoints;
* ``stream``: the engine's group-stream interface and refill rule; ``prefetch``: the next batch
  generated during this step's update; ``simulate``: the model-free simulator.
"""

from dapo.sampling.batcher import (
    DynamicBatcher,
    GenerationBudgetExhausted,
    SampledStep,
    verl_exhausted_message,
)

__all__ = ["DynamicBatcher", "GenerationBudgetExhausted", "SampledStep", "verl_exhausted_message"]
