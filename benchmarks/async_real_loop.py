"""Async generation with partial rollouts against the sequential strategies, in the real loop.

For each seed, and for each arm in turn (interleaved: seed by seed, arm by arm, one run at a
time), runs ``dapo train --config-name reasoning`` with the in-process vLLM engine on
``data.builtin_task=--task`` (``reasoning_longtail``: chains of 1 to 16 operations, responses
from 25 to about 240 tokens; ``reasoning``: the normal mix of 9 to 12) and the reasoning
model's head-size-32 variant (vLLM's CPU attention has no kernel for the preset model's 24;
for the long tail, the variant warm-started also on chains of 1 to 16 operations):

  verl           strategy=verl with the on-policy fast path (the recipe's sequential rounds)
  default        strategy=default (carry-over, adaptive rounds, solve-rate skipping)
  stream         strategy=stream (groups launched one by one; the batch closes in draw order)
  one_step_off   strategy=default with algorithm.filter_groups.prefetch=true: the next step's
                 batch is generated on the engine while this step trains, from the weights one
                 update back (verl's one-step-off policy), token-level IS correction
  async_partial  async_training.mode=colocate_async with partial rollouts: generation on its
                 own thread never waits for the update, requests in flight at a weight sync go
                 on from their tokens so far, staleness bound 2 (drop), token-level IS

Training and generation each get one torch thread: the sequential arms use one core at a time,
the two overlapping arms (``one_step_off``, ``async_partial``) up to two.

Per run, from its metrics: wall per step (``timing_s/step``, validation excluded; its mean over
steps 2 and later too, as step 1 also pays vLLM's warm-up), generated response tokens (for
``async_partial`` with the tokens of requests aborted for good, which never reach a step's count)
per trained token, tokens thrown away (generated minus trained: filtered, dropped, aborted, or
left in the pool at the end), the mean length of the trained responses against all finished ones,
and held-out accuracy against training time and generated tokens.

Each run's record is written to ``--out/results/<arm>-seed<S>.json`` (and ``--records``) as soon
as it finishes, and the report (``async.json``, ``async.md``, ``async_acc_vs_wall.png``,
``async_acc_vs_tokens.png``) is rewritten after every run. Running the same command again reads
the finished runs measured on the same model (``start_model``, its weights' digest: a warm start
built on another CPU is another model) and continues a cut-off one from its last checkpoint.

    .venv/bin/python benchmarks/async_real_loop.py --seeds 1 2 3 --steps 30 --out DIR \\
        [--task reasoning_longtail|reasoning] [--records DIR] [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from coverage_report import matched, plot
from reasoning_runs import model_digest, run_usage, train_reasoning

from dapo.outputs.records import read_metrics

ARMS: dict[str, list[str]] = {
    "verl": ["algorithm.filter_groups.strategy=verl", "actor_rollout_ref.actor.on_policy_fast_path=true"],
    "default": ["algorithm.filter_groups.strategy=default"],
    "stream": ["algorithm.filter_groups.strategy=stream"],
    "one_step_off": [
        "algorithm.filter_groups.strategy=default",
        "algorithm.filter_groups.prefetch=true",
        "algorithm.rollout_correction.rollout_is=token",
    ],
    "async_partial": [
        "algorithm.filter_groups.strategy=default",
        "async_training.mode=colocate_async",
        "async_training.partial_rollout=true",
    ],
}
P = "dynamic_sampling/"


# reasoning_longtail: a 16-operation chain's prompt is 94 tokens and its right working 242 (with
# EOS), which the preset's overlong shaping (from 216 tokens) would penalise; prompt and response
# fill the model's 352 positions
LONGTAIL = [
    "data.max_prompt_length=96",
    "data.max_response_length=256",
    "reward_model.overlong_buffer.enable=false",
]


def base_overrides(args: argparse.Namespace, model: Path) -> list[str]:
    return [
        *(LONGTAIL if args.task == "reasoning_longtail" else []),
        f"data.builtin_task={args.task}",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.rollout.name=vllm",
        f"trainer.save_freq={args.save_freq}",
        "trainer.resume_mode=auto",
        "trainer.max_actor_ckpt_to_keep=1",
        *args.overrides,
    ]


def run_record(run_dir: Path, arm: str, seed: int, load: Sequence[float]) -> dict[str, Any]:
    """A finished run's figures, from its ``metrics.jsonl``."""
    rows = read_metrics(run_dir)
    steps = [r for s, r in sorted(rows.items()) if s > 0 and "timing_s/step" in r]
    wall = tok = aborted = 0.0
    points = []
    for s, r in sorted(rows.items()):
        if s > 0 and "timing_s/step" in r:
            wall += float(r["timing_s/step"])
            tok += float(r.get(P + "generated_response_tokens", 0.0))
            aborted = float(r.get("async/aborted_response_tokens_total", aborted))
        if "val/acc" in r:
            point = {"step": s, "wall_s": wall, "gen_tokens": tok + aborted, "acc": float(r["val/acc"])}
            points.append(point)
    aborted_async = max(
        (float(r.get("async/aborted_response_tokens_total", 0.0)) for r in steps), default=0.0
    )
    generated = tok + aborted_async
    trained = sum(float(r.get(P + "trained_response_tokens", 0.0)) for r in steps)
    groups = [float(r.get(P + "trained_groups", 0.0)) for r in steps]

    def weighted(key: str) -> float | None:
        pairs = [(float(r[key]), g) for r, g in zip(steps, groups, strict=True) if key in r and g > 0]
        w = sum(g for _, g in pairs)
        return sum(v * g for v, g in pairs) / w if w else None

    step_s = [float(r["timing_s/step"]) for r in steps]
    usage = run_usage(run_dir)
    return {
        "arm": arm,
        "seed": seed,
        "steps": len(steps),
        "curve": points,
        "final_acc": points[-1]["acc"] if points else None,
        "wall_s": wall,
        "step_s": statistics.fmean(step_s) if step_s else None,
        "step_s_after_first": statistics.fmean(step_s[1:]) if len(step_s) > 1 else None,
        "gen_s_per_step": statistics.fmean(float(r.get("timing_s/gen", 0.0)) for r in steps)
        if steps
        else None,
        "generated_tokens": generated,
        "aborted_tokens": aborted_async
        + sum(float(r.get(P + "aborted_response_tokens", 0.0)) for r in steps),
        "trained_tokens": trained,
        "thrown_away_tokens": generated - trained,
        "gen_per_trained_token": generated / trained if trained else None,
        "trained_length_mean": weighted(P + "trained_response_length_mean"),
        "finished_length_mean": weighted(P + "finished_response_length_mean"),
        "staleness_mean": statistics.fmean(float(r.get(P + "staleness_mean", 0.0)) for r in steps)
        if steps
        else None,
        "resumed_requests": max(
            (float(r.get("async/resumed_requests_total", 0.0)) for r in steps), default=0.0
        ),
        "cpu_s": usage["cpu_s"],
        "process_wall_s": usage["wall_s"],
        "load_before_after": list(load),
    }


