"""``strategy=verl``: the DAPO recipe's accumulator (verl's ``recipe/dapo/dapo_ray_trainer.py``).

Rounds of ``data.gen_batch_size`` prompts; a group is kept when its metric's population std is
above 0 (or it has one trajectory); rounds are accumulated until ``train_batch_size`` groups are
kept, the first ``train_batch_size`` are trained on and the surplus is dropped. No pool, no
skipping, no band. ``max_num_gen_batches`` bounds the rounds, ``on_exhausted`` says what then
(``error`` raises verl's ``ValueError`` text).
"""

from __future__ import annotations

from dapo.batch import Batch
from dapo.sampling.filter import classify
from dapo.sampling.pool import with_staleness
from dapo.sampling.skip import PromptSource
from dapo.sampling.step_stats import StepStats
from dapo.sampling.strategies.base import GenerateFn, OnRound, SampledStep, Sampler


def step(
    s: Sampler, source: PromptSource, generate: GenerateFn, st: StepStats, on_round: OnRound
) -> SampledStep:
    parts: list[Batch] = []
    kept = 0
    k = s.cfg.max_num_gen_batches
    while True:
        rows = source.take(s.gen_batch_size)
        b = s.generate(rows, generate, st)
        outcomes = classify(b, s.cfg.metric, verl=True)
        s.count(outcomes, st)
        st.record(b, outcomes)
        keep_rows = [r for o in outcomes if o.kept for r in o.rows.tolist()]
        kept += sum(1 for o in outcomes if o.kept)
        parts.append(b.select(sorted(keep_rows)))
        s.report(on_round, st, kept)
        if kept < s.train_batch_size:
            if k > 0 and st.rounds >= k:
                action = s.exhausted(st, kept, verl=True)
                if action == "train" and kept > 0:
                    return SampledStep(with_staleness(Batch.concat(parts), s.version), "train")
                st.surplus_dropped += kept
                return SampledStep(None, "skip")
            continue
        full = Batch.concat(parts)
        st.surplus_dropped += kept - s.train_batch_size
        batch = full.slice(0, s.train_batch_size * s.n)
        return SampledStep(with_staleness(batch, s.version), "train")
