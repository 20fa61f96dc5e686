"""The real-loop proof against what a verl user runs, on a pool too large to keep revisiting.

For each seed, and for each arm in turn (interleaved: seed by seed, arm by arm, ``--parallel``
runs at a time, one torch thread each), runs ``dapo train --config-name reasoning`` on
``data.builtin_task=--task`` (default ``reasoning_wide``: 1536 training chains, held out on
every tier including ``beyond``):

  verl           strategy=verl with the on-policy fast path (old log-probs not recomputed)
  verl_filtered  strategy=verl on the pool filtered offline: one pass of rollout.n samples over
                 the pool with the start model, the prompts all wrong or all right dropped
                 (``benchmarks/offline_filter.py``; the pass's tokens and time count against it)
  verl_tuned     strategy=verl on the whole pool, data.gen_batch_size sized to the same pass's
                 kept rate: ceil(train_batch_size / kept_rate * --margin) (its cost counts too)
  ours           strategy=default (carry-over, adaptive rounds) with the Beta-posterior skip rule
                 (skip.rule=posterior, the default when the kept records were made)
  ours_trend     strategy=default with the trend skip rule (skip.rule=trend, the default now)
  ours_noskip    strategy=default with algorithm.filter_groups.skip.enable=false
  grpo           no filtering (algorithm.filter_groups.enable=false), gen_batch_size equal to
                 train_batch_size so a step trains as many prompts as the others

Each run's record is written to ``--out/results/<arm>-seed<S>.json`` as soon as it finishes, and
the report (``coverage.json``, ``coverage.md``, ``coverage_acc_vs_wall.png``,
``coverage_acc_vs_tokens.png``) is rewritten after every run. Running the same command again
reads the finished runs instead of running them; a run cut off (a killed session) continues from
its last checkpoint (``trainer.save_freq``, ``trainer.resume_mode=auto``); the offline pass of a
seed is run once and kept (``--out/offline-seed<S>/``).

Reported per arm and seed: held-out accuracy against training time (the sum of
``timing_s/step``; validation excluded) and generated response tokens, the accuracy of each arm
at the cost where the cheapest arm of the seed ends (linear between validations), the final
accuracy per tier and on the held-out chains that no sample solved at the step-0 validation,
the mean ``train/acc_generated`` of the last ``--test-freq`` steps minus the final held-out
accuracy (the pool and the held-out set mix the tiers differently, so read it between arms,
not as a generalisation gap on its own), and the distinct prompts trained (from the rollout
dumps). Each record also holds the run's CPU seconds and the share of a core it got (its
wall-clock figures grow with the machine's load; its CPU seconds do not).

    .venv/bin/python benchmarks/coverage_real_loop.py --seeds 1 2 3 --steps 100 --out DIR \\
        [--records DIR] [--task reasoning_wide|reasoning] [key=value ...]

The finished runs of this project's proof are kept in ``docs/results/coverage_real_loop/``
(``--records``), so that a later session continues with the runs still missing. They were made
with torch's CPU kernels capped at AVX2 (``--cpu-isa``, the default): each record names the
digest of the warm start it began from, and only the same cap rebuilds that warm start bit for
bit on another machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from coverage_report import ROLLOUT_DIR, VALIDATION_DIR, markdown, plot, run_record, summarize
from offline_filter import FILTERED_FILE, read_pass, tuned_gen_batch_size
from reasoning_runs import ISA_ENV, PRESET, model_digest, pin_cpu_isa, train_args, train_reasoning

VERL = ["algorithm.filter_groups.strategy=verl", "actor_rollout_ref.actor.on_policy_fast_path=true"]
ARMS: dict[str, list[str]] = {
    "verl": VERL,
    "verl_filtered": VERL,
    "verl_tuned": VERL,
    "ours": ["algorithm.filter_groups.strategy=default", "algorithm.filter_groups.skip.rule=posterior"],
    "ours_trend": ["algorithm.filter_groups.strategy=default", "algorithm.filter_groups.skip.rule=trend"],
    "ours_noskip": ["algorithm.filter_groups.strategy=default", "algorithm.filter_groups.skip.enable=false"],
    "grpo": ["algorithm.filter_groups.enable=false", "data.gen_batch_size=${data.train_batch_size}"],
}
OFFLINE_ARMS = ("verl_filtered", "verl_tuned")
PASS = "offline_pass"  # the job of a seed's offline pass
HERE = Path(__file__).resolve().parent
# reasoning_wide's held-out rows are tier-interleaved, so the first 96 are 16 easy, 32 medium, 32
# hard and 16 beyond: half the validation time of all 192, which keeps 6 arms x 3 seeds x 100
# steps within 3 hours at a core per run (docs/results.md, "Not run yet")
VAL_SAMPLES = 96
RESULTS = "results"


def spec(args: argparse.Namespace, arm: str, seed: int) -> dict[str, Any]:
    """What a run's record depends on: a record of another spec is run again."""
    return {
        "arm": arm,
        "seed": seed,
        "task": args.task,
        "steps": args.steps,
        "test_freq": args.test_freq,
        "val_samples": args.val_samples,
        "save_freq": args.save_freq,
        "margin": args.margin if arm == "verl_tuned" else None,
        "overrides": list(args.overrides),
        # the warm start every arm begins from: a session that rebuilds it differently runs again
        "start_model": args.start_model,
    }


