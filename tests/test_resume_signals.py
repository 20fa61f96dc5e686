"""Issue 5, stopping: SIGTERM (as a scheduler sends, or Ctrl-C's SIGINT) finishes the current step,
saves a checkpoint (even with periodic saving off) and exits cleanly; running the same command
again resumes and the run ends exactly as one that was never stopped."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
import torch

from dapo.cli import main
from runs import live_rows, metrics_by_step, small_run_args, subprocess_env

torch.set_num_threads(1)

STEPS = 5


def _args(run_dir, model_dir, mod3_task):
    # no periodic checkpoints: the stop itself must save
    return small_run_args(run_dir, model_dir, mod3_task, STEPS, "trainer.save_freq=-1")


@pytest.fixture(scope="module")
def straight(tmp_path_factory, tiny_random_model_dir, mod3_task):
    run = tmp_path_factory.mktemp("straight") / "run"
    assert main(_args(run, tiny_random_model_dir, mod3_task)) == 0
    return run


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_finishes_step_saves_and_resumes_exactly(
    tmp_path, tiny_random_model_dir, mod3_task, straight, sig
):
    want = metrics_by_step(straight)

    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "dapo.cli", *_args(run, tiny_random_model_dir, mod3_task)]
    env = subprocess_env()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    deadline = time.monotonic() + 45
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if any(r["step"] >= 2 for r in live_rows(run)):
                proc.send_signal(sig)
                break
            time.sleep(0.002)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out[-3000:]
    logged = [r["step"] for r in live_rows(run)]
    assert 2 <= logged[-1] < STEPS, f"the run was not stopped early (steps {logged})\n{out[-3000:]}"
    latest = run / "latest_checkpointed_iteration.txt"
    assert latest.exists(), "a stop must save a checkpoint even with trainer.save_freq=-1\n" + out[-3000:]
    assert int(latest.read_text()) == logged[-1], "the checkpoint is of the last finished step"
    assert not (run / "final_model").exists()

    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    got = metrics_by_step(run)
    assert sorted(got) == list(range(1, STEPS + 1))
    for step in got:
        assert got[step] == want[step], f"step {step} differs after a stop at step {logged[-1]}"
    from safetensors.torch import load_file

    a = load_file(str(straight / "final_model" / "model.safetensors"))
    b = load_file(str(run / "final_model" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
