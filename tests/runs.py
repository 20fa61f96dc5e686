"""Shared pieces of the end-to-end tests (and benchmarks/crash_suite.py): the reward (conftest's
``mod3_task`` fixture writes it), the small `dapo train` command line, reading a run's outputs,
and killing a run at a chosen moment.

Reading a run directory's outputs:

* :func:`metric_rows`: every row of a finished run's metrics.jsonl, in order;
* :func:`metrics_by_step`: a finished run's last row per step, without the volatile keys;
* :func:`live_rows`: the rows so far of a run that may still be writing;
* :func:`run_summary`: summary.json;
* :func:`jsonl_rows`: any other jsonl file of a run (dumps, groups.jsonl).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

# a deterministic function of the response text that a random tiny model passes about a third
# of the time, so groups have spread, some are filtered and surplus groups are carried over
MOD3_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    acc = sum(map(ord, solution_str)) % 3 == 0
    return {"score": 1.0 if acc else 0.0, "acc": acc}
"""


def write_tiny_random_model(out: Path, tokenizer=None) -> Path:
    """A randomly initialised tiny Qwen2 (seed 0) + char tokenizer saved as a Hugging Face directory."""
    import torch
    from transformers import Qwen2ForCausalLM

    from dapo.model.tiny import tiny_config
    from dapo.model.tokenizer import build_char_tokenizer

    tok = tokenizer or build_char_tokenizer()
    torch.manual_seed(0)
    cfg = tiny_config(
        len(tok),
        tok.pad_token_id,
        tok.eos_token_id,
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=128,
    )
    model = Qwen2ForCausalLM(cfg)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return Path(out)


def write_mod3_task(d: Path) -> tuple[Path, Path, Path]:
    """(train.parquet, test.parquet, reward.py): 64/8 built-in problems and the mod-3 reward."""
    from dapo.tasks.arithmetic import write_task

    train, test = write_task(Path(d) / "data", train_size=64, test_size=8)
    reward = Path(d) / "reward.py"
    reward.write_text(MOD3_REWARD)
    return train, test, reward


# metrics that measure wall time or memory, which no two runs share
VOLATILE = re.compile(r"^timing_|^perf/(?!total_num_tokens)|time|memory|throughput|mfu")


# 4 prompts x 4 samples a step, 2 validation samples per problem
SMALL_BATCH = (
    "data.train_batch_size=4",
    "data.gen_batch_size=8",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.val_kwargs.n=2",
)


def train_args(run_dir, model_dir, train, test, steps: int, *extra: str) -> list[str]:
    """`dapo train` of ``model_dir`` on the given parquet files, small batches, one torch thread."""
    return [
        "train",
        f"data.train_files={train}",
        f"data.val_files={test}",
        f"actor_rollout_ref.model.path={model_dir}",
        f"trainer.default_local_dir={run_dir}",
        f"trainer.total_training_steps={steps}",
        "trainer.torch_threads=1",
        *SMALL_BATCH,
        *extra,
    ]


def small_run_args(run_dir, model_dir, task, steps: int, *extra: str) -> list[str]:
    """``train_args`` on a ``mod3_task`` with dynamic sampling on, logging to jsonl."""
    train, test, reward = task
    return train_args(
        run_dir,
        model_dir,
        train,
        test,
        steps,
        "trainer.logger=[console,jsonl]",
        "trainer.val_before_train=false",
        "algorithm.filter_groups.enable=true",
        f"custom_reward_function.path={reward}",
        *extra,
    )


def tool_run_args(run_dir, model_dir, steps: int, *extra: str) -> list[str]:
    """`dapo train --config-name tools` of ``model_dir`` on the built-in tool task: 2 prompts x 2
    samples a step, no validation before training, dynamic sampling off, one torch thread."""
    from dapo.tasks.arithmetic_tools import ensure_tool_task

    train, test = ensure_tool_task()
    return [
        "train",
        "--config-name",
        "tools",
        f"actor_rollout_ref.model.path={model_dir}",
        f"data.train_files={train}",
        f"data.val_files={test}",
        "data.train_max_samples=16",
        "data.val_max_samples=4",
        f"trainer.default_local_dir={run_dir}",
        f"trainer.total_training_steps={steps}",
        "trainer.torch_threads=1",
        "trainer.val_before_train=false",
        "trainer.save_final_model=false",
        "algorithm.filter_groups.enable=false",
        "data.train_batch_size=2",
        "data.gen_batch_size=2",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        *extra,
    ]


