"""Same as ``dapo bench update``: python benchmarks/update_bench.py [--json] [--models tiny]."""

from dapo.bench.update import main

if __name__ == "__main__":
    raise SystemExit(main())
