"""One run per run directory: the lock, finished runs, config changes on resume, and rows that
hold each step once however the earlier attempt ended. Whole runs through the CLI (in-process;
the lock's holder is a real second process)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dapo.cli import main
from dapo.outputs.rundir import RunDirError, RunLock, config_differences, keep_rows_through
from runs import (
    assert_each_step_once,
    jsonl_rows,
    metrics_by_step,
    run_summary,
    small_run_args,
    subprocess_env,
)

torch.set_num_threads(1)

STEPS = 2


def _args(run, model_dir, task, *extra, steps=STEPS):
    return small_run_args(run, model_dir, task, steps, *extra)


def _files(run: Path) -> dict[str, tuple[bytes, int]]:
    """Every file of a run directory (but the lock) with its bytes and modification time."""
    return {
        str(p.relative_to(run)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(run.rglob("*"))
        if p.is_file() and p.name != "dapo.lock"
    }


def _dapo_lines(err: str) -> str:
    """The CLI's own `dapo:` lines of stderr (third-party progress bars left out)."""
    return "\n".join(line for line in err.splitlines() if line.startswith("dapo:"))


def _weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


@pytest.fixture(scope="module")
def no_checkpoints(tmp_path_factory, tiny_random_model_dir, mod3_task):
    """A finished 2-step run with the default trainer.save_freq=-1: no checkpoint at all."""
    run = tmp_path_factory.mktemp("no_ckpt") / "run"
    assert main(_args(run, tiny_random_model_dir, mod3_task)) == 0
    assert not list(run.glob("global_step_*"))
    return run


@pytest.fixture(scope="module")
def checkpointed(tmp_path_factory, tiny_random_model_dir, mod3_task):
    """A finished 2-step run that saved a checkpoint after each step."""
    run = tmp_path_factory.mktemp("ckpt") / "run"
    assert main(_args(run, tiny_random_model_dir, mod3_task, "trainer.save_freq=1")) == 0
    assert (run / "global_step_2").is_dir()
    return run


def _copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(src, dst)
    return dst


# ------------------------------------------------------------------------------------ the lock


def test_a_second_lock_on_a_run_dir_is_refused_with_the_holders_pid_and_freed_when_it_dies(tmp_path):
    with RunLock(tmp_path):
        with pytest.raises(RunDirError, match=rf"in use by another dapo train \(pid {os.getpid()}\)"):
            RunLock(tmp_path).acquire()
    # a holder killed with SIGKILL: the kernel drops its lock, no stale lock file blocks the next run
    holder = subprocess.Popen(
        [sys.executable, "-c", f"from dapo.outputs.rundir import RunLock; RunLock({str(tmp_path)!r}).acquire(); "
         "print('held', flush=True); import time; time.sleep(60)"],
        stdout=subprocess.PIPE, env=subprocess_env(), text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunDirError, match=f"pid {holder.pid}"):
            RunLock(tmp_path).acquire()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    RunLock(tmp_path).acquire().release()


# ------------------------------------------------------------------------------------ finished runs


@pytest.mark.slow
@pytest.mark.parametrize("which", ["no_checkpoints", "checkpointed"])
def test_a_finished_run_run_again_says_so_and_changes_nothing(
    request, which, tmp_path, tiny_random_model_dir, mod3_task, capsys
):
    run = _copy(request.getfixturevalue(which), tmp_path)
    before = _files(run)
    summary = run_summary(run)
    assert summary["val_acc_after"] is not None
    capsys.readouterr()
    extra = ["trainer.save_freq=1"] if which == "checkpointed" else []
    assert main(_args(run, tiny_random_model_dir, mod3_task, *extra)) == 0
    out = capsys.readouterr().out
    assert f"run directory {run} holds this run, finished after {STEPS} steps; nothing to do" in out
    assert _files(run) == before, "a finished run run again must not write a byte"


