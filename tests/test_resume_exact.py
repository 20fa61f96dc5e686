"""Exact resume, against the real trainer and CLI:

* 6 steps straight vs 3 steps, SIGKILL (not a clean exit), resume, 3 more: the same per-step
  metrics and bitwise-equal final weights on CPU, with dynamic sampling and surplus carry-over on.
* A checkpoint directory cut off mid-write is never taken as the latest.

The reward is a deterministic function of the response text that a random tiny model passes
about a third of the time, so groups have spread, some are filtered (all-wrong/all-right) and
surplus kept groups are carried over between steps.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from dapo.cli import main
from runs import live_rows, metric_rows, metrics_by_step, run_summary, small_run_args, subprocess_env

torch.set_num_threads(1)

STEPS = 6
KILL_AFTER = 3


def _args(run_dir, model_dir, mod3_task, *extra):
    return small_run_args(
        run_dir,
        model_dir,
        mod3_task,
        STEPS,
        "trainer.save_freq=1",
        "algorithm.filter_groups.carry_over=true",
        *extra,
    )


def _logged_steps(run_dir):
    return {r["step"] for r in live_rows(run_dir)}


def _latest(run_dir):
    try:
        return int((run_dir / "latest_checkpointed_iteration.txt").read_text().strip())
    except (OSError, ValueError):
        return None


def _final_weights(run_dir):
    from safetensors.torch import load_file

    return load_file(str(run_dir / "final_model" / "model.safetensors"))


# prefetch: each step's batch is generated in a background thread while the previous step
# trains, and a checkpoint holds the batch prefetched for the next step
PREFETCH = ["algorithm.filter_groups.prefetch=true", "algorithm.filter_groups.max_staleness=2"]


@pytest.mark.slow
@pytest.mark.parametrize("extra", [[], PREFETCH], ids=["sequential", "prefetch"])
def test_sigkill_and_resume_matches_straight_run(tmp_path, tiny_random_model_dir, mod3_task, extra):
    # 1. six steps straight
    straight = tmp_path / "straight"
    assert main(_args(straight, tiny_random_model_dir, mod3_task, *extra)) == 0
    want = metrics_by_step(straight)
    assert sorted(want) == list(range(1, STEPS + 1))
    carried = sum(want[s].get("dynamic_sampling/carried_in", 0) for s in want)
    filtered = sum(want[s].get("dynamic_sampling/filtered_groups", 0) for s in want)
    assert carried > 0 and filtered > 0, "the run must exercise filtering and surplus carry-over"
    if extra:
        assert all(want[s]["dynamic_sampling/staleness_max"] >= 1 for s in range(2, STEPS + 1))

    # 2. the same command in a subprocess, SIGKILLed once the step-3 checkpoint is complete
    resumed = tmp_path / "resumed"
    cmd = [sys.executable, "-m", "dapo.cli", *_args(resumed, tiny_random_model_dir, mod3_task, *extra)]
    env = subprocess_env()
    log = (tmp_path / "killed.log").open("w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 900  # a hang guard only: a loaded machine may take minutes
    try:
        # Freeze the run (SIGSTOP) as soon as a checkpoint >= 3 is complete; kill it there if every
        # checkpointed step has also been logged, else let it go on (the checkpoint is written just
        # before the step's metrics line, so a kill in between would leave that line missing).
        while proc.poll() is None and time.monotonic() < deadline:
            if (_latest(resumed) or 0) >= KILL_AFTER:
                proc.send_signal(signal.SIGSTOP)
                if _logged_steps(resumed) >= set(range(1, _latest(resumed) + 1)):
                    break
                proc.send_signal(signal.SIGCONT)
            time.sleep(0.002)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    assert (_latest(resumed) or 0) >= KILL_AFTER, (
        "the trainer never wrote latest_checkpointed_iteration.txt >= 3 with trainer.save_freq=1 "
        "within the 900 s hang guard (is dapo.checkpoint.store.save_checkpoint wired into Trainer.fit?)\n"
        + (tmp_path / "killed.log").read_text()[-3000:]
    )
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    killed_at = _latest(resumed)
    assert killed_at < STEPS and not (resumed / "final_model").exists()

    # 3. the same command again resumes (trainer.resume_mode=auto) and finishes
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    got = metrics_by_step(resumed)
    assert sorted(got) == list(range(1, STEPS + 1))
    summary = run_summary(resumed)
    assert summary["steps"] == STEPS

    # same per-step metrics (bitwise: the floats went through the same JSON)
    for step in range(1, STEPS + 1):
        assert got[step] == want[step], f"step {step} differs after resuming from step {killed_at}"
    # bitwise-equal final weights
    a, b = _final_weights(straight), _final_weights(resumed)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.slow
def test_cut_off_checkpoint_is_never_taken_as_latest(tmp_path, tiny_random_model_dir, mod3_task, capsys):
    from dapo.checkpoint.store import MANIFEST, find_resume_checkpoint, is_complete

    run = tmp_path / "run"
    assert main(_args(run, tiny_random_model_dir, mod3_task, "trainer.total_training_steps=2")) == 0
    good = run / "global_step_2"
    assert is_complete(good) and _latest(run) == 2, "trainer.save_freq=1 must write complete checkpoints"
    # a step-3 directory cut off mid-write (its model written, manifest and the rest missing),
    # and a latest file that already names it
    bad = run / "global_step_3"
    shutil.copytree(good, bad)
    (bad / MANIFEST).unlink()
    (bad / "trainer_state.json").unlink()
    (run / "latest_checkpointed_iteration.txt").write_text("3\n")
    with pytest.warns(
        UserWarning, match="skipping checkpoint global_step_3: .*dapo_checkpoint.json: missing"
    ):
        assert find_resume_checkpoint(run, "auto") == good

    # the trainer resumes from step 2 (not the broken 3), saying why in one line, trains step 3
    # and replaces the broken dir
    n_rows = len(metric_rows(run))
    capsys.readouterr()
    assert main(_args(run, tiny_random_model_dir, mod3_task, "trainer.total_training_steps=3")) == 0
    out = capsys.readouterr().out
    assert f"warning: skipping checkpoint global_step_3: {bad / MANIFEST}: missing" in out.replace("\n", "")
    assert f"resumed from {good} (step 2)" in out.replace("\n", "")
    new_steps = [r["step"] for r in metric_rows(run)[n_rows:]]
    assert new_steps == [3]
    assert is_complete(bad) and _latest(run) == 3

    # every checkpoint damaged: the run stops with one line instead of starting over from step 0
    for step in (1, 2, 3):
        f = run / f"global_step_{step}" / "actor" / "optimizer.pt"
        data = bytearray(f.read_bytes())
        data[-100] ^= 0xFF
        f.write_bytes(bytes(data))
    assert main(_args(run, tiny_random_model_dir, mod3_task, "trainer.total_training_steps=4")) == 2
    (err,) = [x for x in capsys.readouterr().err.splitlines() if "dapo:" in x or "Traceback" in x]
    assert err.startswith(f"dapo: no usable checkpoint in {run}: ") and "optimizer.pt: sha256" in err
    assert "trainer.resume_mode=disable" in err
    assert len(metric_rows(run)) == n_rows + 1
