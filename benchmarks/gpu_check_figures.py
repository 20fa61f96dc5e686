"""The figures of one finished step of benchmarks/gpu_check.sh, merged into OUT/gpu_check.json.

    python benchmarks/gpu_check_figures.py OUT STEP     # after STEP (its line is in OUT/steps.jsonl)
    python benchmarks/gpu_check_figures.py OUT --print  # the file as it stands

The script runs after every step, so the JSON holds the figures of every step that ended even
when the check as a whole is cut short.
"""

from __future__ import annotations

import json
import os
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

# the keys of a training run's metrics.jsonl each run step reports (the last step: the first has warm-up)
RUN_KEYS = {
    "tokens_per_s": "perf/throughput",
    "mfu": "perf/mfu/actor",
    "pg_loss": "actor/pg_loss",
    "gen_s": "timing_s/gen",
    "update_weights_s": "timing_s/update_weights",
    "update_actor_s": "timing_s/update_actor",
}
RUNS = {"train": "train_bf16", "fsdp": "fsdp_1_rank", "vllm": "vllm_colocated"}


def run_figures(out: Path, name: str, step: dict) -> dict[str, Any]:
    f = out / f"run_{name}" / "metrics.jsonl"
    rows = [json.loads(line) for line in f.read_text().splitlines()] if f.exists() else []
    rows = [r for r in rows if "perf/throughput" in r]
    res: dict[str, Any] = {"rc": step["rc"], "seconds": step["seconds"], "steps": len(rows)}
    if rows:
        last = rows[-1]
        res.update({k: last.get(m) for k, m in RUN_KEYS.items() if m in last})
        res["peak_memory_gb"] = max(r.get("perf/max_memory_allocated_gb", 0.0) for r in rows)
    if step["rc"] != 0:
        log = out / f"{name}.log"
        res["log_tail"] = log.read_text(errors="replace")[-600:] if log.exists() else ""
    return res


def test_figures(out: Path, step: dict) -> dict[str, Any]:
    res: dict[str, Any] = {"rc": step["rc"], "passed": 0, "failed": 0, "skipped": 0, "skip_reasons": []}
    xml = out / "tests.xml"
    if xml.exists():
        for case in ET.parse(xml).getroot().iter("testcase"):
            skip = case.find("skipped")
            if skip is not None:
                res["skipped"] += 1
                res["skip_reasons"].append(skip.get("message", ""))
            elif case.find("failure") is not None or case.find("error") is not None:
                res["failed"] += 1
            else:
                res["passed"] += 1
    return res


def env_figures(dry: bool) -> dict[str, Any]:
    from importlib import metadata

    import torch

    cuda = torch.cuda.is_available() and not dry
    return {
        "torch": torch.__version__,
        "transformers": metadata.version("transformers"),
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "devices": torch.cuda.device_count() if cuda else 1,
        "model_shape": os.environ.get("DAPO_GPU_CHECK_SHAPE", "smollm2-135m"),
    }


def main(argv: list[str]) -> int:
    out, what = Path(argv[0]), argv[1]
    path = out / "gpu_check.json"
    if what == "--print":
        print(path.read_text() if path.exists() else "{}")
        return 0
    dry = os.environ.get("DAPO_GPU_CHECK_DRY") == "1"
    figures = json.loads(path.read_text()) if path.exists() else {"dry": dry}
    if "env" not in figures:
        figures["env"] = env_figures(dry)
        devices = figures["env"]["devices"]
        figures["sp"] = {"skipped": True, "reason": f"SP=2 needs two devices; this machine has {devices}"}
        if devices >= 2:
            figures["sp"]["reason"] = "not part of this check yet"
    steps = {s["step"]: s for s in map(json.loads, (out / "steps.jsonl").read_text().splitlines())}
    step = steps[what]
    if what == "tests":
        figures["tests"] = test_figures(out, step)
    elif what in RUNS:
        figures[RUNS[what]] = run_figures(out, what, step)
    else:
        figures[what] = {"rc": step["rc"], "seconds": step["seconds"]}
    if what == "vllm" and step["rc"] == 3:
        figures[RUNS[what]] = {"rc": 3, "skipped": True, "reason": "vllm is not importable on this machine"}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(figures, indent=1))
    tmp.replace(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
