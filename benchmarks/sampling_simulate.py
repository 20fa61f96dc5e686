"""Run the dynamic-sampling simulator (same as `dapo bench sampling`).

.venv/bin/python benchmarks/sampling_simulate.py [--json] [--steps 60] [--seed 0] ...
"""

from dapo.sampling.simulate import main

if __name__ == "__main__":
    raise SystemExit(main())
