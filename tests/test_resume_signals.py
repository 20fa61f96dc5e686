"""Issue 5, stopping: SIGTERM (as a scheduler sends, or Ctrl-C's SIGINT) finishes the current step,
saves a checkpoint (even with periodic saving off) and exits cleanly; running the same command
again resumes and the run ends exactly as one that was never stopped."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from dapo.cli import main
from dapo.data.builtin import write_task

torch.set_num_threads(1)

REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    acc = sum(map(ord, solution_str)) % 3 == 0
    return {"score": 1.0 if acc else 0.0, "acc": acc}
"""
VOLATILE = re.compile(r"^timing_|^perf/(?!total_num_tokens)|time|memory|throughput|mfu")
STEPS = 5


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    d = tmp_path_factory.mktemp("signal_task")
    train, test = write_task(d / "data", train_size=64, test_size=8)
    (d / "reward.py").write_text(REWARD)
    return train, test, d / "reward.py"


def _args(run_dir, model_dir, task):
    train, test, reward = task
    return [
        "train",
        f"data.train_files={train}",
        f"data.val_files={test}",
        f"actor_rollout_ref.model.path={model_dir}",
        f"trainer.default_local_dir={run_dir}",
        f"trainer.total_training_steps={STEPS}",
        "trainer.torch_threads=1",
        "trainer.logger=[console,jsonl]",
        "trainer.val_before_train=false",
        "trainer.save_freq=-1",  # no periodic checkpoints: the stop itself must save
        "data.train_batch_size=4",
        "data.gen_batch_size=8",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.val_kwargs.n=2",
        "algorithm.filter_groups.enable=true",
        f"custom_reward_function.path={reward}",
    ]


def _rows(run_dir):
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:  # a line being written
            pass
    return out


def _by_step(run_dir):
    return {r["step"]: {k: v for k, v in r.items() if not VOLATILE.search(k)} for r in _rows(run_dir)}


@pytest.fixture(scope="module")
def straight(tmp_path_factory, tiny_random_model_dir, task):
    run = tmp_path_factory.mktemp("straight") / "run"
    assert main(_args(run, tiny_random_model_dir, task)) == 0
    return run


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_finishes_step_saves_and_resumes_exactly(tmp_path, tiny_random_model_dir, task, straight, sig):
    want = _by_step(straight)

    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "dapo.cli", *_args(run, tiny_random_model_dir, task)]
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    deadline = time.monotonic() + 45
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if any(r["step"] >= 2 for r in _rows(run)):
                proc.send_signal(sig)
                break
            time.sleep(0.002)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out[-3000:]
    logged = [r["step"] for r in _rows(run)]
    assert 2 <= logged[-1] < STEPS, f"the run was not stopped early (steps {logged})\n{out[-3000:]}"
    latest = run / "latest_checkpointed_iteration.txt"
    assert latest.exists(), "a stop must save a checkpoint even with trainer.save_freq=-1\n" + out[-3000:]
    assert int(latest.read_text()) == logged[-1], "the checkpoint is of the last finished step"
    assert not (run / "final_model").exists()

    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    got = _by_step(run)
    assert sorted(got) == list(range(1, STEPS + 1))
    for step in got:
        assert got[step] == want[step], f"step {step} differs after a stop at step {logged[-1]}"
    from safetensors.torch import load_file

    a = load_file(str(straight / "final_model" / "model.safetensors"))
    b = load_file(str(run / "final_model" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
