"""Measure the short CPU runs that ``dapo bench cluster`` calibrates its step-time model on.

Each run is ``dapo train`` of the default preset (the built-in arithmetic task and tiny model, the
own rollout engine) with one change (strategy, batch, ``n``, filtering); the runs go one after
another, ``--repeats`` times, every other pass in reverse order, so that a change of the machine's
load falls on all of them. Each step's share of a core is recorded with it: the trainer's CPU
seconds over the step (``perf/cpu_time_per_step``) over its wall seconds, so a step slowed by
the machine's load counts what it cost, not how long it waited. Per step after the first (which also pays the first forward passes) it records
the step's measured times and the statistics the model predicts from: generation rounds,
prompts and responses generated, the longest response, prompt and trained tokens. The result is
written as ``src/dapo/bench/cluster_data.py`` (a Python literal, so the command needs no data
files), with the ``uptime`` load before and after.

    PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/cluster_calibration.py --steps 6 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import pprint
import subprocess
import sys
import tempfile
from pathlib import Path

RUNS = {
    "default": [],
    "verl": ["algorithm.filter_groups.strategy=verl"],
    "n4_b32": ["actor_rollout_ref.rollout.n=4", "data.train_batch_size=32", "data.gen_batch_size=64"],
    "n16_b8": [
        "actor_rollout_ref.rollout.n=16",
        "data.train_batch_size=8",
        "data.gen_batch_size=16",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    ],
    "b8": [
        "data.train_batch_size=8",
        "data.gen_batch_size=16",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    ],
    "unfiltered": ["algorithm.filter_groups.enable=false"],
}


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def step_records(run_dir: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    groups = {g["step"]: g for g in map(json.loads, (run_dir / "groups.jsonl").read_text().splitlines())}
    last: dict[int, dict] = {}
    for r in rows:
        if "timing_s/step" in r:
            last[int(r["step"])] = r
    out = []
    for step, r in sorted(last.items()):
        if step == 1:
            continue
        hist = groups[step]["response_length_hist"]["counts"]
        out.append(
            {
                "step": step,
                "wall_s": r["timing_s/step"],
                "cpu_s": r["perf/cpu_time_per_step"],
                "gen_s": r["timing_s/gen"],
                # the old log-probs' pass (when the step recomputed them) and the update
                "update_s": r["timing_s/update_actor"] + r.get("timing_s/old_log_prob", 0.0),
                "old_log_prob": 1.0 if "timing_s/old_log_prob" in r else 0.0,
                "rounds": int(r["train/num_gen_batches"]),
                "gen_groups": int(r["dynamic_sampling/generated_groups"]),
                "gen_tokens": float(r["dynamic_sampling/generated_response_tokens"]),
                "max_response": max(i for i, c in enumerate(hist) if c),
                "prompt_len": float(r["prompt_length/mean"]),
                "trained_tokens": float(r["dynamic_sampling/trained_response_tokens"]),
                "trained_rows": int(r["dynamic_sampling/trained_groups"]),
            }
        )
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=7)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", default=str(Path(__file__).parents[1] / "src/dapo/bench/cluster_data.py"))
    args = p.parse_args()
    data = {"load_before": uptime(), "runs": {}}
    names = list(RUNS)
    for name in names:
        n = next(
            (int(x.split("=")[1]) for x in RUNS[name] if x.startswith("actor_rollout_ref.rollout.n=")), 8
        )
        data["runs"][name] = {"overrides": RUNS[name], "n": n, "steps": []}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for name in names if rep % 2 == 0 else names[::-1]:
                run_dir = Path(tmp) / f"{name}-{rep}"
                cmd = [
                    sys.executable,
                    "-m",
                    "dapo.cli",
                    "train",
                    f"trainer.default_local_dir={run_dir}",
                    f"trainer.total_training_steps={args.steps}",
                    "trainer.val_before_train=false",
                    "trainer.test_freq=0",
                    "trainer.save_freq=0",
                    *RUNS[name],
                ]
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=os.environ.copy())
                # the share of a core each step got: its phase times x this are the CPU seconds they took
                steps = [
                    {**s, "repeat": rep, "cpu_share": s["cpu_s"] / s["wall_s"]} for s in step_records(run_dir)
                ]
                data["runs"][name]["steps"].extend(steps)
                print(name, rep, "done", uptime(), flush=True)
    data["load_after"] = uptime()
    text = (
        '"""Measured CPU runs for ``dapo bench cluster``, written by benchmarks/cluster_calibration.py'
        ' (do not edit)."""\n\n'
        f"RUNS = {pprint.pformat(data, width=108, sort_dicts=False)}\n"
    )
    Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
