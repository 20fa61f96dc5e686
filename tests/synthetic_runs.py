"""A synthetic run directory for the report tests and the report screenshot, without training.

The dynamic batcher runs for real on a fake rollout (no model): prompts have a difficulty, the
policy "improves" step by step and responses grow longer, so the figures show what a drifting
run looks like. Writes ``metrics.jsonl``, ``groups.jsonl``, ``viewer.json``, ``summary.json``,
verl-format rollout dumps ``rollout_data/<step>.jsonl`` and validation dumps
``validation_data/<step>.jsonl`` (docs/verl_compat.md, Dumps).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dapo.batch import Batch
from dapo.config.sampling import FilterGroupsConfig
from dapo.outputs.records import GroupRecorder
from dapo.sampling import DynamicBatcher
from dapo.sampling.fakes import FakeRollout, ListSource


def _question(i: int) -> tuple[str, int]:
    a, b = 7 + (i * 37) % 90, 3 + (i * 11) % 40
    return f"<|im_start|>user\nWhat is {a} + {b}? Put the answer in \\boxed{{}}.<|im_end|>", a + b


def write_synthetic_run(
    run_dir: str | Path,
    *,
    steps: int = 12,
    n: int = 8,
    train_batch_size: int = 8,
    gen_batch_size: int = 12,
    num_prompts: int = 64,
    max_response_length: int = 256,
    overlong_buffer_len: int = 64,
    test_freq: int = 4,
    seed: int = 0,
) -> Path:
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    rollout_dir, val_dir = run_dir / "rollout_data", run_dir / "validation_data"
    rollout_dir.mkdir(exist_ok=True)
    val_dir.mkdir(exist_ok=True)
    rng = np.random.default_rng(seed)
    R = max_response_length
    difficulty = rng.normal(0.0, 1.6, size=num_prompts)
    state = {"step": 0}

    def p_correct(i: int) -> float:
        return float(1 / (1 + np.exp(difficulty[i] + 1.0 - 0.15 * state["step"])))

    def acc_fn(row: dict, k: int, g: np.random.Generator):
        return (g.random(k) < p_correct(int(row["index"]))).astype(float).tolist()

    fake = FakeRollout(n, acc_fn, response_length=R, seed=seed)

    def generate(rows: list[dict]) -> Batch:
        b = fake(rows)
        mu = R * (0.3 + 0.025 * state["step"])
        lengths = np.clip(rng.normal(mu, 0.15 * R, size=len(b)), 1, R).astype(int)
        mask = torch.zeros(len(b), R)
        for j, ln in enumerate(lengths.tolist()):
            mask[j, :ln] = 1.0
        b.tensors["response_mask"] = mask
        b["truncated"] = np.asarray([bool(ln >= R) for ln in lengths.tolist()], dtype=object)
        return b

    rows = [
        {"index": i, "data_source": "synthetic_arith", "reward_model": {"ground_truth": str(_question(i)[1])}}
        for i in range(num_prompts)
    ]
    source = ListSource(rows, seed=seed)
    cfg = FilterGroupsConfig(
        enable=True, metric="acc", strategy="default", max_num_gen_batches=10, on_exhausted="train"
    )
    batcher = DynamicBatcher(cfg, train_batch_size, gen_batch_size, n, seed)
    recorder = GroupRecorder(
        run_dir,
        max_response_length=R,
        overlong_buffer_len=overlong_buffer_len,
        rollout_data_dir=str(rollout_dir),
        validation_data_dir=str(val_dir),
    )
    metrics_f = (run_dir / "metrics.jsonl").open("w", encoding="utf-8")

    def log(m: dict[str, Any], step: int) -> None:
        metrics_f.write(json.dumps({"step": step, **m}, sort_keys=True) + "\n")

    def validate(step: int) -> dict[str, float]:
        accs, dump = [], []
        for i in range(0, num_prompts, 2):
            q, ans = _question(i)
            ok = bool(rng.random() < p_correct(i))
            accs.append(float(ok))
            pred = str(ans if ok else ans + int(rng.integers(1, 9)))
            dump.append(_row(q, pred, str(ans), 1.0 if ok else -1.0, step, ok, rng, R // 2))
        _write_dump(val_dir / f"{step}.jsonl", dump)
        return {"val-core/synthetic_arith/acc/mean@1": float(np.mean(accs)), "val/acc": float(np.mean(accs))}

    before = validate(0)
    log({**before, "timing_s/testing": 0.8}, 0)
    last = before
    for step in range(1, steps + 1):
        state["step"] = step
        sampled = batcher.next_batch(source, generate)
        recorder.write(step, sampled)
        m = dict(sampled.metrics)
        b = sampled.batch
        assert b is not None
        lens = b.tensors["response_mask"].sum(-1)
        acc = np.asarray([float(a) for a in b["acc"]])
        rounds = m["train/num_gen_batches"]
        timing = {
            "gen": 1.6 * rounds + 0.2 * rng.random(),
            "reward": 0.15 * rounds,
            "old_log_prob": 0.5,
            "adv": 0.01,
            "update_actor": 1.9 + 0.1 * rng.random(),
        }
        timing["step"] = sum(timing.values()) + 0.1
        m.update({f"timing_s/{k}": v for k, v in timing.items()})
        m.update(
            {
                "critic/score/mean": float((2 * acc - 1).mean()),
                "train/acc": float(acc.mean()),
                "response_length/mean": float(lens.mean()),
                "response_length/max": float(lens.max()),
                "response_length/min": float(lens.min()),
                "response_length/clip_ratio": float((lens >= R).float().mean()),
                "perf/throughput": float(lens.sum()) / timing["step"],
            }
        )
        dump = []
        for j, idx in enumerate(b["index"]):
            q, ans = _question(int(idx))
            ok = bool(acc[j])
            pred = str(ans if ok else ans - 1 - j % 5)
            dump.append(_row(q, pred, str(ans), 1.0 if ok else -1.0, step, ok, rng, int(lens[j])))
        _write_dump(rollout_dir / f"{step}.jsonl", dump)
        if test_freq > 0 and (step % test_freq == 0 or step == steps):
            last = validate(step)
            m.update(last)
            m["timing_s/testing"] = 0.8
        log(m, step)
    metrics_f.close()
    (run_dir / "summary.json").write_text(
        json.dumps({"steps": steps, "val_acc_before": before["val/acc"], "val_acc_after": last["val/acc"]})
    )
    return run_dir


_WORDS = "first add the tens then the ones so the sum is carry one and check it again".split()


def _row(q: str, pred: str, gt: str, score: float, step: int, ok: bool, rng, length: int) -> dict[str, Any]:
    words = " ".join(rng.choice(_WORDS, size=max(1, length // 5)).tolist())
    return {
        "input": q,
        "output": f"<think>{words}</think> The answer is \\boxed{{{pred}}}.",
        "gts": gt,
        "score": score,
        "step": step,
        "acc": ok,
        "pred": pred,
    }


def _write_dump(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
