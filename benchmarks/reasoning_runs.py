"""The ``dapo train --config-name reasoning`` run that the headline and ablation benchmarks share:
one seeded run into its own directory, metrics to jsonl only (no report, no final model), one
torch thread."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def train_reasoning(
    run_dir: Path, seed: int, steps: int, test_freq: int, overrides: list[str], after: list[str] = ()
) -> list[dict]:
    """Run it with ``overrides`` (and ``after``, which win over the fixed keys); its metrics rows."""
    cmd = [
        sys.executable,
        "-m",
        "dapo.cli",
        "train",
        "--config-name",
        "reasoning",
        *overrides,
        "algorithm.filter_groups.on_exhausted=train",
        f"trainer.seed={seed}",
        f"trainer.total_training_steps={steps}",
        f"trainer.test_freq={test_freq}",
        f"trainer.default_local_dir={run_dir}",
        "trainer.logger=[jsonl]",
        "trainer.report_freq=0",
        "trainer.save_final_model=false",
        "trainer.torch_threads=1",
        *after,
    ]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
