"""The crash suite: SIGKILL `dapo train` at random moments, including mid-save, resume each time
with the same command until the run finishes, and check every finished run against one that was
never killed.

    python benchmarks/crash_suite.py [--kills 20] [--steps 6] [--save-freq 2] [--seed 0] [--prefetch]

A kill moment is drawn per attempt: a random delay after the start (uniform over a straight
run's wall time), or the moment the attempt starts writing one of its checkpoints (drawn from
those it has left to write) plus a random few milliseconds (counted as mid-save only when the
checkpoint's temporary directory is still there after the kill). Trajectories (one run directory each, killed and resumed until it finishes) are
run until ``--kills`` kills have landed. Every finished trajectory must have final weights
bitwise equal to the straight run's, metrics.jsonl and groups.jsonl with steps 1..N once each,
the straight run's per-step metrics, and the straight run's summary validation. Prints one line
per attempt and a JSON summary; exits 1 if any check failed.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from runs import (  # noqa: E402  (the tests' helpers, one directory over)
    kill_when,
    latest_checkpoint,
    metrics_by_step,
    saving,
    small_run_args,
    subprocess_env,
    write_mod3_task,
    write_tiny_random_model,
)

MAX_ATTEMPTS = 25  # per trajectory: a run that cannot get past its kills is itself a failure


def _steps(path: Path) -> list[int]:
    try:
        return [json.loads(line)["step"] for line in path.read_text().splitlines()]
    except (OSError, ValueError, KeyError) as e:
        return [f"unreadable: {e}"]  # type: ignore[list-item]


def _weights(run: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run / "final_model" / "model.safetensors"))


def _check(run: Path, straight: Path, steps: int) -> list[str]:
    import torch

    problems = []
    for name in ("metrics.jsonl", "groups.jsonl"):
        got = _steps(run / name)
        if got != list(range(1, steps + 1)):
            problems.append(f"{name} holds steps {got}")
    want, got = metrics_by_step(straight), metrics_by_step(run)
    differ = [s for s in want if got.get(s) != want[s]]
    if differ:
        problems.append(f"metrics of steps {differ} differ from the straight run's")
    a, b = _weights(straight), _weights(run)
    if a.keys() != b.keys() or not all(torch.equal(a[k], b[k]) for k in a):
        problems.append("final weights differ from the straight run's")
    sa, sb = (json.loads((r / "summary.json").read_text()) for r in (straight, run))
    for key in ("steps", "val_acc_after", "val_after"):
        if sa[key] != sb[key]:
            problems.append(f"summary {key}: {sb[key]!r}, straight run {sa[key]!r}")
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--save-freq", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mid-save-share", type=float, default=0.4, help="share of attempts killed mid-save")
    p.add_argument("--prefetch", action="store_true", help="algorithm.filter_groups.prefetch=true")
    p.add_argument("--out", help="work directory (default: a new temporary one)")
    args = p.parse_args(argv)
    rng = random.Random(args.seed)
    work = Path(args.out or tempfile.mkdtemp(prefix="dapo-crash-"))
    work.mkdir(parents=True, exist_ok=True)
    model = write_tiny_random_model(work / "model")
    task = write_mod3_task(work / "task")
    extra = [f"trainer.save_freq={args.save_freq}", "algorithm.filter_groups.carry_over=true"]
    if args.prefetch:
        extra += ["algorithm.filter_groups.prefetch=true", "algorithm.filter_groups.max_staleness=2"]
    env = subprocess_env()

    def command(run: Path) -> list[str]:
        return [sys.executable, "-m", "dapo.cli", *small_run_args(run, model, task, args.steps, *extra)]

    straight = work / "straight"
    t0 = time.monotonic()
    subprocess.run(command(straight), env=env, check=True, capture_output=True)
    run_s = time.monotonic() - t0
    print(
        f"straight run: {run_s:.1f}s for {args.steps} steps (the random delays are drawn from 0..{run_s:.1f}s)"
    )

    kills = {"delay": 0, "mid-save": 0, "mid-save, after the checkpoint completed": 0}
    trajectories, failures, attempts_total = [], [], 0
    while sum(kills.values()) < args.kills:
        run = work / f"run{len(trajectories)}"
        attempts = []
        while len(attempts) < MAX_ATTEMPTS:
            before = latest_checkpoint(run)
            with (work / f"{run.name}.log").open("a") as log:
                proc = subprocess.Popen(command(run), stdout=log, stderr=subprocess.STDOUT, env=env)
            start = time.monotonic()
            # the checkpoints this attempt will write: every save_freq-th step after the latest, and the last
            saves = sorted(
                {s for s in range(before + 1, args.steps + 1) if s % args.save_freq == 0} | {args.steps}
            )
            if rng.random() < args.mid_save_share and before < args.steps:
                kind, lag, target = "mid-save", rng.uniform(0.0, 0.03), rng.choice(saves)
                seen: list[float] = []

                def moment(proc=proc, lag=lag, seen=seen, run=run, target=target) -> bool:
                    if not saving(run, proc.pid, target):
                        return False
                    seen[:] = seen or [time.monotonic()]
                    return time.monotonic() - seen[0] >= lag

            else:
                kind, delay = "delay", rng.uniform(0.0, run_s)

                def moment(start=start, delay=delay) -> bool:
                    return time.monotonic() - start >= delay

            killed = kill_when(proc, moment) if sum(kills.values()) < args.kills else False
            if not killed:
                proc.wait()
            if killed and kind == "mid-save" and not saving(run, proc.pid):
                kind = "mid-save, after the checkpoint completed"
            attempts_total += 1
            line = f"{run.name} attempt {len(attempts) + 1}: "
            if killed:
                kills[kind] += 1
                line += f"killed ({kind}) at {time.monotonic() - start:.2f}s"
            else:
                line += f"exit {proc.returncode}"
            line += f", checkpoint {before} -> {latest_checkpoint(run)}"
            print(line, flush=True)
            attempts.append({"killed": killed, "kind": kind if killed else None, "rc": proc.returncode})
            if not killed:
                break
        last = attempts[-1]
        if last["killed"]:
            problems = [f"not finished after {MAX_ATTEMPTS} attempts"]
        elif last["rc"] != 0:
            problems = [f"the last attempt exited {last['rc']} (see {work / run.name}.log)"]
        else:
            problems = _check(run, straight, args.steps)
        trajectories.append({"run": run.name, "attempts": len(attempts), "problems": problems})
        failures += [f"{run.name}: {p}" for p in problems]
        print(f"{run.name}: {'OK' if not problems else 'FAILED: ' + '; '.join(problems)}", flush=True)

    result = {
        "kills": sum(kills.values()),
        "kills_by_moment": kills,
        "trajectories": len(trajectories),
        "attempts": attempts_total,
        "trajectories_equal_to_straight_run": sum(not t["problems"] for t in trajectories),
        "failures": failures,
        "steps": args.steps,
        "save_freq": args.save_freq,
        "prefetch": args.prefetch,
        "work_dir": str(work),
    }
    print(json.dumps(result, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
