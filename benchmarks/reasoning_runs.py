"""The ``dapo train --config-name reasoning`` run that the headline and ablation benchmarks share:
one seeded run into its own directory, metrics to jsonl only (no report, no final model), one
torch thread. A run already finished in its directory with the same resolved configuration is
read instead of run again, so an interrupted benchmark resumes and one benchmark can read
another's runs (linked into its directory). With ``resume=True`` an unfinished run of the same
configuration is continued from its last checkpoint (``trainer.resume_mode=auto``, with a
``trainer.save_freq`` in its overrides) instead of started over."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

PRESET = "reasoning"
# each invocation's CPU and wall seconds (run_measured), one line each
CPU_FILE = "cpu_usage.jsonl"
# the running invocation's seconds so far, rewritten every few seconds: an invocation killed with
# its benchmark (a session's end) leaves them here, and the next one adds them to CPU_FILE
PARTIAL_FILE = "cpu_usage.partial.json"
PARTIAL_EVERY_S = 10.0


# torch, MKL and oneDNN each pick their CPU kernels by the instruction set the machine has, and
# kernels of different widths round differently: the same warm start trained on an AVX-512
# machine and on an AVX2-only one are two models. Capping all three at one instruction set makes
# a build and a run the same on any x86 machine that has it.
ISA_ENV: dict[str, dict[str, str]] = {
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
}


def pin_cpu_isa(isa: str | None) -> None:
    """Cap this process's CPU kernels, and those of every run it starts, at instruction set
    ``isa`` (None: the machine's own); the models built under the cap go to a cache of their
    own (``$DAPO_CACHE/isa-<isa>``), apart from those built without it. Call it before anything
    imports torch: torch reads its cap once."""
    if not isa:
        return
    if "torch" in sys.modules:
        raise RuntimeError("pin_cpu_isa must run before torch is imported")
    os.environ.update(ISA_ENV[isa])
    cache = Path(os.environ.get("DAPO_CACHE", "~/.cache/dapo")).expanduser()
    if cache.name != f"isa-{isa}":
        os.environ["DAPO_CACHE"] = str(cache / f"isa-{isa}")


def model_digest(model_dir: Path) -> str:
    """sha256 (16 hex digits) of a model's weights: the records say which model they were measured
    on (a warm start built on another CPU, with other rounding, is another model)."""
    h = hashlib.sha256()
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def train_args(
    seed: int, steps: int, test_freq: int, overrides: list[str], after: list[str] = ()
) -> list[str]:
    """The run's overrides (``after`` win over the fixed keys), without its directory."""
    return [
        *overrides,
        "algorithm.filter_groups.on_exhausted=train",
        f"trainer.seed={seed}",
        f"trainer.total_training_steps={steps}",
        f"trainer.test_freq={test_freq}",
        "trainer.logger=[jsonl]",
        "trainer.report_freq=0",
        "trainer.save_final_model=false",
        "trainer.torch_threads=1",
        *after,
    ]


def _config_text(text: str) -> str:
    """A resolved configuration without the keys that name where it ran."""
    return "\n".join(line for line in text.splitlines() if "default_local_dir:" not in line)


def recorded_config(run_dir: Path, args: list[str]) -> bool:
    """Whether the run in ``run_dir`` (finished or not) started with the configuration ``args``
    resolve to."""
    from dapo.config.load import to_yaml
    from dapo.run_config import build_run_config

    recorded = run_dir / "config.yaml"
    if not recorded.exists():
        return False
    wanted = to_yaml(build_run_config(args, preset=PRESET).cfg)
    return _config_text(recorded.read_text()) == _config_text(wanted)


def same_config(run_dir: Path, args: list[str]) -> bool:
    """Whether the finished run in ``run_dir`` ran with the configuration ``args`` resolve to."""
    return (run_dir / "finished.json").exists() and recorded_config(run_dir, args)


def proc_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, with its waited-for children) of a running process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime stime cutime cstime


def run_measured(cmd: list[str], partial: Path | None = None, **popen: Any) -> dict[str, float]:
    """Run ``cmd``; its CPU seconds (user + system, with its waited-for children) and wall
    seconds. The CPU time does not grow with the machine's load as the wall time does: one
    thread's run takes about its CPU time on an idle core. ``partial``: a file rewritten with the
    seconds so far while it runs. Raises ``CalledProcessError`` when it fails."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, **popen)
    done = threading.Event()

    def sample() -> None:
        while not done.wait(PARTIAL_EVERY_S):
            try:
                cpu = proc_cpu_s(proc.pid)
            except (OSError, ValueError, IndexError):  # exited between two samples
                return
            tmp = partial.with_name(f".{partial.name}.tmp")
            tmp.write_text(json.dumps({"cpu_s": cpu, "wall_s": time.perf_counter() - t0}))
            tmp.replace(partial)

    sampler = threading.Thread(target=sample, daemon=True) if partial is not None else None
    if sampler is not None:
        sampler.start()
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        done.set()
        if sampler is not None:
            sampler.join()
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, cmd)
    return {"cpu_s": usage.ru_utime + usage.ru_stime, "wall_s": time.perf_counter() - t0}


def carry_partial(run_dir: Path) -> None:
    """Add a killed invocation's last sampled seconds (``PARTIAL_FILE``) to ``CPU_FILE``."""
    partial = run_dir / PARTIAL_FILE
    if partial.is_file():
        row = {**json.loads(partial.read_text()), "killed": True}
        with open(run_dir / CPU_FILE, "a") as f:
            f.write(json.dumps(row) + "\n")
        partial.unlink()


def run_usage(run_dir: Path) -> dict[str, float]:
    """The CPU and wall seconds of every ``dapo train`` invocation of a run, summed."""
    path = run_dir / CPU_FILE
    rows = [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []
    return {k: sum(r[k] for r in rows) for k in ("cpu_s", "wall_s")}


def train_reasoning(
    run_dir: Path,
    seed: int,
    steps: int,
    test_freq: int,
    overrides: list[str],
    after: list[str] = (),
    resume: bool = False,
    log: Path | None = None,
) -> list[dict]:
    """The run's metrics rows: read from ``run_dir`` when it holds this run finished, otherwise
    run (a different run there is replaced; an unfinished one too, unless ``resume``, which
    continues it). ``log``: a file for the run's output and errors (appended); without one the
    output is dropped and errors go to this process's stderr."""
    args = train_args(seed, steps, test_freq, overrides, after)
    if not same_config(run_dir, args):
        if not (resume and recorded_config(run_dir, args)):
            if run_dir.is_symlink():
                run_dir.unlink()
            elif run_dir.exists():
                shutil.rmtree(run_dir)
        cmd = [sys.executable, "-m", "dapo.cli", "train", "--config-name", PRESET, *args]
        cmd.append(f"trainer.default_local_dir={run_dir}")
        run_dir.mkdir(parents=True, exist_ok=True)
        carry_partial(run_dir)
        partial = run_dir / PARTIAL_FILE
        if log is None:
            usage = run_measured(cmd, partial, stdout=subprocess.DEVNULL)
        else:
            with open(log, "a") as out:
                usage = run_measured(cmd, partial, stdout=out, stderr=subprocess.STDOUT)
        with open(run_dir / CPU_FILE, "a") as f:
            f.write(json.dumps(usage) + "\n")
        partial.unlink(missing_ok=True)
        if not (run_dir / "finished.json").exists():  # stopped by a signal: it exits 0, unfinished
            raise RuntimeError(f"{run_dir}: the run stopped before its last step; run again to continue it")
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