@pytest.mark.slow
def test_a_finished_run_without_checkpoints_is_not_trained_over(
    no_checkpoints, tmp_path, tiny_random_model_dir, mod3_task, capsys
):
    run = _copy(no_checkpoints, tmp_path)
    before = _files(run)
    capsys.readouterr()
    assert main(_args(run, tiny_random_model_dir, mod3_task, steps=3)) == 2
    err = _dapo_lines(capsys.readouterr().err)
    assert err.startswith(f"dapo: run directory {run} holds a finished 2-step run that saved no checkpoint")
    assert "trainer.total_training_steps (2 then, 3 now)" in err and "trainer.default_local_dir" in err
    assert _files(run) == before


@pytest.mark.slow
def test_an_attempt_killed_before_its_first_checkpoint_is_trained_again_without_repeated_rows(
    no_checkpoints, tmp_path, tiny_random_model_dir, mod3_task, capsys
):
    # what an attempt killed during step 3 of a longer run leaves: rows for steps 1-2 and a torn
    # third line, and no checkpoint (trainer.save_freq=-1)
    run = tmp_path / "run"
    run.mkdir()
    for name in ("metrics.jsonl", "groups.jsonl"):
        shutil.copy(no_checkpoints / name, run / name)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "actor/entr')
    capsys.readouterr()
    assert main(_args(run, tiny_random_model_dir, mod3_task)) == 0
    out = capsys.readouterr().out
    assert f"no checkpoint in {run}: training from the start" in out and "(steps 1-2)" in out
    assert_each_step_once(run, STEPS)
    assert_each_step_once(run, STEPS, "groups.jsonl")
    assert metrics_by_step(run) == metrics_by_step(no_checkpoints)


@pytest.mark.slow
def test_a_resume_at_the_last_step_writes_the_summary_with_its_validation(
    checkpointed, tmp_path, tiny_random_model_dir, mod3_task
):
    # killed after the last step's checkpoint, before the final model and summary were written
    run = _copy(checkpointed, tmp_path)
    for p in ("finished.json", "summary.json"):
        (run / p).unlink()
    shutil.rmtree(run / "final_model")
    rows = (run / "metrics.jsonl").read_text()
    assert main(_args(run, tiny_random_model_dir, mod3_task, "trainer.save_freq=1")) == 0
    want = run_summary(checkpointed)
    got = run_summary(run)
    for key in ("steps", "stopped", "val_acc_before", "val_acc_after", "val_before", "val_after"):
        assert got[key] == want[key], key
    assert got["val_acc_after"] is not None and got["val_after"]
    assert (run / "metrics.jsonl").read_text() == rows
    a, b = _weights(checkpointed / "final_model"), _weights(run / "final_model")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert (run / "finished.json").exists()


# ------------------------------------------------------------------------------------ config changes


@pytest.mark.slow
def test_a_resume_that_changes_training_names_the_keys_and_goes_on_only_when_allowed(
    checkpointed, tmp_path, tiny_random_model_dir, mod3_task, capsys
):
    run = _copy(checkpointed, tmp_path)
    rows = (run / "metrics.jsonl").read_text()
    changed = (
        "trainer.save_freq=1",
        "actor_rollout_ref.actor.optim.lr=0.001",
        "actor_rollout_ref.actor.clip_ratio_high=0.3",
    )
    capsys.readouterr()
    assert main(_args(run, tiny_random_model_dir, mod3_task, *changed, steps=3)) == 2
    err = _dapo_lines(capsys.readouterr().err)
    assert err.startswith(f"dapo: {run / 'global_step_2'} was trained with another config")
    assert "actor_rollout_ref.actor.clip_ratio_high (0.28 then, 0.3 now)" in err
    assert "actor_rollout_ref.actor.optim.lr (0.0005 then, 0.001 now)" in err
    assert "trainer.resume_allow_config_change=true" in err and len(err.splitlines()) == 1
    assert (run / "metrics.jsonl").read_text() == rows and not (run / "global_step_3").exists()

    allow = "trainer.resume_allow_config_change=true"
    assert main(_args(run, tiny_random_model_dir, mod3_task, *changed, allow, steps=3)) == 0
    out = capsys.readouterr().out
    assert (
        "warning: resuming from" in out and "actor_rollout_ref.actor.optim.lr (0.0005 then, 0.001 now)" in out
    )
    assert_each_step_once(run, 3)


