"""``benchmarks/gpu_check.sh --dry``: the GPU check's steps on CPU with tiny sizes, and the JSON of
figures it writes (the same fields a GPU run fills)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "gpu_check.sh"


def test_gpu_check_dry_writes_the_figures(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    r = subprocess.run(
        ["bash", str(SCRIPT), "--dry", str(tmp_path / "out")],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    fig = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert fig["dry"] is True and fig["env"]["device"] == "cpu" and fig["model"]["rc"] == 0
    t = fig["tests"]
    # on CPU the CUDA tests are collected and skipped, each with its reason; none fails
    assert t["rc"] == 0 and t["failed"] == 0 and t["passed"] + t["skipped"] >= 2
    assert any("CUDA" in reason for reason in t["skip_reasons"])
    for run in ("train_bf16", "fsdp_1_rank"):
        f = fig[run]
        assert f["rc"] == 0 and f["steps"] == 2, (run, f)
        assert f["tokens_per_s"] > 0 and 0 < f["mfu"] < 1 and f["peak_memory_gb"] > 0
    assert fig["sp"]["skipped"] and "two devices" in fig["sp"]["reason"]
