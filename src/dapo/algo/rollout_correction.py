"""Off-policy correction between the sampler (rollout) and the trainer's policy (verl 0.9.1
`rollout_corr_helper`): truncated importance-sampling weights and mismatch metrics.

The sampler's own log-probs (`rollout_log_probs`) travel with every response. With
log_ratio = old_log_prob - rollout_log_prob (log pi_train / pi_rollout):

* rollout_is = "token":    w_t = exp(clamp(log_ratio_t, -20, 20))
* rollout_is = "sequence": w_t = exp(clamp(sum_t log_ratio_t m_t, -20, 20)) for every token
* truncation (TIS): w <- min(w, rollout_is_threshold) (float threshold);
  a "lower_upper" string threshold (IcePop) zeroes weights outside [lower, upper] instead;
* optional `rollout_is_batch_normalize`: divide by the batch mean weight (token mean, or
  mean of per-sequence weights).

Weights are zero on padding and detached; the policy loss multiplies its per-token loss by them
(`rollout_is_weights` argument). Config keys: `algorithm.rollout_correction.{rollout_is,
rollout_is_threshold, rollout_is_batch_normalize}`. Metric names are verl's under
`rollout_corr/` (rollout_is_mean, rollout_is_eff_sample_size, kl, k3_kl, training_ppl,
rollout_ppl, log_ppl_diff, ppl_ratio, chi2_token, chi2_seq, ...).
Rejection sampling (`rollout_rs`) is not implemented.
"""

from __future__ import annotations

import torch

from dapo.algo.utils import masked_mean, masked_sum

__all__ = [
    "SAFETY_BOUND",
    "parse_rollout_is_threshold",
    "compute_rollout_correction_weights",
    "compute_is_metrics",
    "compute_offpolicy_metrics",
    "compute_rollout_correction",
]

SAFETY_BOUND = 20.0


def parse_rollout_is_threshold(spec: str | float) -> tuple[float, float | None]:
    """(upper, lower or None) from a float (TIS) or a "lower_upper" string (IcePop)."""
    if isinstance(spec, bool):
        raise TypeError("rollout_is_threshold must be a float or a 'lower_upper' string, not a bool")
    lower: float | None = None
    if isinstance(spec, int | float):
        upper = float(spec)
    elif isinstance(spec, str):
        text = spec.strip()
        try:
            if "_" in text:
                lo, hi = text.split("_", 1)
                lower, upper = float(lo), float(hi)
            else:
                upper = float(text)
        except ValueError as exc:
            raise ValueError(f"Invalid rollout_is_threshold {spec!r}") from exc
    else:
        raise TypeError("rollout_is_threshold must be a float or a 'lower_upper' string")
    if upper <= 0:
        raise ValueError(f"rollout_is_threshold upper bound must be positive, got {upper}")
    if lower is not None and not 0 < lower <= upper:
        raise ValueError(f"rollout_is_threshold lower bound must be in (0, upper], got {lower}")
    return upper, lower


