"""``dapo bench rollout`` and ``dapo bench update``: our engine / packed actor vs the plain path
(``dapo bench sampling`` is the dynamic-sampling simulator, ``dapo.sampling.simulate``)."""
