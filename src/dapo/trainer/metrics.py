"""Per-step data and timing metrics with verl's names (docs/verl_compat.md, Metrics)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from dapo.batch import Batch


def _stats(prefix: str, x: torch.Tensor) -> dict[str, float]:
    if x.numel() == 0:
        return {}
    x = x.float()
    return {
        f"{prefix}/mean": float(x.mean()),
        f"{prefix}/max": float(x.max()),
        f"{prefix}/min": float(x.min()),
    }


def compute_data_metrics(batch: Batch) -> dict[str, float]:
    t = batch.tensors
    mask = t["response_mask"].bool()
    resp_len = mask.sum(-1).float()
    # the prompt part of the attention mask (multi-turn tool tokens belong to the response)
    prompt_len = t["attention_mask"][:, : t["prompts"].shape[1]].sum(-1).float()
    not_aborted = resp_len > 0
    seq_score = t["token_level_scores"].sum(-1)
    seq_reward = t["token_level_rewards"].sum(-1)
    out: dict[str, float] = {}
    out.update(_stats("critic/score", seq_score[not_aborted]))
    out.update(_stats("critic/rewards", seq_reward[not_aborted]))
    if "advantages" in t:
        out.update(_stats("critic/advantages", t["advantages"][mask]))
        out.update(_stats("critic/returns", t["returns"][mask]))
    R = t["responses"].shape[1]
    out.update(_stats("response_length", resp_len))
    out["response_length/clip_ratio"] = float((resp_len >= R).float().mean())
    out["response/aborted_ratio"] = float((~not_aborted).float().mean())
    out.update(_stats("prompt_length", prompt_len))
    out["prompt_length/clip_ratio"] = float((prompt_len >= t["prompts"].shape[1]).float().mean())
    if "acc" in batch.non_tensors:
        out["train/acc"] = float(np.mean([float(a) for a in batch["acc"]]))
    if "num_turns" in batch.non_tensors:
        from dapo.rollout.multiturn import multiturn_metrics

        out.update(multiturn_metrics({k: list(batch[k]) for k in ("num_turns", "tool_call_counts")}))
    if "truncated" in batch.non_tensors:
        out["response/truncated_ratio"] = float(np.mean([bool(a) for a in batch["truncated"]]))
    return out


def compute_timing_metrics(batch: Batch, timing_raw: dict[str, float]) -> dict[str, Any]:
    """timing_s/*, timing_per_token_ms/* and perf/* (per-token figures use the trained batch)."""
    t = batch.tensors
    n_resp = float(t["response_mask"].sum())
    n_all = float(t["attention_mask"].sum())
    out: dict[str, Any] = {f"timing_s/{k}": v for k, v in timing_raw.items()}
    for k, v in timing_raw.items():
        if k == "gen":
            out["timing_per_token_ms/gen"] = v * 1000.0 / max(1.0, n_resp)
        elif k in ("ref", "values", "adv", "update_critic", "update_actor", "old_log_prob", "reward"):
            out[f"timing_per_token_ms/{k}"] = v * 1000.0 / max(1.0, n_all)
    step = timing_raw.get("step", 0.0)
    out["perf/total_num_tokens"] = n_all
    out["perf/time_per_step"] = step
    out["perf/throughput"] = n_all / step if step > 0 else 0.0
    return out