def compute_rollout_correction_weights(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: str = "token",
    rollout_is_threshold: str | float = 2.0,
    rollout_is_batch_normalize: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated IS weights [B, T] (detached, 0 on padding) and their metrics (unprefixed)."""
    if rollout_is not in ("token", "sequence"):
        raise ValueError(
            f"algorithm.rollout_correction.rollout_is must be 'token' or 'sequence', got {rollout_is!r}"
        )
    upper, lower = parse_rollout_is_threshold(rollout_is_threshold)
    if rollout_is == "token":
        log_ratio_for_metrics = log_ratio
        raw = torch.exp(torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND))
    else:
        log_ratio_for_metrics = masked_sum(log_ratio, response_mask, axis=-1).unsqueeze(-1)
        raw = torch.exp(torch.clamp(log_ratio_for_metrics, -SAFETY_BOUND, SAFETY_BOUND)).expand_as(log_ratio)
    raw = raw * response_mask

    if lower is None:
        weights = raw.clamp(max=upper)
    else:
        weights = torch.where((raw >= lower) & (raw <= upper), raw, torch.zeros_like(raw))

    metrics = compute_is_metrics(weights, raw, log_ratio_for_metrics, response_mask, rollout_is, upper, lower)
    if lower is not None:
        outside = (raw < lower) | (raw > upper)
        metrics["rollout_is_oob_ratio"] = masked_mean(outside.float(), response_mask).item()
    weights = weights.detach()

    if rollout_is_batch_normalize:
        if rollout_is == "token":
            mean_w = masked_mean(weights, response_mask)
        else:
            seq_w = masked_mean(weights, response_mask, axis=-1)
            seq_valid = (response_mask.sum(dim=-1) > 0).to(weights.dtype)
            mean_w = (seq_w * seq_valid).sum() / seq_valid.sum().clamp_min(1e-8)
        if mean_w > 1e-8:
            weights = weights / mean_w
            metrics["rollout_is_batch_norm_factor"] = mean_w.item()
        else:
            metrics["rollout_is_batch_norm_factor"] = 1.0
    return weights, metrics


def compute_is_metrics(
    rollout_is_weights: torch.Tensor,
    raw_rollout_is_weights: torch.Tensor,
    log_ratio_for_metrics: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: str,
    rollout_is_threshold: float,
    rollout_is_threshold_lower: float | None = None,
) -> dict[str, float]:
    """Statistics of the IS weights, named as verl names them (without the rollout_corr/ prefix)."""
    if not response_mask.any():
        raise ValueError("response_mask must contain at least one valid token")
    w, raw, m = rollout_is_weights, raw_rollout_is_weights, response_mask
    lower = 1.0 / rollout_is_threshold if rollout_is_threshold_lower is None else rollout_is_threshold_lower
    metrics: dict[str, float] = {}
    metrics["rollout_is_mean"] = masked_mean(w, m).item()
    if rollout_is == "sequence":
        lr = log_ratio_for_metrics
        log_upper = torch.log(torch.tensor(rollout_is_threshold, device=lr.device))
        log_lower = torch.log(torch.tensor(lower, device=lr.device))
        metrics["rollout_is_max"] = torch.exp(torch.clamp(lr.max(), max=SAFETY_BOUND)).item()
        metrics["rollout_is_min"] = torch.exp(lr.min()).item()
        metrics["rollout_is_ratio_fraction_high"] = (lr > log_upper).float().mean().item()
        metrics["rollout_is_ratio_fraction_low"] = (lr < log_lower).float().mean().item()
    else:
        metrics["rollout_is_ratio_fraction_high"] = masked_mean(
            (raw > rollout_is_threshold).float(), m
        ).item()
        metrics["rollout_is_ratio_fraction_low"] = masked_mean((raw < lower).float(), m).item()
        metrics["rollout_is_max"] = w.masked_fill(~m.bool(), float("-inf")).max().item()
        metrics["rollout_is_min"] = w.masked_fill(~m.bool(), float("inf")).min().item()

    clamped = w.clamp(min=0.0, max=rollout_is_threshold)
    mean_c = masked_mean(clamped, m)
    if m.sum() > 1:
        var = masked_mean(clamped.square(), m) - mean_c.square()
        metrics["rollout_is_std"] = torch.sqrt(var.clamp(min=0.0)).item()
    else:
        metrics["rollout_is_std"] = 0.0
    normalised = clamped / (mean_c + 1e-8)
    metrics["rollout_is_eff_sample_size"] = 1.0 / masked_mean(normalised.square(), m).item()

    if w.dim() > 1:
        seq_mean = masked_mean(w, m, axis=-1)
        metrics["rollout_is_seq_mean"] = seq_mean.mean().item()
        metrics["rollout_is_seq_std"] = seq_mean.std().item() if seq_mean.numel() > 1 else 0.0
        metrics["rollout_is_seq_max"] = seq_mean.max().item()
        metrics["rollout_is_seq_min"] = seq_mean.min().item()
        metrics["rollout_is_seq_max_deviation"] = (seq_mean - 1.0).abs().max().item()
        raw_seq_mean = masked_mean(raw, m, axis=-1)
        metrics["rollout_is_seq_fraction_high"] = (raw_seq_mean > rollout_is_threshold).float().mean().item()
        metrics["rollout_is_seq_fraction_low"] = (raw_seq_mean < lower).float().mean().item()
    return metrics


def compute_offpolicy_metrics(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor | None,
    response_mask: torch.Tensor,
) -> dict[str, float]:
    """Mismatch diagnostics (unprefixed): training_ppl / training_log_ppl always; with rollout
    log-probs also kl = E[log pi_rollout - log pi_train], k3_kl, rollout_ppl, rollout_log_ppl,
    log_ppl_diff (+ abs, max, min), ppl_ratio, chi2_token and chi2_seq.
    PPL values are batch means of per-sequence exp(-mean log-prob)."""
    if not response_mask.any():
        raise ValueError("response_mask must contain at least one valid token")
    m = response_mask
    metrics: dict[str, float] = {}
    mean_lp_train = masked_mean(old_log_prob, m, axis=-1)
    metrics["training_ppl"] = torch.exp(-mean_lp_train).mean().item()
    metrics["training_log_ppl"] = (-mean_lp_train).mean().item()
    if rollout_log_prob is None:
        return metrics

    metrics["kl"] = masked_mean(rollout_log_prob - old_log_prob, m).item()
    log_ratio = old_log_prob - rollout_log_prob
    metrics["k3_kl"] = masked_mean(torch.exp(log_ratio) - log_ratio - 1, m).item()
    mean_lp_rollout = masked_mean(rollout_log_prob, m, axis=-1)
    metrics["rollout_ppl"] = torch.exp(-mean_lp_rollout).mean().item()
    metrics["rollout_log_ppl"] = (-mean_lp_rollout).mean().item()
    diff = mean_lp_rollout - mean_lp_train
    metrics["log_ppl_diff"] = diff.mean().item()
    metrics["log_ppl_abs_diff"] = diff.abs().mean().item()
    metrics["log_ppl_diff_max"] = diff.max().item()
    metrics["log_ppl_diff_min"] = diff.min().item()
    metrics["ppl_ratio"] = torch.exp(diff).mean().item()
    rho = torch.exp(torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND))
    metrics["chi2_token"] = (masked_mean(rho.square(), m) - 1.0).item()
    seq_log_ratio = torch.clamp(masked_sum(log_ratio, m, axis=-1), -SAFETY_BOUND, SAFETY_BOUND)
    metrics["chi2_seq"] = (torch.exp(2.0 * seq_log_ratio).mean() - 1.0).item()
    return metrics


def compute_rollout_correction(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: str | None = None,
    rollout_is_threshold: str | float | None = 2.0,
    rollout_is_batch_normalize: bool = False,
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """(rollout_is_weights or None, metrics prefixed `rollout_corr/`).

    Weights are computed when `rollout_is` is "token" or "sequence" and a threshold is set; the
    mismatch metrics are computed always (they cost little and show the sampler/trainer gap).
    """
    if old_log_prob.shape != rollout_log_prob.shape or old_log_prob.shape != response_mask.shape:
        raise ValueError(
            f"shape mismatch: old_log_prob {tuple(old_log_prob.shape)}, rollout_log_prob "
            f"{tuple(rollout_log_prob.shape)}, response_mask {tuple(response_mask.shape)}"
        )
    if not response_mask.any():
        raise ValueError("response_mask must contain at least one valid token")
    metrics: dict[str, float] = {}
    weights = None
    if rollout_is is not None and rollout_is_threshold is not None:
        weights, is_metrics = compute_rollout_correction_weights(
            old_log_prob - rollout_log_prob,
            response_mask,
            rollout_is,
            rollout_is_threshold,
            rollout_is_batch_normalize,
        )
        metrics.update(is_metrics)
    metrics.update(compute_offpolicy_metrics(old_log_prob, rollout_log_prob, response_mask))
    return weights, {f"rollout_corr/{k}": float(v) for k, v in metrics.items()}
