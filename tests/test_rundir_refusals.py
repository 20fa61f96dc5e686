"""A refused `dapo train` leaves its run directory as it found it: a command that changes a
finished run is refused without a byte written, and the original command still finds the run
finished. Real runs, the refused command in a second process."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dapo.cli import main
from runs import small_run_args, subprocess_env

torch.set_num_threads(1)

STEPS = 2


def _hashes(run: Path) -> dict[str, str]:
    """sha256 of every file under ``run``, the lock file included."""
    return {
        str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run.rglob("*"))
        if p.is_file()
    }


def _dapo_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("dapo:")]


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_random_model_dir, mod3_task):
    """A finished 2-step run that saved a checkpoint after each step, and its command line."""
    run = tmp_path_factory.mktemp("finished") / "run"
    args = small_run_args(run, tiny_random_model_dir, mod3_task, STEPS, "trainer.save_freq=1")
    assert main(args) == 0
    assert (run / "finished.json").exists() and (run / "global_step_2").is_dir()
    return run, args


@pytest.mark.slow
@pytest.mark.parametrize(
    "change, refusal",
    [
        # refused before the model loads, against the checkpoint's saved config
        ("actor_rollout_ref.actor.optim.lr=0.002", "global_step_2 was trained with another config"),
        # refused by the trainer once the checkpoint is loaded
        ("trainer.total_training_steps=1", "global_step_2 is step 2, past the 1 training steps"),
    ],
)
def test_a_refused_command_leaves_a_finished_run_byte_identical(finished, tmp_path, change, refusal, capsys):
    src, args = finished
    run = tmp_path / "run"
    subprocess.run(["cp", "-a", str(src), str(run)], check=True)
    args = [a.replace(str(src), str(run)) for a in args]
    before = _hashes(run)
    # a second process, as a user would run it: its pid differs from the run's
    p = subprocess.run(
        [sys.executable, "-m", "dapo.cli", *args, change],
        env=subprocess_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert p.returncode == 2, p.stderr
    lines = _dapo_lines(p.stderr)
    assert len(lines) == 1 and refusal in lines[0], p.stderr
    assert "Traceback" not in p.stderr
    assert _hashes(run) == before, "a refused command must not change a byte of the run directory"

    # the original command then finds the run finished, as on an untouched copy
    capsys.readouterr()
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"run directory {run} holds this run, finished after {STEPS} steps; nothing to do" in out
    assert _hashes(run) == before
