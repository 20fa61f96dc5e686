"""Filtering disabled (``algorithm.filter_groups.enable=false``): one round of
``data.gen_batch_size`` prompts, trained on whole and untrimmed, as verl does (``batch =
new_batch``; with ``gen_batch_size > train_batch_size`` the step trains on ``gen_batch_size * n``
trajectories, docs/verl_compat.md quirk Q2)."""

from __future__ import annotations

from dapo.sampling.pool import with_staleness
from dapo.sampling.skip import PromptSource
from dapo.sampling.step_stats import StepStats
from dapo.sampling.strategies.base import GenerateFn, OnRound, SampledStep, Sampler


def step(
    s: Sampler, source: PromptSource, generate: GenerateFn, st: StepStats, on_round: OnRound
) -> SampledStep:
    rows = source.take(s.gen_batch_size)
    b = s.generate(rows, generate, st)
    st.kept += len(rows)
    st.record(b, None)
    s.report(on_round, st, len(rows))
    return SampledStep(with_staleness(b, s.version), "train", {})
