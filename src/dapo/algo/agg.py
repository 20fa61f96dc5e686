"""Loss aggregation: turn a per-token loss matrix into the scalar that is back-propagated.

`agg_loss` follows verl 0.9.1 (`core_algos.agg_loss`) value for value. Its normaliser can be a
*global* count, which is how micro-batching stays exact (verl issue #2776):

* the trainer computes, once per mini-batch (over all data-parallel ranks),
  `batch_num_tokens` = number of valid response tokens and
  `global_batch_size` = number of valid sequences (rows with at least one valid token);
* it calls `agg_loss(micro_loss, micro_mask, mode, dp_size, batch_num_tokens, global_batch_size)`
  for every micro-batch and simply *sums* (accumulates) the results, with no 1/grad_accum factor;
* the sum equals, in value and gradient, the loss of the whole mini-batch computed at once, for
  every mode. With data parallelism, each rank multiplies by `dp_size` and the usual gradient
  averaging over ranks divides it back out.

`global_batch_size` counts *valid* sequences. verl's engine path passes
`ppo_mini_batch_size * rollout.n` (all rows, including any fully masked one) while its local
fallback counts valid rows only, so the two disagree when a row is fully masked; counting
valid rows keeps the global and the one-shot values identical. `compute_global_batch_info`
computes both counts from a mini-batch's response mask.

`seq-mean-token-sum-norm` divides by `loss_scale_factor`, or by the padded width
`loss_mask.shape[-1]` when it is None. Micro-batches re-padded to different widths would then use
different divisors, so a trainer that trims padding per micro-batch must pass a constant
`loss_scale_factor` (verl's `actor.loss_scale_factor`, e.g. the configured response length).
"""

from __future__ import annotations

import torch

from dapo.algo.utils import masked_sum

__all__ = ["LOSS_AGG_MODES", "agg_loss", "compute_global_batch_info", "check_loss_agg_mode"]

LOSS_AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)


def check_loss_agg_mode(loss_agg_mode: str) -> None:
    """Raise ValueError naming the valid modes if `loss_agg_mode` is not one of them."""
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(
            f"Invalid loss_agg_mode: {loss_agg_mode!r}. Valid modes: {', '.join(LOSS_AGG_MODES)} "
            "(config key actor_rollout_ref.actor.loss_agg_mode)"
        )


def _count(local: torch.Tensor, given: int | float | torch.Tensor | None, what: str, dp_size: int):
    # A count of 0 means there is nothing to average: the numerator is 0 as well, and clamping
    # the count to >= 1 gives 0 instead of verl's NaN. For any count >= 1 nothing changes.
    if given is not None:
        return given.clamp(min=1) if isinstance(given, torch.Tensor) else max(given, 1)
    if dp_size > 1:
        raise ValueError(f"agg_loss: the global {what} is required when dp_size > 1")
    return local.clamp(min=1)


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    dp_size: int = 1,
    batch_num_tokens: int | float | torch.Tensor | None = None,
    global_batch_size: int | float | torch.Tensor | None = None,
    loss_scale_factor: int | float | None = None,
) -> torch.Tensor:
    """Aggregate `loss_mat` [B, T] over `loss_mask` [B, T] into a scalar.

    With m the mask, seq_i = sum_t L[i,t] m[i,t], n_i = sum_t m[i,t], valid rows n_i > 0:

    * token-mean:              sum_it L m / N_tok * dp_size   (N_tok = batch_num_tokens or sum m)
    * token-sum:               sum_it L m * dp_size
    * seq-mean-token-sum:      sum_valid seq_i / B * dp_size  (B = global_batch_size or #valid rows)
    * seq-mean-token-mean:     sum_valid (seq_i / (n_i + 1e-8)) / B * dp_size
    * seq-mean-token-sum-norm: [sum_valid seq_i / B * dp_size] / S  (S = loss_scale_factor or T)
    """
    check_loss_agg_mode(loss_agg_mode)
    if loss_agg_mode == "token-mean":
        n_tok = _count(loss_mask.sum(), batch_num_tokens, "batch_num_tokens", dp_size)
        return masked_sum(loss_mat, loss_mask) / n_tok * dp_size
    if loss_agg_mode == "token-sum":
        return masked_sum(loss_mat, loss_mask) * dp_size

    seq_sum = masked_sum(loss_mat, loss_mask, axis=-1)  # [B]
    seq_len = loss_mask.sum(dim=-1)
    seq_valid = (seq_len > 0).to(seq_sum.dtype)
    n_seq = _count(seq_valid.sum(), global_batch_size, "global_batch_size", dp_size)
    if loss_agg_mode == "seq-mean-token-mean":
        per_seq = seq_sum / (seq_len + 1e-8)
        return masked_sum(per_seq, seq_valid) / n_seq * dp_size
    loss = masked_sum(seq_sum, seq_valid) / n_seq * dp_size
    if loss_agg_mode == "seq-mean-token-sum-norm":
        loss = loss / (loss_scale_factor if loss_scale_factor is not None else loss_mask.shape[-1])
    return loss


def compute_global_batch_info(
    response_mask: torch.Tensor,
    dp_size: int = 1,
    loss_scale_factor: int | float | None = None,
) -> dict:
    """The `global_batch_info` dict for one mini-batch: pass the mask of the *whole* mini-batch.

    With several data-parallel ranks, sum `batch_num_tokens` and `global_batch_size` over ranks
    (all-reduce) before use. Keys match `agg_loss`'s keyword arguments.
    """
    return {
        "dp_size": dp_size,
        "batch_num_tokens": int(response_mask.sum().item()),
        "global_batch_size": int((response_mask.sum(dim=-1) > 0).sum().item()),
        "loss_scale_factor": loss_scale_factor,
    }
