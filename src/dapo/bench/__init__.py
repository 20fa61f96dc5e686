"""``dapo bench rollout`` and ``dapo bench update``: our engine / packed actor vs the plain path."""
