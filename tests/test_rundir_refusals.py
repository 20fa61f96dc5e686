"""A refused `dapo train` leaves its run directory as it found it: a command that changes a
finished run is refused without a byte written (and the original command still finds the run
finished), and a second train into a busy directory is refused before anything loads. Real runs
and real second processes."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dapo.cli import main
from dapo.outputs import rundir
from dapo.outputs.rundir import RunLock
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


@pytest.mark.slow
def test_a_finished_run_without_its_finished_file_keeps_its_summary(finished, tmp_path, capsys):
    """docs/security.md's recovery for a lost finished.json: the original command again. It has
    no step left to run; the summary still says what the run trained, not 0 steps in 0 s."""
    import json

    src, args = finished
    run = tmp_path / "run"
    subprocess.run(["cp", "-a", str(src), str(run)], check=True)
    args = [a.replace(str(src), str(run)) for a in args]
    (run / "finished.json").unlink()
    kept = json.loads((run / "summary.json").read_text())
    assert kept["steps"] == STEPS and kept["steps_run"] == STEPS and kept["updates"] == STEPS
    assert main(args) == 0
    assert "nothing to do" not in capsys.readouterr().out  # it did resume and finish
    assert (run / "finished.json").exists()
    assert json.loads((run / "summary.json").read_text()) == kept


def test_a_second_train_into_a_busy_directory_is_refused_before_anything_loads(tmp_path):
    run = tmp_path / "run"
    run.mkdir()  # kept when its holder ends: it was there before
    # the first: a real `dapo train` that holds the lock, stopped where training would start
    first = subprocess.Popen(
        [sys.executable, "-c",
         "import sys\nfrom dapo import cli\nfrom dapo.outputs import rundir\n"
         "def hold(cfg, console):\n"
         "    print('holding', flush=True)\n"
         "    sys.stdin.readline()\n"
         "    raise rundir.RunFinished('released')\n"
         "cli._train_locked = hold\n"
         f"sys.exit(cli.main(['train', 'trainer.default_local_dir={run}']))\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=subprocess_env(), text=True,
    )  # fmt: skip
    try:
        assert first.stdout.readline().strip() == "holding"
        second = subprocess.run(
            [sys.executable, "-c",
             "import sys\nfrom dapo.cli import main\n"
             f"rc = main(['train', 'trainer.default_local_dir={run}'])\n"
             "print('torch imported' if 'torch' in sys.modules else 'torch not imported')\n"
             "sys.exit(rc)\n"],
            env=subprocess_env(), capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        # refused while the first still holds the directory, before the config's component
        # rules (the first thing that imports torch), let alone a model or the data
        assert first.poll() is None
        assert second.returncode == 2
        assert second.stderr.splitlines() == [
            f"dapo: run directory {run} is in use by another dapo train (pid {first.pid}); wait for it "
            f"to finish or stop it (kill -TERM {first.pid} saves a checkpoint and stops it), or set "
            "trainer.default_local_dir to another directory"
        ]
        assert second.stdout.strip() == "torch not imported"
        first.stdin.write("\n")
        first.stdin.flush()
        assert first.wait(timeout=60) == 0
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    # the first wrote nothing but the lock file it made: released, the directory is as it was
    assert run.is_dir() and list(run.iterdir()) == []


def test_a_command_stopped_on_its_config_leaves_no_run_directory(tmp_path, capsys):
    run = tmp_path / "new" / "run"
    assert main(["train", f"trainer.default_local_dir={run}", "algorithm.adv_estimator=nope"]) == 2
    assert "algorithm.adv_estimator" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()
    # a directory that was there stays, with its files
    run.mkdir(parents=True)
    (run / "notes.txt").write_text("mine")
    assert main(["train", f"trainer.default_local_dir={run}", "algorithm.adv_estimator=nope"]) == 2
    assert sorted(p.name for p in run.iterdir()) == ["notes.txt"]
    assert (run / "notes.txt").read_text() == "mine"


def test_a_lock_file_removed_by_its_holder_is_not_locked_by_the_next(tmp_path, monkeypatch):
    run = tmp_path / "run"
    a = RunLock(run).acquire()
    # b opened the file while a held it; a then released it and removed the directory it made
    stale = os.open(a.path, os.O_RDWR)
    a.release()
    assert not run.exists()
    real_open, opened = os.open, []

    def open_(path, flags, mode=0o777):
        fd = stale if not opened else real_open(path, flags, mode)
        opened.append(fd)
        return fd

    monkeypatch.setattr(rundir.os, "open", open_)
    b = RunLock(run).acquire()
    monkeypatch.undo()
    try:
        # the lock on the unlinked file was given up for one on the file at the path
        assert len(opened) == 2 and b._fd == opened[1]
        assert os.fstat(b._fd).st_ino == (run / "dapo.lock").stat().st_ino
        with pytest.raises(OSError):
            os.fstat(stale)  # closed
    finally:
        b.release()