def result_path(records: Path, arm: str, seed: int) -> Path:
    return records / f"{arm}-seed{seed}.json"


def finished_record(records: Path, run_spec: Mapping[str, Any]) -> dict[str, Any] | None:
    """The record of this spec's run when it finished before (in ``records``), else None."""
    path = result_path(records, run_spec["arm"], run_spec["seed"])
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    return record if record.get("spec") == dict(run_spec) else None


def write_record(records: Path, record: Mapping[str, Any]) -> Path:
    path = result_path(records, record["arm"], record["seed"])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(path)
    return path


def base_overrides(args: argparse.Namespace) -> list[str]:
    return [*args.overrides, f"data.builtin_task={args.task}"]


def run_keys(args: argparse.Namespace, run_dir: Path) -> list[str]:
    """The keys every run sets last: checkpoints to resume from, dumps for the report."""
    return [
        f"trainer.save_freq={args.save_freq}",
        "trainer.resume_mode=auto",
        "trainer.max_actor_ckpt_to_keep=1",
        "trainer.val_before_train=true",
        f"data.val_max_samples={args.val_samples}",
        f"trainer.validation_data_dir={run_dir / VALIDATION_DIR}",
        f"trainer.rollout_data_dir={run_dir / ROLLOUT_DIR}",
    ]


def check_arms(args: argparse.Namespace) -> None:
    """Every arm's configuration loads and validates (as ``dapo validate``), before any run."""
    from dapo.config.load import load_config
    from dapo.config.validate import validate

    for arm, keys in ARMS.items():
        problems: list[str] = []
        overrides = train_args(1, args.steps, args.test_freq, [*base_overrides(args), *keys])
        cfg = load_config([*overrides, *run_keys(args, args.out / "check")], preset=PRESET, problems=problems)
        problems += validate(cfg)
        if problems:
            sys.exit(f"arm {arm}: its configuration does not validate: " + "; ".join(problems))


def start_model_digest(args: argparse.Namespace) -> str:
    """:func:`model_digest` of the warm-started model, built here if absent."""
    from dapo.tasks import builtin_model

    return model_digest(builtin_model(args.task, log=lambda line: print(line, file=sys.stderr, flush=True)))


def preset_value(args: argparse.Namespace, key: str) -> Any:
    from dapo.config.load import load_config

    cfg = load_config(base_overrides(args), preset=PRESET)
    for part in key.split("."):
        cfg = cfg[part]
    return cfg


