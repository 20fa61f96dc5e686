"""Dynamic sampling: group filter, pre-rollout skipping and the dynamic batcher.

Free of model code: the batcher sees a prompt source and a rollout+score function, so it is
tested and simulated with fakes (``dapo.sampling.fakes``).
"""

from dapo.sampling.batcher import (
    DynamicBatcher,
    GenerationBudgetExhausted,
    SampledStep,
    verl_exhausted_message,
)

__all__ = ["DynamicBatcher", "GenerationBudgetExhausted", "SampledStep", "verl_exhausted_message"]