def jsonl_rows(path: Path) -> list[dict]:
    """Every line of a finished jsonl file, parsed, in order (a line that is not whole JSON fails)."""
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()]


def metric_rows(run_dir: Path) -> list[dict]:
    """Every row of a finished run's metrics.jsonl, in order."""
    return jsonl_rows(Path(run_dir) / "metrics.jsonl")


def run_summary(run_dir: Path) -> dict:
    """A run's summary.json."""
    return json.loads((Path(run_dir) / "summary.json").read_text())


def live_rows(run_dir: Path) -> list[dict]:
    """The rows logged so far by a run that may still be writing (a partial last line is skipped)."""
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:  # a line being written
            pass
    return out


def metrics_by_step(run_dir: Path) -> dict[int, dict]:
    """A finished run's last row per step (a killed run may have logged a step it did not
    checkpoint), without the volatile keys."""
    rows = {}
    for row in metric_rows(run_dir):
        rows[row["step"]] = {k: v for k, v in row.items() if not VOLATILE.search(k)}
    return rows


def subprocess_env() -> dict[str, str]:
    """The environment for `python -m dapo.cli` in a child process: this checkout's src first."""
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    return env


def latest_checkpoint(run_dir: Path) -> int:
    """The step in latest_checkpointed_iteration.txt, 0 when there is none."""
    try:
        return int((Path(run_dir) / "latest_checkpointed_iteration.txt").read_text().strip())
    except (OSError, ValueError):
        return 0


def saving(run_dir: Path, pid: int, step: int | None = None) -> bool:
    """True while process ``pid`` is writing a checkpoint (of ``step``, when given): its hidden
    temporary directory exists."""
    pattern = f".global_step_{step if step is not None else '*'}.tmp-{pid}"
    return any(Path(run_dir).glob(pattern))


def row_past_checkpoint(run_dir: Path) -> bool:
    """True once a metrics row of a step after the latest checkpoint is on disk."""
    return max((r["step"] for r in live_rows(run_dir)), default=0) > latest_checkpoint(run_dir)


def kill_when(proc: subprocess.Popen, moment: Callable[[], bool], timeout: float = 300.0) -> bool:
    """SIGKILL ``proc`` at the first poll where ``moment()`` holds, checked again with the
    process frozen (SIGSTOP) so the kill lands while it still holds. False if the process
    exited first."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        if moment():
            proc.send_signal(signal.SIGSTOP)
            if moment():
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                return True
            proc.send_signal(signal.SIGCONT)
        time.sleep(0.001)
    if proc.poll() is None:
        proc.kill()
        proc.wait()
        raise TimeoutError(f"{proc.args} neither finished nor reached the kill moment in {timeout:.0f}s")
    return False


def assert_each_step_once(run_dir: Path, steps: int, name: str = "metrics.jsonl") -> None:
    """Every line of ``name`` is a whole row, and the rows are of steps 1..steps, once each."""
    got = [row["step"] for row in jsonl_rows(Path(run_dir) / name)]
    assert got == list(range(1, steps + 1)), f"{name} holds steps {got}"


def record_drift(trainer) -> list[tuple[int, int, float]]:
    """Spy on ``trainer``'s policy updates: per update, ``(global_step, the batch's least
    staleness, the largest gap between the recomputed old log-probs and the sampler's)``."""
    seen: list[tuple[int, int, float]] = []
    update = trainer.actor.update_policy

    def spy(batch):
        m = batch.tensors["response_mask"].bool()
        drift = (batch.tensors["old_log_probs"] - batch.tensors["rollout_log_probs"])[m].abs().max()
        seen.append((trainer.global_step, min(batch.non_tensors["staleness"].tolist()), float(drift)))
        return update(batch)

    trainer.actor.update_policy = spy
    return seen