class OfflinePasses:
    """The offline pass of each seed, run once (in its own process, one torch thread) and kept."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.locks: dict[int, threading.Lock] = {}
        self.guard = threading.Lock()

    def dir(self, seed: int) -> Path:
        return self.args.out / f"offline-seed{seed}"

    def get(self, seed: int) -> dict[str, Any]:
        with self.guard:
            lock = self.locks.setdefault(seed, threading.Lock())
        with lock:  # verl_filtered and verl_tuned of a seed share it
            out, extra = self.dir(seed), list(self.args.overrides)
            info = read_pass(out, seed, self.args.task, extra)
            if info is None:
                out.mkdir(parents=True, exist_ok=True)
                cmd = [
                    sys.executable,
                    str(HERE / "offline_filter.py"),
                    "--seed",
                    str(seed),
                    "--out",
                    str(out),
                ]
                with open(out / "pass.log", "a") as log:
                    subprocess.run(
                        [*cmd, "--task", self.args.task, *extra],
                        check=True,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                info = read_pass(out, seed, self.args.task, extra)
            return info


def arm_overrides(
    args: argparse.Namespace, arm: str, offline: Mapping[str, Any] | None, out_dir: Path, sizes: Mapping
) -> tuple[list[str], dict[str, Any] | None]:
    """The arm's overrides and what its offline pass cost and set (None without one)."""
    keys = [*base_overrides(args), *ARMS[arm]]
    if offline is None:
        return keys, None
    cost = {k: offline[k] for k in ("generated_response_tokens", "wall_s", "kept_rate", "kept", "prompts")}
    if arm == "verl_filtered":
        keys += [f"data.train_files={out_dir / FILTERED_FILE}", f"data.val_files={sizes['test_parquet']}"]
    else:
        g = tuned_gen_batch_size(
            sizes["train_batch_size"], offline["kept_rate"], args.margin, offline["prompts"]
        )
        keys.append(f"data.gen_batch_size={g}")
        cost["gen_batch_size"] = g
    return keys, cost


def run_arm(
    args: argparse.Namespace, arm: str, seed: int, passes: OfflinePasses, task: Mapping[str, Any]
) -> dict[str, Any]:
    """One run's record: read when finished before, else (continued or) run and recorded."""
    run_spec = spec(args, arm, seed)
    done = finished_record(args.records, run_spec)
    if done is not None:
        return done
    offline = passes.get(seed) if arm in OFFLINE_ARMS else None
    keys, cost = arm_overrides(args, arm, offline, passes.dir(seed), task)
    run_dir = args.out / f"{arm}-seed{seed}"
    (args.out / "logs").mkdir(parents=True, exist_ok=True)
    train_reasoning(
        run_dir,
        seed,
        args.steps,
        args.test_freq,
        keys,
        run_keys(args, run_dir),
        resume=True,
        log=args.out / "logs" / f"{arm}-seed{seed}.log",
    )
    record = run_record(
        run_dir, arm, seed, task["val_tiers"], task["train_tiers"], offline=cost, window=args.test_freq
    )
    record["spec"] = run_spec
    write_record(args.records, record)
    return record


def job_order(seeds: Sequence[int], arms: Sequence[str]) -> list[tuple[int, str]]:
    """``(seed, job)`` in start order: for each seed its offline pass first (when an arm needs
    one), then the arms without one, then those with one, so that no slot waits on the pass
    while another arm could run."""
    needs = [a for a in arms if a in OFFLINE_ARMS]
    order = [a for a in arms if a not in OFFLINE_ARMS] + needs
    return [(seed, job) for seed in seeds for job in ([PASS] if needs else []) + order]


def tiers_of(path: Path) -> dict[str, str]:
    """question -> tier of a task parquet's rows."""
    from dapo.data.parquet import read_rows

    return {r["extra_info"]["question"]: r["extra_info"]["tier"] for r in read_rows(path)}


