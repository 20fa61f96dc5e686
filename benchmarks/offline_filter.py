"""The offline pass-rate filter a verl user runs before a DAPO run: one rollout pass of
``rollout.n`` samples over the training pool with the starting model (training's sampling
settings), then the pool without the prompts whose samples were all wrong or all right, and
the kept rate that sizes ``data.gen_batch_size`` so that one round usually fills a batch.

As a script it runs the pass for one seed into ``--out``: ``pass.json`` (every prompt's pass
rate, the pass's generated response tokens, its wall and CPU time, generation and scoring only) and
``filtered.parquet`` (the pool's rows with spread, as written). A ``pass.json`` already there is
kept: the pass is not run again.

    .venv/bin/python benchmarks/offline_filter.py --seed 1 --out DIR [--task reasoning_wide] [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

PRESET = "reasoning"
PASS_FILE, FILTERED_FILE = "pass.json", "filtered.parquet"
# the pass's sampling generator: its own stream, apart from validation's (seed + 7919)
PASS_SEED_OFFSET = 104_729


def pass_rates(uids: Sequence[str], accs: Sequence[float]) -> dict[str, float]:
    """Each prompt's fraction of right samples, its samples being the rows of its ``uid``."""
    right: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for uid, acc in zip(uids, accs, strict=True):
        right[uid] += float(acc)
        count[uid] += 1
    return {uid: right[uid] / count[uid] for uid in count}


def has_spread(rate: float) -> bool:
    """Whether a group with this pass rate is kept by the all-0 / all-1 filter."""
    return 0.0 < rate < 1.0


def kept_rows(rows: Sequence[Mapping[str, Any]], rates: Sequence[float]) -> list[Mapping[str, Any]]:
    """The rows whose pass rate (row for row) has spread."""
    if len(rows) != len(rates):
        raise ValueError(f"{len(rows)} rows but {len(rates)} pass rates: one rate per row is needed")
    return [row for row, rate in zip(rows, rates) if has_spread(rate)]


def kept_rate(rates: Sequence[float]) -> float:
    """The fraction of prompts with spread."""
    if not rates:
        raise ValueError("no pass rates: the pass scored no prompt")
    return sum(has_spread(r) for r in rates) / len(rates)


def tuned_gen_batch_size(train_batch_size: int, rate: float, margin: float, pool_size: int) -> int:
    """``data.gen_batch_size`` for ``strategy=verl`` so that one round keeps ``train_batch_size``
    groups at the measured kept ``rate``, with ``margin`` for a round that keeps fewer:
    ``ceil(train_batch_size / rate * margin)``, at least ``train_batch_size`` and at most the
    pool. Raises ``ValueError`` when no prompt had spread."""
    if rate <= 0:
        raise ValueError("kept rate 0: no prompt of the pool had spread, so no gen_batch_size fills a batch")
    if margin < 1:
        raise ValueError(f"margin {margin} is under 1: a round would keep fewer groups than a batch")
    # round off float noise first, so that e.g. 8 / 0.25 * 1.25 (= 40.000000000000004) stays 40
    size = math.ceil(round(train_batch_size / rate * margin, 9))
    return max(int(train_batch_size), min(int(pool_size), size))


def pass_overrides(seed: int, out: Path, task: str, train_parquet: str, extra: Sequence[str]) -> list[str]:
    """The ``dapo eval``-like configuration of the pass: the training pool as the validation set,
    sampled with training's settings and ``rollout.n`` samples a prompt."""
    r = "actor_rollout_ref.rollout"
    return [
        *extra,
        f"data.builtin_task={task}",
        f"data.val_files={train_parquet}",
        "data.val_max_samples=-1",
        f"trainer.seed={seed}",
        "trainer.val_only=true",
        "trainer.resume_mode=disable",
        "trainer.logger=[]",
        "trainer.torch_threads=1",
        f"trainer.default_local_dir={out / 'run'}",
        *(f"{r}.val_kwargs.{k}=${{{r}.{k}}}" for k in ("n", "temperature", "top_p", "top_k", "do_sample")),
    ]


def run_pass(seed: int, out: Path, task: str, extra: Sequence[str]) -> dict[str, Any]:
    """One pass of the starting model over ``task``'s training pool; writes and returns
    ``pass.json``'s contents and writes ``filtered.parquet``."""
    import torch

    from dapo.data.parquet import read_rows, write_rows
    from dapo.run_config import build_run_config
    from dapo.sampling.prefetch import GenContext
    from dapo.tasks import builtin_task
    from dapo.trainer.loop import Trainer

    train_parquet = str(builtin_task(task)[0])
    cfg = build_run_config(pass_overrides(seed, out, task, train_parquet, extra), preset=PRESET).cfg
    trainer = Trainer(cfg, printer=lambda line: None)
    t0, c0 = time.perf_counter(), time.process_time()
    batch = trainer.rollout.generate_validation(
        trainer.val_rows, int(trainer.cfg.data.val_batch_size), seed + PASS_SEED_OFFSET
    )
    extra_info = trainer.round.score(batch, GenContext())
    wall_s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    tokens = float(batch.tensors["response_mask"].sum().item())
    rates = pass_rates(list(batch["uid"]), [float(a) for a in extra_info["acc"]])
    rows = read_rows(train_parquet)
    by_row = [rates[f"val-{r.index}"] for r in trainer.val_rows]
    if len(rows) != len(by_row):
        raise ValueError(f"{train_parquet}: {len(rows)} rows, but the pass loaded {len(by_row)} prompts")
    kept = kept_rows(rows, by_row)
    write_rows(out / FILTERED_FILE, list(kept))
    info = {
        "seed": seed,
        "task": task,
        "overrides": list(extra),
        "n": int(trainer.cfg.actor_rollout_ref.rollout.n),
        "prompts": len(rows),
        "kept": len(kept),
        "kept_rate": kept_rate(by_row),
        "all_wrong": sum(r == 0 for r in by_row),
        "all_right": sum(r == 1 for r in by_row),
        "generated_response_tokens": tokens,
        "wall_s": wall_s,
        "cpu_s": cpu_s,
        "pass_rates": by_row,
        "tiers": [r.extra_info.get("tier") for r in trainer.val_rows],
        "torch_threads": torch.get_num_threads(),
    }
    for part in (trainer.actor, trainer.rollout, trainer.prefetcher):
        part.shutdown()
    tmp = out / f".{PASS_FILE}.tmp"
    tmp.write_text(json.dumps(info, indent=1))
    tmp.replace(out / PASS_FILE)  # written last: its presence means the pass is complete
    return info


def read_pass(out: Path, seed: int, task: str, extra: Sequence[str]) -> dict[str, Any] | None:
    """``pass.json`` of this seed, task and overrides in ``out``, or None."""
    path = out / PASS_FILE
    if not path.is_file():
        return None
    info = json.loads(path.read_text())
    same = (info.get("seed"), info.get("task"), info.get("overrides")) == (seed, task, list(extra))
    return info if same and (out / FILTERED_FILE).is_file() else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--task", default="reasoning_wide")
    ap.add_argument("overrides", nargs="*", help="key=value overrides of the reasoning preset")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    info = read_pass(args.out, args.seed, args.task, args.overrides) or run_pass(
        args.seed, args.out, args.task, args.overrides
    )
    print(
        f"seed {args.seed}: {info['kept']} of {info['prompts']} prompts with spread "
        f"(kept rate {info['kept_rate']:.3f}; {info['all_wrong']} all wrong, {info['all_right']} all right), "
        f"{info['generated_response_tokens']:.0f} tokens in {info['wall_s']:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
