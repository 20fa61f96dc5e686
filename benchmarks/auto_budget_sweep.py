"""PPO-update tokens/s with ``ppo_max_token_len_per_gpu=auto`` against a sweep of fixed budgets.

python benchmarks/auto_budget_sweep.py [--rounds 5] [--memory-limit-gb G] [--json]

The built-in tiny model, an RL-like batch (``dapo.bench.update.rl_batch``), the padded forward
with token-budget micro-batches. ``auto`` chooses its budget once (probe), then every variant runs
once per round in a rotating order; tokens/s is the median over rounds and the ratio to the best
fixed budget is the median of per-round ratios. ``--memory-limit-gb`` sizes ``auto`` against a
limit instead of the free RAM.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from dapo.actor.dp_actor import Actor, actor_settings
from dapo.bench.common import load_default, set_threads
from dapo.bench.update import rl_batch
from dapo.config.schema import AutoBudgetConfig

FIXED = (256, 512, 1024, 2048, 4096, 8192)
ROWS, P_MAX, R_MAX = 64, 32, 224


def _actor(model: torch.nn.Module, budget: int | None, limit: float | None, logs: list[str]) -> Actor:
    s = actor_settings(
        ppo_mini_batch_size=ROWS,
        ppo_micro_batch_size_per_gpu=ROWS,
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        clip_ratio_c=10.0,
        kl_loss_coef=0.0,
        use_dynamic_bsz=True,
        ppo_max_token_len_per_gpu="auto" if budget is None else budget,
        rollout=dict(log_prob_micro_batch_size_per_gpu=ROWS),
        auto_budget=AutoBudgetConfig(memory_limit_gb=limit),
    )
    a = Actor(model, torch.optim.SGD(model.parameters(), lr=0.0), s)
    a.log = logs.append
    return a


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--memory-limit-gb", type=float, default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    set_threads(args.threads)
    model = load_default()[0]
    batch = rl_batch(ROWS, P_MAX, R_MAX, model.config.vocab_size, seed=0)
    tokens = float(batch.tensors["attention_mask"].sum())
    logs: list[str] = []
    actors = {f"fixed {b}": _actor(model, b, None, logs) for b in FIXED}
    auto = _actor(model, None, args.memory_limit_gb, logs)
    actors["auto"] = auto
    auto.update_policy(batch)  # probe and choose once (lr 0: the weights do not move)
    for a in actors.values():
        a.update_policy(batch)  # warm-up
    names = list(actors)
    tps: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        for n in names[r % len(names) :] + names[: r % len(names)]:
            t = time.perf_counter()
            actors[n].update_policy(batch)
            tps[n].append(tokens / (time.perf_counter() - t))
    med = {n: statistics.median(v) for n, v in tps.items()}
    best = max((n for n in names if n != "auto"), key=lambda n: med[n])
    ratio = statistics.median(a / b for a, b in zip(tps["auto"], tps[best]))
    out = {
        "tokens_per_step": tokens,
        "tokens_per_s": {n: round(v, 1) for n, v in med.items()},
        "auto_budget": auto.ppo_budget,
        "best_fixed": best,
        "auto_over_best_fixed": round(ratio, 3),
        "auto_log": logs,
    }
    if args.json:
        print(json.dumps(out))
    else:
        for n in names:
            print(f"{n:>12}: {med[n]:9.1f} tokens/s")
        print(f"auto chose {out['auto_budget']} tokens; auto / best fixed ({best}) = {ratio:.3f}")
        print("\n".join(logs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