def report(out: Path, records: Sequence[Mapping[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    arms = [a for a in ARMS if any(r["arm"] == a for r in records)]
    summary = summarize(records, arms)
    summary.update(
        task=args.task,
        steps=args.steps,
        test_freq=args.test_freq,
        val_samples=args.val_samples,
        overrides=list(args.overrides),
        seeds=sorted({r["seed"] for r in records}),
    )
    (out / "coverage.json").write_text(json.dumps({"summary": summary, "runs": list(records)}, indent=1))
    (out / "coverage.md").write_text(markdown(summary))
    plot(records, arms, out)
    return summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--test-freq", type=int, default=10)
    ap.add_argument(
        "--val-samples",
        type=int,
        default=VAL_SAMPLES,
        help=f"held-out prompts per validation (data.val_max_samples; default {VAL_SAMPLES}, -1: all)",
    )
    ap.add_argument("--save-freq", type=int, default=10, help="checkpoint every N steps, to resume from")
    ap.add_argument("--margin", type=float, default=1.25, help="verl_tuned: gen_batch_size headroom")
    ap.add_argument("--task", choices=("reasoning_wide", "reasoning"), default="reasoning_wide")
    ap.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    ap.add_argument("--parallel", type=int, default=2, help="runs at a time (one torch thread each)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument(
        "--records",
        type=Path,
        help="where finished runs' records are read and written (default OUT/results): keep them "
        "somewhere lasting to continue the runs on another machine or in a later session",
    )
    ap.add_argument(
        "--cpu-isa",
        choices=[*ISA_ENV, "native"],
        default="avx2",
        help="cap torch's CPU kernels at this instruction set (default avx2, the one the kept records "
        "were made with: their warm start is then rebuilt bit for bit on any AVX2 or AVX-512 machine; "
        "native: the machine's own, a different warm start on an AVX-512 machine)",
    )
    ap.add_argument("overrides", nargs="*", help="extra key=value overrides for every run")
    args = ap.parse_args()
    if args.steps % args.test_freq:
        ap.error("--steps must be a multiple of --test-freq (the last validation closes the curve)")
    pin_cpu_isa(None if args.cpu_isa == "native" else args.cpu_isa)
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    args.records = (args.records or args.out / RESULTS).resolve()
    check_arms(args)
    args.start_model = start_model_digest(args)
    from dapo.tasks import builtin_task

    train_parquet, test_parquet = builtin_task(args.task)
    task = {
        "val_tiers": tiers_of(test_parquet),
        "train_tiers": tiers_of(train_parquet),
        "test_parquet": str(test_parquet),
        "train_batch_size": int(preset_value(args, "data.train_batch_size")),
    }
    passes = OfflinePasses(args)
    t0 = time.time()
    records, failed = [], []
    with ThreadPoolExecutor(max_workers=args.parallel) as pool:
        jobs = {}
        for seed, name in job_order(args.seeds, args.arms):  # interleaved: seed by seed, arm by arm
            if name == PASS:
                jobs[pool.submit(passes.get, seed)] = (name, seed)
            else:
                jobs[pool.submit(run_arm, args, name, seed, passes, task)] = (name, seed)
        for job in as_completed(jobs):
            arm, seed = jobs[job]
            try:
                r = job.result()
            except (subprocess.CalledProcessError, RuntimeError) as e:
                failed.append((arm, seed))
                print(f"seed {seed} {arm}: failed ({e}); see {args.out}", file=sys.stderr, flush=True)
                continue
            if arm == PASS:
                print(
                    f"[{time.time() - t0:6.0f} s] seed {seed} offline pass: kept rate {r['kept_rate']:.3f} "
                    f"({r['kept']} of {r['prompts']}), {r['wall_s']:.0f} s, {r['cpu_s']:.0f} CPU s",
                    file=sys.stderr,
                    flush=True,
                )
                continue
            records.append(r)
            print(
                f"[{time.time() - t0:6.0f} s] seed {seed} {arm}: held-out {r['final_acc']:.3f}, "
                f"{r['wall_s']:.0f} s training, {r['gen_tokens'] / 1e6:.2f} M tokens, "
                f"{r['distinct_prompts_trained']} prompts trained",
                file=sys.stderr,
                flush=True,
            )
            report(args.out, sorted(records, key=lambda x: (x["seed"], list(ARMS).index(x["arm"]))), args)
    if records:
        print((args.out / "coverage.md").read_text())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
