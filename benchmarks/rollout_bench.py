"""Same as ``dapo bench rollout``: python benchmarks/rollout_bench.py [--json] [--models tiny]."""

from dapo.bench.rollout import main

if __name__ == "__main__":
    raise SystemExit(main())
