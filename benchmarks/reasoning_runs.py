"""The ``dapo train --config-name reasoning`` run that the headline and ablation benchmarks share:
one seeded run into its own directory, metrics to jsonl only (no report, no final model), one
torch thread. A run already finished in its directory with the same resolved configuration is
read instead of run again, so an interrupted benchmark resumes and one benchmark can read
another's runs (linked into its directory)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

PRESET = "reasoning"


def train_args(
    seed: int, steps: int, test_freq: int, overrides: list[str], after: list[str] = ()
) -> list[str]:
    """The run's overrides (``after`` win over the fixed keys), without its directory."""
    return [
        *overrides,
        "algorithm.filter_groups.on_exhausted=train",
        f"trainer.seed={seed}",
        f"trainer.total_training_steps={steps}",
        f"trainer.test_freq={test_freq}",
        "trainer.logger=[jsonl]",
        "trainer.report_freq=0",
        "trainer.save_final_model=false",
        "trainer.torch_threads=1",
        *after,
    ]


def _config_text(text: str) -> str:
    """A resolved configuration without the keys that name where it ran."""
    return "\n".join(line for line in text.splitlines() if "default_local_dir:" not in line)


def same_config(run_dir: Path, args: list[str]) -> bool:
    """Whether the finished run in ``run_dir`` ran with the configuration ``args`` resolve to."""
    from dapo.config.load import to_yaml
    from dapo.run_config import build_run_config

    recorded = run_dir / "config.yaml"
    if not (run_dir / "finished.json").exists() or not recorded.exists():
        return False
    wanted = to_yaml(build_run_config(args, preset=PRESET).cfg)
    return _config_text(recorded.read_text()) == _config_text(wanted)


def train_reasoning(
    run_dir: Path, seed: int, steps: int, test_freq: int, overrides: list[str], after: list[str] = ()
) -> list[dict]:
    """The run's metrics rows: read from ``run_dir`` when it holds this run finished, otherwise
    run (a different or unfinished run there is replaced)."""
    args = train_args(seed, steps, test_freq, overrides, after)
    if not same_config(run_dir, args):
        if run_dir.is_symlink():
            run_dir.unlink()
        elif run_dir.exists():
            shutil.rmtree(run_dir)
        cmd = [sys.executable, "-m", "dapo.cli", "train", "--config-name", PRESET, *args]
        subprocess.run([*cmd, f"trainer.default_local_dir={run_dir}"], check=True, stdout=subprocess.DEVNULL)
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
