"""The crash suite's short form (benchmarks/crash_suite.py runs >= 20 kills at random moments):
one run SIGKILLed three times, each time resumed with the same command, ends bitwise equal to a
run never killed, with every step's metrics and group rows logged exactly once.

The kills: (1) while the step-2 checkpoint is being written, (2) after the step-2 checkpoint is
complete but before step 2's metrics row is written, (3) while the step-4 checkpoint is being
written, with step 3's row (past the step-2 checkpoint) already logged.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from dapo.cli import main
from runs import (
    assert_each_step_once,
    kill_when,
    latest_checkpoint,
    live_rows,
    metrics_by_step,
    saving,
    small_run_args,
    subprocess_env,
)

torch.set_num_threads(1)

STEPS = 4

# `dapo train` that SIGKILLs itself as it is about to log the metrics row of step argv[1]
KILL_BEFORE_ROW = """
import os, signal, sys
import dapo.outputs.tracking as tracking
step_to_die, log = int(sys.argv.pop(1)), tracking.JsonlTracker.log
def log_or_die(self, metrics, step):
    if step == step_to_die:
        os.kill(os.getpid(), signal.SIGKILL)
    log(self, metrics, step)
tracking.JsonlTracker.log = log_or_die
from dapo.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _args(run, model_dir, task):
    # checkpoints every 2 steps: odd steps' rows are logged with no checkpoint of their own
    return small_run_args(
        run, model_dir, task, STEPS, "trainer.save_freq=2", "algorithm.filter_groups.carry_over=true"
    )


@pytest.mark.slow
def test_three_kills_one_run_bitwise_equal_and_each_row_once(tmp_path, tiny_random_model_dir, mod3_task):
    straight = tmp_path / "straight"
    assert main(_args(straight, tiny_random_model_dir, mod3_task)) == 0

    run = tmp_path / "run"
    args = _args(run, tiny_random_model_dir, mod3_task)
    env = subprocess_env()
    log = (tmp_path / "attempts.log").open("w")

    def start(*prefix):
        return subprocess.Popen(
            [sys.executable, *prefix, *args], stdout=log, stderr=subprocess.STDOUT, env=env
        )

    # 1. mid-save: the step-2 checkpoint's temporary directory exists, the checkpoint does not
    proc = start("-m", "dapo.cli")
    assert kill_when(proc, lambda: saving(run, proc.pid)), "the run finished before its first save"
    assert saving(run, proc.pid) and latest_checkpoint(run) == 0
    assert [r["step"] for r in live_rows(run)] == [1]

    # 2. between the step-2 checkpoint and step 2's row
    proc = start("-c", KILL_BEFORE_ROW, "2")
    assert proc.wait(timeout=300) == -9
    assert latest_checkpoint(run) == 2 and [r["step"] for r in live_rows(run)] == [1]

    # 3. mid-save of step 4, with step 3's row logged past the step-2 checkpoint
    proc = start("-m", "dapo.cli")
    assert kill_when(proc, lambda: saving(run, proc.pid)), "the run finished before its step-4 save"
    assert latest_checkpoint(run) == 2 and [r["step"] for r in live_rows(run)] == [1, 2, 3]
    log.close()

    assert main(args) == 0
    assert_each_step_once(run, STEPS)
    assert_each_step_once(run, STEPS, "groups.jsonl")
    assert metrics_by_step(run) == metrics_by_step(straight)
    from safetensors.torch import load_file

    a = load_file(str(straight / "final_model" / "model.safetensors"))
    b = load_file(str(run / "final_model" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
