"""How much one weight sync raises the trainer's peak resident memory, as a share of the model.

For each model shape (random weights built from the real configs: SmolLM2-135M and a
Qwen2.5-0.5B-shaped model, fp32), each placement (vLLM in the trainer's process, or a vLLM
server) and each rank count (FSDP ranks as local processes), starts the ranks and the engine,
then syncs ``--repeats`` times: ranks -> vLLM, each parameter assembled from its rows (fetched
in rounds of ``--bucket-mb``) and dropped once vLLM has it, one larger than the bucket (the
embedding table) handed over block of rows by block, the trainer holding no copy of the
policy (what ``dapo train`` does with actor ranks and vLLM); with ``--driver-copy``, ranks ->
a full copy in the trainer -> vLLM (the path before). Each sync's peak is read from ``VmHWM``
after resetting it, so the figure is memory, not time (``dapo.bench.weight_sync``); the table
also gives the bytes of parameters the trainer holds. The target is a ratio below 0.25.

    .venv/bin/python benchmarks/weight_sync_memory.py [--shapes smollm2-135m qwen2.5-0.5b]
        [--placements colocated server] [--ranks 1 2] [--bucket-mb 64] [--driver-copy]
        [--json out.json]

Each point starts its own processes and a vLLM engine; on a two-core machine the grid takes
tens of minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from dapo.bench.weight_sync import SHAPES, measure_sync, save_random_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["smollm2-135m", "qwen2.5-0.5b"], choices=sorted(SHAPES))
    ap.add_argument(
        "--placements", nargs="+", default=["colocated", "server"], choices=["colocated", "server"]
    )
    ap.add_argument("--ranks", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--bucket-mb", type=float, default=64.0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument(
        "--driver-copy", action="store_true", help="sync through a full copy in the trainer (the path before)"
    )
    ap.add_argument("--models", default=None, help="where the random models are saved (default: a temp dir)")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    root = Path(args.models or tempfile.mkdtemp(prefix="dapo-weight-sync-"))
    results = []
    for shape in args.shapes:
        model_dir = root / shape
        if not (model_dir / "config.json").exists():
            save_random_model(model_dir, shape)
        for placement in args.placements:
            for ranks in args.ranks:
                print(f"{shape} {placement} ranks={ranks} bucket={args.bucket_mb:g} MiB")
                r = measure_sync(
                    model_dir,
                    placement,
                    ranks,
                    args.bucket_mb,
                    repeats=args.repeats,
                    driver_copy=args.driver_copy,
                )
                r["shape"] = shape
                results.append(r)
                if args.json:  # written as each point finishes
                    Path(args.json).write_text(json.dumps(results, indent=1))
    print(
        f"\n{'shape':14} {'placement':10} {'ranks':>5} {'model MiB':>9} {'driver params MiB':>17}"
        f" {'largest sent MiB':>16}  peak raise / model per sync"
    )
    for r in results:
        ratios = "  ".join(f"{s['ratio']:.3f}" for s in r["syncs"])
        largest = max((s.get("largest_piece", 0) for s in r["syncs"]), default=0)
        print(
            f"{r['shape']:14} {r['placement']:10} {r['ranks']:>5} {r['model_bytes'] / 2**20:>9.0f} "
            f"{r['driver_param_bytes'] / 2**20:>17.0f} {largest / 2**20:>16.1f}  {ratios}"
        )


if __name__ == "__main__":
    main()
