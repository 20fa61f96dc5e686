"""The trainer's peak resident memory in a real ``dapo train`` run, with and without its copy of
the policy.

With the actor on FSDP ranks and vLLM sampling, the trainer's model is a layout on the meta
device and every weight reaches vLLM from the ranks (``dapo.distributed.rank_weights``). Before
that, the trainer kept a full copy, filled from the ranks after each update, and fed vLLM from
it. This script runs ``dapo train -c smollm2`` (SmolLM2-135M-Instruct, fp32, 513 MiB of
weights) both ways, for each placement, interleaved, and reads each step's
``perf/max_memory_allocated_gb`` (on CPU: the trainer process's peak RSS, ``ru_maxrss``) from
the run's ``metrics.jsonl``. The copy is brought back by making ``driver_holds_weights`` answer
true in the trainer's process, which is the code path the async modes and the own engine still
take. Each step's figure is read at the end of its update, so a validation or a checkpoint is in
the figure of the step after it: each run validates and writes a checkpoint at its next-to-last
step, and the last step's figure is the run's peak with both (the final validation is not in
it).

    DAPO_CACHE=DIR .venv/bin/python benchmarks/train_rss.py [--placements colocated server]
        [--ranks 2] [--steps 3] [--repeats 2] [--json out.json]

``DAPO_CACHE`` (default ``~/.cache/dapo``) must hold the smollm2 preset's model and data
(docs/smollm2.md, "Setup"). Each run starts its own ranks and vLLM engine: about 1.5 min
(colocated) to 3 min (server) on two shared cores. The figures are memory, not time, so the
machine's load does not change them. Results are appended to ``--json`` as each run ends; each
run's directory is removed once its figures are read (its log is kept beside it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# makes the trainer keep its full copy of the policy (the path before the layout)
_WITH_COPY = """
import sys
import dapo.trainer.loop as loop
loop.driver_holds_weights = lambda cfg: True
from dapo.cli import main
sys.exit(main(sys.argv[1:]))
"""


def run_args(run_dir: Path, placement: str, ranks: int, steps: int) -> list[str]:
    return [
        "train",
        "-c",
        "smollm2",
        f"trainer.default_local_dir={run_dir}",
        f"trainer.total_training_steps={steps}",
        f"trainer.save_freq={steps - 1}",
        "trainer.save_final_model=false",
        "trainer.val_before_train=false",
        f"trainer.test_freq={steps - 1}",
        "trainer.report_freq=-1",
        "trainer.logger=[console,jsonl]",
        f"trainer.n_gpus_per_node={ranks}",
        "trainer.worker_backend=process",
        "data.train_batch_size=2",
        "data.gen_batch_size=2",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.optim.lr_warmup_steps=0",
        "algorithm.filter_groups.enable=false",
        "actor_rollout_ref.rollout.name=vllm",
        f"actor_rollout_ref.rollout.placement={placement}",
    ]


def one_run(run_dir: Path, placement: str, ranks: int, steps: int, copy: bool) -> dict:
    args = run_args(run_dir, placement, ranks, steps)
    cmd = [sys.executable, "-c", _WITH_COPY, *args] if copy else [sys.executable, "-m", "dapo.cli", *args]
    log = run_dir.with_suffix(".log")
    with open(log, "w") as out:
        rc = subprocess.call(cmd, stdout=out, stderr=subprocess.STDOUT)
    if rc != 0:
        raise SystemExit(f"train_rss: the run exited with {rc}; its log is {log}")
    steps_seen = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    shutil.rmtree(run_dir)  # its checkpoint holds several copies of the model (GBs per run)
    peaks = [s["perf/max_memory_allocated_gb"] for s in steps_seen]
    return {
        "placement": placement,
        "ranks": ranks,
        "trainer_copy": copy,
        "peak_rss_gib_by_step": peaks,
        "peak_rss_gib": max(peaks),
        "weight_sync_mb": [s.get("perf/weight_sync_mb") for s in steps_seen],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--placements", nargs="+", default=["colocated", "server"], choices=["colocated", "server"]
    )
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json", default=None, help="append each run's figures here (one JSON object a line)")
    args = ap.parse_args()
    if args.steps < 3:
        ap.error(
            "--steps must be at least 3: the checkpoint and validation at step steps-1 are read at the last step"
        )
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    root = Path(tempfile.mkdtemp(prefix="dapo-train-rss-"))
    model_mib = None
    for repeat in range(args.repeats):
        for placement in args.placements:
            for copy in (False, True):  # interleaved, so a drift in the machine hits both alike
                run_dir = root / f"{placement}-{'copy' if copy else 'layout'}-{repeat}"
                r = one_run(run_dir, placement, args.ranks, args.steps, copy)
                model_mib = model_mib or next(m for m in r["weight_sync_mb"] if m)
                r.update(repeat=repeat, model_mib=model_mib, load_1_5_15min=os.getloadavg())
                print(json.dumps(r), flush=True)
                if args.json:
                    with open(args.json, "a") as f:
                        f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
