"""Splitting a batch across data-parallel ranks (pure functions: no processes, no Ray).

* ``rank_partitions``: row indices per rank. With ``balance`` (``trainer.balance_batch``) an
  equal-size Karmarkar-Karp partition by verl's workload w(L) = 24576 L + L^2 over the row's
  prompt+response length (verl's ``_balance_batch``), each part ordered small-at-both-ends; otherwise
  contiguous equal chunks. The row count must divide by the number of ranks.
* ``pad_to_multiple``: zero-weight rows appended so the row count divides: each is a copy of a
  real row whose ``response_mask`` (and advantages) are zero, so it adds no token, no valid
  sequence and no gradient; ``is_pad`` marks them and results for them are dropped.
* ``trim_to_multiple``: the alternative, dropping whole groups (``uid``) from the end.
* ``minibatch_plan``: which rows form each mini-batch of each PPO epoch, with the same shuffle
  as the single-process actor, so an update on W ranks sees the same mini-batches as on one.
* ``balance_metrics``: verl's ``global_seqlen/*`` numbers before and after balancing.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from dapo.actor.seqlen_balancing import karmarkar_karp, workload
from dapo.batch import Batch

PAD_KEY = "is_pad"


def row_lengths(batch: Batch) -> list[int]:
    """Prompt + response tokens of each row (sum of the attention mask)."""
    return [int(x) for x in batch.tensors["attention_mask"].sum(-1).tolist()]


def balanced_partitions(lengths: Sequence[int], k: int) -> list[list[int]]:
    """k equal-size sets of row indices with near-equal workload (KK with equal_size), each
    arranged as verl does: sorted by (w, idx), then ``s[::2] + s[1::2][::-1]``."""
    w = [workload(int(x)) for x in lengths]
    parts = karmarkar_karp(w, k, equal_size=True)
    out = []
    for p in parts:
        s = sorted(p, key=lambda i: (w[i], i))
        out.append(s[::2] + s[1::2][::-1])
    # deterministic order of the parts themselves: by their smallest row index
    out.sort(key=min)
    return out


def rank_partitions(lengths: Sequence[int], k: int, balance: bool) -> list[list[int]]:
    n = len(lengths)
    if n % k:
        raise ValueError(f"{n} rows do not split evenly across {k} ranks (pad or trim the batch first)")
    if k == 1:
        return [list(range(n))]
    if balance:
        return balanced_partitions(lengths, k)
    m = n // k
    return [list(range(r * m, (r + 1) * m)) for r in range(k)]


def pad_to_multiple(batch: Batch, k: int) -> tuple[Batch, int]:
    """Append zero-weight rows until ``len(batch) % k == 0``; returns (batch, rows added).

    Pad rows repeat the shortest real rows (cheap forwards) with ``response_mask`` zero, so they
    count for no token and no valid sequence in the loss normalisers and carry no gradient."""
    n = len(batch)
    add = (-n) % k
    if PAD_KEY not in batch.non_tensors:
        batch = Batch(dict(batch.tensors), dict(batch.non_tensors), dict(batch.meta))
        batch.non_tensors[PAD_KEY] = np.zeros(n, dtype=object)
        batch.non_tensors[PAD_KEY][:] = False
    if add == 0:
        return batch, 0
    if n == 0:
        raise ValueError("cannot pad an empty batch")
    lengths = row_lengths(batch)
    donors = sorted(range(n), key=lambda i: (lengths[i], i))
    idx = [donors[j % n] for j in range(add)]
    pad = batch.select(idx)
    for key in ("response_mask", "advantages", "returns", "token_level_rewards", "token_level_scores"):
        if key in pad.tensors:
            pad.tensors[key] = torch.zeros_like(pad.tensors[key])
    if "rollout_is_weights" in pad.tensors:
        pad.tensors["rollout_is_weights"] = torch.zeros_like(pad.tensors["rollout_is_weights"])
    pad.non_tensors[PAD_KEY] = np.array([True] * add, dtype=object)
    if "uid" in pad.non_tensors:
        pad.non_tensors["uid"] = np.array([f"__pad__{j}" for j in range(add)], dtype=object)
    return Batch.concat([batch, pad]), add


def trim_to_multiple(batch: Batch, k: int, group_key: str = "uid") -> tuple[Batch, int]:
    """Drop the fewest whole groups (from the end) so ``len(batch) % k == 0``; returns
    (batch, groups dropped). Raises when no number of whole groups fits."""
    if len(batch) % k == 0:
        return batch, 0
    groups = [rows for _, rows in batch.group_slices(group_key)]
    total = len(batch)
    for drop in range(1, len(groups)):
        total -= len(groups[-drop])
        if total % k == 0:
            keep = np.concatenate(groups[:-drop])
            return batch.select(np.sort(keep)), drop
    raise ValueError(f"no set of whole groups of this batch has a row count divisible by {k}")


def make_divisible(batch: Batch, k: int, mode: str = "pad", log=print) -> Batch:
    """The batch with a row count divisible by ``k`` ranks: ``pad`` (zero-weight rows) or
    ``trim`` (drop whole groups). Logs what it did."""
    if k <= 1 or len(batch) % k == 0:
        return batch
    n = len(batch)
    if mode == "trim":
        out, dropped = trim_to_multiple(batch, k)
        log(
            f"distributed: dropped {dropped} whole group(s) ({n - len(out)} rows) so {n} rows split across {k} ranks"
        )
        return out
    if mode != "pad":
        raise ValueError(f"divisibility mode must be 'pad' or 'trim', got {mode!r}")
    out, added = pad_to_multiple(batch, k)
    log(f"distributed: added {added} zero-weight row(s) so {n} rows split across {k} ranks")
    return out


def minibatch_plan(
    n_rows: int, mini_batch_size: int, ppo_epochs: int, shuffle: bool, seed: int
) -> list[np.ndarray]:
    """Row indices of every mini-batch, epoch after epoch, exactly as the single-process actor
    forms them (one ``default_rng(seed)``, a permutation per epoch when ``shuffle``)."""
    rng = np.random.default_rng(seed)
    plan = []
    for _ in range(ppo_epochs):
        order = rng.permutation(n_rows) if shuffle else np.arange(n_rows)
        for m0 in range(0, n_rows, mini_batch_size):
            plan.append(order[m0 : m0 + mini_batch_size])
    return plan


def balance_metrics(lengths: Sequence[int], before: list[list[int]], after: list[list[int]]) -> dict:
    """verl's ``global_seqlen/*``: per-rank sums of L before (contiguous chunks) and after."""
    b = [sum(lengths[i] for i in p) for p in before]
    a = [sum(lengths[i] for i in p) for p in after]
    return {
        "global_seqlen/min": float(min(b)),
        "global_seqlen/max": float(max(b)),
        "global_seqlen/minmax_diff": float(max(b) - min(b)),
        "global_seqlen/balanced_min": float(min(a)),
        "global_seqlen/balanced_max": float(max(a)),
        "global_seqlen/mean": float(sum(lengths)) / len(before),
    }
