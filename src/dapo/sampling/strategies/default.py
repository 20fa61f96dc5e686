"""``strategy=default``: rounds of rollout until the pool and the step's kept groups fill the batch.

Before the rounds, carried groups past ``max_staleness`` are dropped. Each round draws its prompts
through the skip policy (skipped prompts cost no rollout), sized from the kept-rate estimate
(``adaptive_rounds``), filters the groups (``filter_rule``), re-checks the carried groups against
the new evidence and adapts the estimates. The batch is then taken from the pool, carried groups
first; the surplus stays in the pool (``carry_over``).
"""

from __future__ import annotations

import math

from dapo.config.sampling import FilterGroupsConfig
from dapo.sampling.pool import Group
from dapo.sampling.skip import PromptSource
from dapo.sampling.step_stats import StepStats
from dapo.sampling.strategies.base import GenerateFn, OnRound, SampledStep, Sampler


def step(
    s: Sampler, source: PromptSource, generate: GenerateFn, st: StepStats, on_round: OnRound
) -> SampledStep:
    B = s.train_batch_size
    have = s.carried(st)
    fresh: list[Group] = []
    exhausted = None
    k_max = s.cfg.max_num_gen_batches
    while have < B:
        if k_max > 0 and st.rounds >= k_max:
            exhausted = s.exhausted(st, have, verl=False)
            break
        if st.rounds and st.rounds % 50 == 0:
            s.warn_many_rounds(st, have)
        size = round_size(s.cfg, B - have, s.gen_batch_size, s.kept_rate)
        rows, skipped = s.skip.draw(source, size, s.version)
        st.skipped_prompts += skipped
        b = s.generate(rows, generate, st)
        kept_now = s.filter_into(b, st, fresh)
        have = len(s.pool) + len(fresh)
        s.adapt(len(rows), kept_now)
        s.report(on_round, st, have, s.pool_info())
    return s.take(fresh, exhausted, st)


def round_size(cfg: FilterGroupsConfig, need: int, gen_batch_size: int, kept_rate: float | None) -> int:
    """Prompts for a round that should bring ``need`` kept groups: ``need * (1 + round_margin)``
    over the kept-rate estimate (floored at 0.02), within ``[min_round_size, gen_batch_size]``;
    ``gen_batch_size`` without ``adaptive_rounds`` or an estimate."""
    if not cfg.adaptive_rounds or kept_rate is None:
        return gen_batch_size
    rate = max(kept_rate, 0.02)
    k = math.ceil(need * (1.0 + cfg.round_margin) / rate)
    return int(min(gen_batch_size, max(cfg.min_round_size, k)))
