"""The ``dapo train --config-name reasoning`` run that the headline and ablation benchmarks share:
one seeded run into its own directory, metrics to jsonl only (no report, no final model), one
torch thread. A run already finished in its directory with the same resolved configuration is
read instead of run again, so an interrupted benchmark resumes and one benchmark can read
another's runs (linked into its directory). With ``resume=True`` an unfinished run of the same
configuration is continued from its last checkpoint (``trainer.resume_mode=auto``, with a
``trainer.save_freq`` in its overrides) instead of started over."""

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


def recorded_config(run_dir: Path, args: list[str]) -> bool:
    """Whether the run in ``run_dir`` (finished or not) started with the configuration ``args``
    resolve to."""
    from dapo.config.load import load_config, to_yaml
    from dapo.config.resolve import resolve

    recorded = run_dir / "config.yaml"
    if not recorded.exists():
        return False
    wanted = to_yaml(resolve(load_config(args, preset=PRESET)))
    return _config_text(recorded.read_text()) == _config_text(wanted)


def same_config(run_dir: Path, args: list[str]) -> bool:
    """Whether the finished run in ``run_dir`` ran with the configuration ``args`` resolve to."""
    return (run_dir / "finished.json").exists() and recorded_config(run_dir, args)


def train_reasoning(
    run_dir: Path,
    seed: int,
    steps: int,
    test_freq: int,
    overrides: list[str],
    after: list[str] = (),
    resume: bool = False,
    log: Path | None = None,
) -> list[dict]:
    """The run's metrics rows: read from ``run_dir`` when it holds this run finished, otherwise
    run (a different run there is replaced; an unfinished one too, unless ``resume``, which
    continues it). ``log``: a file for the run's output and errors (appended); without one the
    output is dropped and errors go to this process's stderr."""
    args = train_args(seed, steps, test_freq, overrides, after)
    if not same_config(run_dir, args):
        if not (resume and recorded_config(run_dir, args)):
            if run_dir.is_symlink():
                run_dir.unlink()
            elif run_dir.exists():
                shutil.rmtree(run_dir)
        cmd = [sys.executable, "-m", "dapo.cli", "train", "--config-name", PRESET, *args]
        cmd.append(f"trainer.default_local_dir={run_dir}")
        if log is None:
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        else:
            with open(log, "a") as out:
                subprocess.run(cmd, check=True, stdout=out, stderr=subprocess.STDOUT)
        if not (run_dir / "finished.json").exists():  # stopped by a signal: it exits 0, unfinished
            raise RuntimeError(f"{run_dir}: the run stopped before its last step; run again to continue it")
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
