"""``benchmarks/gpu_check.sh``: its plan fits one device call (``--plan``), and ``--dry`` runs the
GPU check's steps on CPU with tiny sizes and writes the JSON of figures a GPU run fills."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "gpu_check.sh"
DEVICE_CALL_S = 540  # one device call may run 600 s; the rest is start and transfer


def _budget(stdout: str) -> tuple[int, int]:
    """The printed total, and the sum of the plan's lines."""
    (total,) = re.findall(r"^gpu_check budget: (\d+) s in all$", stdout, re.M)
    parts = re.findall(r"^  \w+ +(\d+) s(?: \+ (\d+) s figures)?", stdout, re.M)
    return int(total), sum(int(a) + int(b or 0) for a, b in parts)


def test_gpu_path_gpu_check_plan_fits_one_device_call():
    r = subprocess.run(["bash", str(SCRIPT), "--plan"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    total, parts = _budget(r.stdout)
    assert total == parts and total <= DEVICE_CALL_S
    steps = re.findall(r"^  (\w+) ", r.stdout, re.M)
    assert steps == ["wheels", "model", "tests", "train", "fsdp", "vllm", "print"]
    wheels = (SCRIPT.parent / "gpu_check_wheels.txt").read_text().split()
    assert {"pyarrow>=15", "pytest>=8"} <= set(wheels)


def test_gpu_path_gpu_check_dry_writes_the_figures(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    r = subprocess.run(
        ["bash", str(SCRIPT), "--dry", str(tmp_path / "out")],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert _budget(r.stdout)[0] <= DEVICE_CALL_S
    fig = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert fig["dry"] is True and fig["env"]["device"] == "cpu" and fig["model"]["rc"] == 0
    t = fig["tests"]
    # on CPU the CUDA tests are collected and skipped, each with its reason; none fails
    assert t["rc"] == 0 and t["failed"] == 0 and t["passed"] + t["skipped"] >= 2
    assert any("CUDA" in reason for reason in t["skip_reasons"])
    for run in ("train_bf16", "fsdp_1_rank", "vllm_colocated"):
        f = fig[run]
        assert f["rc"] == 0 and f["steps"] == 2, (run, f)
        assert f["tokens_per_s"] > 0 and 0 < f["mfu"] < 1 and f["peak_memory_gb"] > 0
    # the second step's generation had the first update's weights sent to vLLM
    assert fig["vllm_colocated"]["update_weights_s"] > 0 and fig["vllm_colocated"]["gen_s"] > 0
    assert fig["sp"]["skipped"] and "two devices" in fig["sp"]["reason"]
