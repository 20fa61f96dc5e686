"""Stopping: SIGTERM (as a scheduler sends), Ctrl-C's SIGINT, SIGHUP (a closed terminal) or a
closed stdout pipe (`dapo train | head`) finish the current step, save a checkpoint (even with
periodic saving off) and exit (0, or 130 after Ctrl-C); running the same command again resumes
and the run ends exactly as one that was never stopped. While the run trains, a second
`dapo train` into its directory is refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from dapo.cli import main
from runs import (
    assert_each_step_once,
    latest_checkpoint,
    live_rows,
    metrics_by_step,
    run_summary,
    small_run_args,
    subprocess_env,
)

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


def _assert_stopped_and_resumes_exactly(run, args, straight, out, reason):
    logged = [r["step"] for r in live_rows(run)]
    assert logged and 1 <= logged[-1] < STEPS, (
        f"the run was not stopped early (steps {logged})\n{out[-3000:]}"
    )
    assert latest_checkpoint(run) == logged[-1], (
        "a stop must save a checkpoint of the last finished step, even with trainer.save_freq=-1\n"
        + out[-3000:]
    )
    summary = run_summary(run)
    assert summary["stopped"] and summary["stopped_by"] == reason
    assert not (run / "final_model").exists()

    assert main(args) == 0  # the same command resumes
    assert_each_step_once(run, STEPS)
    got, want = metrics_by_step(run), metrics_by_step(straight)
    for step in got:
        assert got[step] == want[step], f"step {step} differs after a stop at step {logged[-1]}"
    from safetensors.torch import load_file

    a = load_file(str(straight / "final_model" / "model.safetensors"))
    b = load_file(str(run / "final_model" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
@pytest.mark.parametrize(
    "sig, code", [(signal.SIGTERM, 0), (signal.SIGINT, 130), (signal.SIGHUP, 0)], ids=["TERM", "INT", "HUP"]
)
def test_signal_finishes_step_saves_and_resumes_exactly(
    tmp_path, tiny_random_model_dir, mod3_task, straight, sig, code, capsys
):
    run = tmp_path / "run"
    args = _args(run, tiny_random_model_dir, mod3_task)
    cmd = [sys.executable, "-m", "dapo.cli", *args]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=subprocess_env(), text=True
    )
    deadline = time.monotonic() + 900  # a hang guard only
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if any(r["step"] >= 1 for r in live_rows(run)):
                # frozen while the checks below run, so a loaded machine cannot let it finish first;
                # the signal waits, pending, until it continues
                os.kill(proc.pid, signal.SIGSTOP)
                try:
                    # a second dapo train into the same directory is refused at once, naming the holder
                    rows = (run / "metrics.jsonl").read_text()
                    capsys.readouterr()
                    assert main(args) == 2
                    err = capsys.readouterr().err
                    assert (
                        f"dapo: run directory {run} is in use by another dapo train (pid {proc.pid})" in err
                    )
                    assert (run / "metrics.jsonl").read_text().startswith(rows)
                    proc.send_signal(sig)
                finally:
                    os.kill(proc.pid, signal.SIGCONT)
                break
            time.sleep(0.002)
        else:
            assert proc.poll() is not None, "the run logged no step in 900 s (a hang guard)"
        out, _ = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == code, out[-3000:]
    _assert_stopped_and_resumes_exactly(run, args, straight, out, signal.Signals(sig).name)


@pytest.mark.slow
def test_a_closed_stdout_pipe_finishes_step_saves_and_resumes_exactly(
    tmp_path, tiny_random_model_dir, mod3_task, straight
):
    """`dapo train ... | head -n 3`: the reader leaves after three lines."""
    run = tmp_path / "run"
    args = _args(run, tiny_random_model_dir, mod3_task)
    err_log = tmp_path / "stderr.log"
    with err_log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dapo.cli", *args],
            stdout=subprocess.PIPE,
            stderr=err,
            env=subprocess_env(),
            text=True,
        )
        try:
            head = [proc.stdout.readline() for _ in range(3)]
            proc.stdout.close()
            proc.wait(timeout=900)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    log = err_log.read_text()
    assert proc.returncode == 0, "".join(head) + log[-3000:]
    assert "dapo: stdout was closed; finishing the current step, saving a checkpoint" in log
    assert "BrokenPipeError" not in log
    _assert_stopped_and_resumes_exactly(run, args, straight, log, "closed console")


@pytest.mark.parametrize("kind", ["pipe", "terminal"])
def test_a_console_whose_reader_is_gone_swallows_writes_and_asks_for_a_stop(kind, monkeypatch):
    """EPIPE (a pipe's reader exited) and EIO (a terminal hung up): print and rich's console go
    on without an exception, the stream's descriptor then points at /dev/null, and a running
    GracefulStop is asked to stop."""
    import os
    import pty

    from rich.console import Console

    from dapo.trainer.signals import CLOSED_CONSOLE, GracefulStop, GuardedStream

    if kind == "pipe":
        reader, writer = os.pipe()
    else:
        reader, writer = pty.openpty()
    os.close(reader)  # the reader is gone
    stream = GuardedStream(os.fdopen(writer, "w", buffering=1), "stdout")
    monkeypatch.setattr(sys, "stdout", stream)
    with GracefulStop(printer=None, signals=()) as stop:
        print("step 1")  # the line-buffered write fails: EPIPE or EIO
        Console(highlight=False).print("step 2")
        print("step 3", flush=True)
    assert stream.gone and stop.requested and stop.reason == CLOSED_CONSOLE
    assert os.path.samestat(os.fstat(writer), os.stat(os.devnull))
    stream.wrapped.flush()  # what the interpreter does at exit: no BrokenPipeError any more
