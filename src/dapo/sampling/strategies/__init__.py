"""The dynamic-sampling strategies, one module each, all a function ``step(sampler, source,
generate | stream, stats, on_round) -> SampledStep`` over the shared :class:`~.base.Sampler`:

* :mod:`.unfiltered`: filtering disabled, one round trained on whole (verl's behaviour);
* :mod:`.verl`: the DAPO recipe's accumulator, exactly;
* :mod:`.default`: ours: carried-over pool, adaptive round sizes, pre-rollout skipping;
* :mod:`.stream`: ``default``'s filter and pool on the engine's group stream, each group
  filtered as it finishes, nothing new launched once the batch is full (the rest is finished,
  the batch taken in draw order).

:class:`~dapo.sampling.batcher.DynamicBatcher` picks one per step from the config.
"""