def _mean(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.fmean(vals) if vals else None


def summarize(records: Sequence[Mapping[str, Any]], arms: Sequence[str]) -> dict[str, Any]:
    """Per arm, the mean over its seeds; accuracy at the cheapest arm's final budget per seed."""
    by_seed: dict[int, list[Mapping[str, Any]]] = {}
    for r in records:
        by_seed.setdefault(int(r["seed"]), []).append(r)
    at_budget: dict[tuple[str, int], dict[str, float | None]] = {}
    for seed, rs in by_seed.items():
        for x in ("wall_s", "gen_tokens"):
            for arm, acc in matched(rs, x)["acc"].items():
                at_budget.setdefault((arm, seed), {})[x] = acc
    out = {}
    for arm in arms:
        rs = [r for r in records if r["arm"] == arm]
        if not rs:
            continue
        keys = (
            "final_acc",
            "step_s",
            "step_s_after_first",
            "gen_s_per_step",
            "generated_tokens",
            "trained_tokens",
            "thrown_away_tokens",
            "aborted_tokens",
            "gen_per_trained_token",
            "trained_length_mean",
            "finished_length_mean",
            "staleness_mean",
            "cpu_s",
        )
        s: dict[str, Any] = {k: _mean([r.get(k) for r in rs]) for k in keys}
        s["seeds"] = sorted(int(r["seed"]) for r in rs)
        s["final_acc_by_seed"] = [r["final_acc"] for r in sorted(rs, key=lambda r: r["seed"])]
        s["acc_at_cheapest_wall"] = _mean([at_budget[(arm, int(r["seed"]))]["wall_s"] for r in rs])
        s["acc_at_cheapest_tokens"] = _mean([at_budget[(arm, int(r["seed"]))]["gen_tokens"] for r in rs])
        out[arm] = s
    return out


def markdown(summary: Mapping[str, Any], task: str) -> str:
    def f(v: Any, fmt: str, scale: float = 1.0) -> str:
        return "-" if v is None else format(v * scale, fmt)

    lines = [
        f"Task `{task}`, mean over seeds (held-out accuracy per seed in brackets).",
        "",
        "| arm | seeds | held-out acc | acc at cheapest wall | acc at cheapest tokens | wall/step s "
        "| after step 1 | generated tokens | gen/trained token | thrown away | trained len | finished len "
        "| staleness |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, s in summary.items():
        accs = ", ".join(f(a, ".3f") for a in s["final_acc_by_seed"])
        lines.append(
            f"| `{arm}` | {len(s['seeds'])} | {f(s['final_acc'], '.3f')} ({accs}) "
            f"| {f(s['acc_at_cheapest_wall'], '.3f')} | {f(s['acc_at_cheapest_tokens'], '.3f')} "
            f"| {f(s['step_s'], '.2f')} | {f(s['step_s_after_first'], '.2f')} "
            f"| {f(s['generated_tokens'], '.2f', 1e-6)} M | {f(s['gen_per_trained_token'], '.2f')} "
            f"| {f(s['thrown_away_tokens'], '.2f', 1e-6)} M | {f(s['trained_length_mean'], '.1f')} "
            f"| {f(s['finished_length_mean'], '.1f')} | {f(s['staleness_mean'], '.2f')} |"
        )
    return "\n".join(lines) + "\n"


def report(out: Path, records: Sequence[Mapping[str, Any]], args: argparse.Namespace) -> None:
    arms = [a for a in args.arms if any(r["arm"] == a for r in records)]
    summary = summarize(records, arms)
    (out / "async.json").write_text(
        json.dumps({"task": args.task, "summary": summary, "runs": list(records)}, indent=1) + "\n"
    )
    (out / "async.md").write_text(markdown(summary, args.task))
    plot(
        records,
        arms,
        out,
        prefix="async",
        labels=("training time, s (validation excluded)", "generated response tokens"),
    )


def rescan(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The records of the finished runs in ``--out`` computed again from their run directories
    (after a change to :func:`run_record`), each keeping the load it recorded."""
    records = []
    for path in sorted((args.out / "results").glob("*-seed*.json")):
        old = json.loads(path.read_text())
        rec = run_record(args.out / path.stem, old["arm"], int(old["seed"]), old["load_before_after"])
        if "start_model" in old:
            rec["start_model"] = old["start_model"]
        for d in [args.out / "results"] + ([args.records] if args.records else []):
            (d / path.name).write_text(json.dumps(rec, indent=1) + "\n")
        records.append(rec)
    return records


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--test-freq", type=int, default=10)
    ap.add_argument("--save-freq", type=int, default=5)
    ap.add_argument("--task", default="reasoning_longtail", choices=("reasoning_longtail", "reasoning"))
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--records", type=Path, help="where finished runs' records are kept and read")
    ap.add_argument("--model", type=Path, help="the model (default: the task's head-32 reasoning model)")
    ap.add_argument("--rescan", action="store_true", help="recompute the finished runs' records and report")
    ap.add_argument("overrides", nargs="*", help="key=value for every run")
    args = ap.parse_args()
    if args.rescan:
        report(args.out, rescan(args), args)
        print((args.out / "async.md").read_text())
        return 0
    from dapo.tasks.tiny_reasoning_model import ensure_longtail_model_hd32, ensure_reasoning_model_hd32

    ensure = ensure_longtail_model_hd32 if args.task == "reasoning_longtail" else ensure_reasoning_model_hd32
    model = args.model or ensure(log=lambda s: print(s, file=sys.stderr, flush=True))
    # a warm start built on another CPU (another instruction set, other rounding) is another
    # model: a record is reused only for the model it was measured on
    digest = model_digest(model)
    out = args.out
    (out / "results").mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(exist_ok=True)
    stores = [out / "results"] + ([args.records] if args.records else [])
    for d in stores:
        d.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    records: list[dict[str, Any]] = []
    for seed in args.seeds:
        for arm in args.arms:
            name = f"{arm}-seed{seed}.json"
            found = next((d / name for d in stores if (d / name).is_file()), None)
            if found is not None:
                rec = json.loads(found.read_text())
                if rec.get("steps") == args.steps and rec.get("start_model") == digest:
                    records.append(rec)
                    continue
            run_dir = out / f"{arm}-seed{seed}"
            load0 = os.getloadavg()[0]
            train_reasoning(
                run_dir,
                seed,
                args.steps,
                args.test_freq,
                [*base_overrides(args, model), *ARMS[arm]],
                resume=True,
                log=out / "logs" / f"{arm}-seed{seed}.log",
            )
            rec = run_record(run_dir, arm, seed, (load0, os.getloadavg()[0]))
            rec["start_model"] = digest
            for d in stores:
                (d / name).write_text(json.dumps(rec, indent=1) + "\n")
            records.append(rec)
            report(out, records, args)
            print(
                f"[{time.time() - t0:7.0f} s] seed {seed} {arm}: held-out {rec['final_acc']}, "
                f"{rec['step_s']:.2f} s/step, {rec['generated_tokens'] / 1e6:.2f} M tokens "
                f"({rec['gen_per_trained_token']:.2f} per trained), trained len "
                f"{rec['trained_length_mean']:.1f} vs finished {rec['finished_length_mean']:.1f}, "
                f"load {load0:.1f}",
                flush=True,
            )
    report(out, records, args)
    print((out / "async.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