@pytest.mark.slow
def test_keys_that_do_not_change_training_may_differ_on_resume(
    checkpointed, tmp_path, tiny_random_model_dir, mod3_task
):
    run = _copy(checkpointed, tmp_path)
    free = (
        "trainer.save_freq=2",
        "trainer.test_freq=1",
        "trainer.logger=[jsonl]",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        f"trainer.rollout_data_dir={tmp_path / 'dumps'}",
    )
    assert main(_args(run, tiny_random_model_dir, mod3_task, *free, steps=3)) == 0
    assert_each_step_once(run, 3)
    assert (tmp_path / "dumps" / "3.jsonl").exists()


def test_resume_allow_config_change_is_a_validated_bool(capsys):
    key = "trainer.resume_allow_config_change"
    assert main(["validate", f"{key}=true"]) == 0
    assert "resume_allow_config_change: true" in capsys.readouterr().out
    assert main(["validate", f"{key}=maybe"]) == 2
    assert f"{key}: Value 'maybe' is not a valid bool" in capsys.readouterr().err


def test_config_differences_leave_out_the_free_keys():
    old = {
        "trainer": {"save_freq": -1, "total_training_steps": 5, "logger": ["console"]},
        "actor_rollout_ref": {
            "actor": {"ppo_micro_batch_size_per_gpu": 4, "ppo_mini_batch_size": 2, "optim": {"lr": 1e-6}},
            "rollout": {"val_kwargs": {"n": 1}, "n": 4},
        },
        "reward_model": {"reward_kwargs": {}},
    }
    new = json.loads(json.dumps(old))
    new["trainer"].update(save_freq=1, total_training_steps=9, logger=["jsonl"])
    new["actor_rollout_ref"]["actor"]["ppo_micro_batch_size_per_gpu"] = 1
    new["actor_rollout_ref"]["rollout"]["val_kwargs"]["n"] = 8
    assert config_differences(old, new) == []
    new["actor_rollout_ref"]["actor"]["ppo_mini_batch_size"] = 4
    new["actor_rollout_ref"]["rollout"]["n"] = 8
    new["reward_model"]["reward_kwargs"] = {"max_resp_len": 16}
    assert config_differences(old, new) == [
        ("actor_rollout_ref.actor.ppo_mini_batch_size", 2, 4),
        ("actor_rollout_ref.rollout.n", 4, 8),
        ("reward_model.reward_kwargs", {}, "(absent)"),
        ("reward_model.reward_kwargs.max_resp_len", "(absent)", 16),
    ]


def test_keep_rows_through_keeps_each_step_once_up_to_the_checkpoint(tmp_path):
    f = tmp_path / "metrics.jsonl"
    rows = [0, 1, 2, 3, 1, 2]  # an old append-only re-run: 1, 2 twice (the second ones win)
    f.write_text(
        "".join(json.dumps({"step": s, "i": i}) + "\n" for i, s in enumerate(rows)) + '{"step": 4, "i"'
    )
    assert keep_rows_through(f, 2) == [3]  # and the torn line
    assert [(r["step"], r["i"]) for r in jsonl_rows(f)] == [
        (0, 0),
        (1, 4),
        (2, 5),
    ]
    assert keep_rows_through(f, 2) == [] and f.read_text().count("\n") == 3  # nothing left to change
    assert keep_rows_through(f, None) == [0, 1, 2] and f.read_text() == ""
