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

Rejection sampling (`rollout_rs`, `rollout_rs_threshold`) masks tokens or whole sequences whose
divergence between the two policies leaves a hard trust region; see
`compute_rollout_rejection_mask`.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from dapo.algo.utils import masked_mean, masked_sum

__all__ = [
    "SAFETY_BOUND",
    "parse_rollout_is_threshold",
    "compute_rollout_correction_weights",
    "compute_is_metrics",
    "compute_offpolicy_metrics",
    "compute_rollout_correction",
    "apply_rollout_correction",
    "ROLLOUT_RS_OPTIONS",
    "compute_rollout_rejection_mask",
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


ROLLOUT_RS_OPTIONS: tuple[str, ...] = (
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
)


def _parse_rs_thresholds(
    options: list[str], spec: str | float | None
) -> dict[str, tuple[float | None, float]]:
    """{option: (lower or None, upper)}: one threshold shared by all options, or one per option
    (comma separated). k1 options take "lower_upper" (a single value u means 1/u_u)."""
    if spec is None:
        raise ValueError(
            "algorithm.rollout_correction.rollout_rs_threshold is required when rollout_rs is set"
        )
    if isinstance(spec, bool) or not isinstance(spec, int | float | str):
        raise TypeError("rollout_rs_threshold must be a number or a comma-separated string")
    parts = (
        [str(spec)] if isinstance(spec, int | float) else [x.strip() for x in spec.split(",") if x.strip()]
    )
    if len(parts) not in (1, len(options)):
        raise ValueError(
            f"rollout_rs_threshold: give one threshold or {len(options)} (one per rollout_rs option)"
        )
    parts = parts * len(options) if len(parts) == 1 else parts
    out: dict[str, tuple[float | None, float]] = {}
    for option, part in zip(options, parts):
        try:
            if option.endswith("k1"):
                lo_s, hi_s = part.split("_", 1) if "_" in part else (None, part)
                upper = float(hi_s)
                lower = float(lo_s) if lo_s is not None else 1.0 / upper
                if lower <= 0 or upper <= 0 or lower > upper:
                    raise ValueError(
                        f"rollout_rs_threshold for {option} needs 0 < lower <= upper, got {part!r}"
                    )
                out[option] = (lower, upper)
            else:
                if "_" in part:
                    raise ValueError(
                        f"rollout_rs_threshold for {option} takes a single upper bound, got {part!r}"
                    )
                upper = float(part)
                if upper <= 0:
                    raise ValueError(f"rollout_rs_threshold for {option} must be positive, got {part!r}")
                out[option] = (None, upper)
        except ValueError as exc:
            if "rollout_rs_threshold" in str(exc):
                raise
            raise ValueError(f"Invalid rollout_rs_threshold {part!r} for option {option}") from exc
    return out


def _rs_option_metrics(name, stat, mask, seq_valid, level, seq_values, upper, lower, use_lower):
    """Per-option statistics, named rollout_rs_<option>_* as in verl."""
    p = f"rollout_rs_{name}"
    mask_bool = mask.bool()
    if seq_values is None:
        seq_values = masked_mean(stat, mask, axis=-1)
    seq_v = seq_values[seq_valid]
    m: dict[str, float] = {f"{p}_mean": masked_mean(stat, mask).item()}
    if level == "sequence" and seq_v.numel() > 0:
        m[f"{p}_max"], m[f"{p}_min"] = seq_v.max().item(), seq_v.min().item()
        m[f"{p}_fraction_high"] = (seq_v > upper).float().mean().item()
        m[f"{p}_fraction_low"] = (seq_v < lower).float().mean().item() if use_lower else 0.0
    else:
        m[f"{p}_max"] = stat.masked_fill(~mask_bool, float("-inf")).max().item()
        m[f"{p}_min"] = stat.masked_fill(~mask_bool, float("inf")).min().item()
        m[f"{p}_fraction_high"] = masked_mean((stat > upper).float(), mask).item()
        m[f"{p}_fraction_low"] = masked_mean((stat < lower).float(), mask).item() if use_lower else 0.0
    if mask.sum() > 1:
        clamped = stat.clamp(min=lower if use_lower else 0.0, max=upper)
        mean_c = masked_mean(clamped, mask)
        m[f"{p}_std"] = torch.sqrt(
            (masked_mean(clamped.square(), mask) - mean_c.square()).clamp(min=0.0)
        ).item()
    else:
        m[f"{p}_std"] = 0.0
    if seq_v.numel() > 0:
        m[f"{p}_seq_mean"] = seq_v.mean().item()
        m[f"{p}_seq_std"] = seq_v.std().item() if seq_v.numel() > 1 else 0.0
        m[f"{p}_seq_max"], m[f"{p}_seq_min"] = seq_v.max().item(), seq_v.min().item()
        m[f"{p}_seq_max_deviation"] = seq_v.abs().max().item()
        m[f"{p}_seq_fraction_high"] = (seq_v > upper).float().mean().item()
        if use_lower:
            m[f"{p}_seq_fraction_low"] = (seq_v < lower).float().mean().item()
    else:
        for key in ("seq_mean", "seq_std", "seq_max", "seq_min", "seq_max_deviation", "seq_fraction_high"):
            m[f"{p}_{key}"] = 0.0
        m[f"{p}_seq_fraction_low"] = 0.0
    return m


def compute_rollout_rejection_mask(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_rs: str = "token_k1",
    rollout_rs_threshold: str | float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Hard trust region: (response_mask with rejected tokens set to 0, metrics unprefixed).

    With x = clamp(log_ratio, -20, 20): k1 = -x, k2 = x^2/2, k3 = e^x - 1 - x per token.
    `rollout_rs` is a comma-separated list; a token survives only if every option keeps it.
    token_k*: per token; seq_sum_k* / seq_mean_k* / seq_max_k*: the sum / mean / max over the
    row's tokens, and the whole row is kept or rejected. k2/k3 keep stat <= upper; k1 keeps
    log(lower) <= stat <= log(upper).
    """
    if not isinstance(rollout_rs, str) or not rollout_rs.strip():
        raise ValueError("rollout_rs must be a non-empty string (comma-separated options)")
    options: list[str] = []
    for opt in (o.strip() for o in rollout_rs.split(",")):
        if not opt:
            continue
        if opt not in ROLLOUT_RS_OPTIONS:
            raise ValueError(f"Invalid rollout_rs option {opt!r}. Valid: {', '.join(ROLLOUT_RS_OPTIONS)}")
        if opt not in options:
            options.append(opt)
    thresholds = _parse_rs_thresholds(options, rollout_rs_threshold)
    if log_ratio.shape[0] == 0:
        return response_mask, {}

    x = torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND)
    token_stats = {"k1": -x, "k2": 0.5 * x**2, "k3": torch.exp(x) - 1.0 - x}
    mask_bool = response_mask.bool()
    seq_valid = response_mask.sum(dim=-1) > 0
    combined = torch.ones_like(response_mask, dtype=log_ratio.dtype)
    metrics: dict[str, float] = {}

    for opt in options:
        lower, upper = thresholds[opt]
        k1 = opt.endswith("k1")
        lo_cut, hi_cut = (math.log(lower), math.log(upper)) if k1 else (0.0, upper)
        tok = token_stats[opt[-2:]]
        if opt.startswith("token"):
            level, seq_stat, stat = "token", None, tok
            keep = (tok >= lo_cut) & (tok <= hi_cut) if k1 else tok <= hi_cut
        else:
            level = "sequence"
            if opt.startswith("seq_sum"):
                seq_stat = masked_sum(tok, response_mask, axis=-1)
            elif opt.startswith("seq_mean"):
                seq_stat = masked_mean(tok, response_mask, axis=-1)
            else:
                seq_stat = tok.masked_fill(~mask_bool, float("-inf")).max(dim=-1).values
                seq_stat = torch.where(torch.isinf(seq_stat), torch.zeros_like(seq_stat), seq_stat)
            seq_keep = (seq_stat >= lo_cut) & (seq_stat <= hi_cut) if k1 else seq_stat <= hi_cut
            keep = seq_keep.unsqueeze(-1).expand_as(mask_bool)
            stat = seq_stat.unsqueeze(-1).expand_as(tok)
        metrics.update(
            _rs_option_metrics(opt, stat, response_mask, seq_valid, level, seq_stat, hi_cut, lo_cut, k1)
        )
        keep_f = keep.to(log_ratio.dtype)
        combined = combined * keep_f
        seq_kept = ~((~keep) & mask_bool).any(dim=-1)
        metrics[f"rollout_rs_{opt}_masked_fraction"] = masked_mean(1 - keep_f, response_mask).item()
        n_valid = seq_valid.float().sum()
        metrics[f"rollout_rs_{opt}_seq_masked_fraction"] = (
            (((~seq_kept).float() * seq_valid.float()).sum() / n_valid).item() if n_valid > 0 else 0.0
        )

    metrics["rollout_rs_masked_fraction"] = masked_mean(1 - combined, response_mask).item()
    kept = (combined > 0.5) & mask_bool
    metrics["rollout_rs_seq_masked_fraction"] = ((~kept) & mask_bool).any(dim=-1).float().mean().item()
    return (response_mask * combined).to(response_mask.dtype), metrics


def compute_rollout_correction(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: str | None = None,
    rollout_is_threshold: str | float | None = 2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: str | None = None,
    rollout_rs_threshold: str | float | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """(rollout_is_weights or None, response_mask after rejection, metrics prefixed `rollout_corr/`).

    Weights are computed when `rollout_is` is "token" or "sequence" and a threshold is set;
    rejection when `rollout_rs` is set (the returned mask is then the one to train with, as verl
    replaces the batch's response_mask); the mismatch metrics are computed always (they cost
    little and show the sampler/trainer gap), on the original mask.
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
    new_mask = response_mask.clone()
    if rollout_rs is not None:
        new_mask, rs_metrics = compute_rollout_rejection_mask(
            old_log_prob - rollout_log_prob, response_mask, rollout_rs, rollout_rs_threshold
        )
        metrics.update(rs_metrics)
    metrics.update(compute_offpolicy_metrics(old_log_prob, rollout_log_prob, response_mask))
    return weights, new_mask, {f"rollout_corr/{k}": float(v) for k, v in metrics.items()}


def apply_rollout_correction(tensors: dict[str, torch.Tensor], rc: Any) -> dict[str, float]:
    """``algorithm.rollout_correction`` on a batch's tensors, in place: ``rollout_is_weights``
    (when computed) and the ``response_mask`` after rejection. Nothing happens (and no metrics)
    unless ``rollout_is`` or ``rollout_rs`` is set and the batch has the sampler's log-probs."""
    if not (rc.rollout_is or rc.rollout_rs) or "rollout_log_probs" not in tensors:
        return {}
    weights, mask, metrics = compute_rollout_correction(
        tensors["old_log_probs"],
        tensors["rollout_log_probs"],
        tensors["response_mask"].float(),
        rollout_is=rc.rollout_is,
        rollout_is_threshold=rc.rollout_is_threshold,
        rollout_is_batch_normalize=rc.rollout_is_batch_normalize,
        rollout_rs=rc.rollout_rs,
        rollout_rs_threshold=rc.rollout_rs_threshold,
    )
    if weights is not None:
        tensors["rollout_is_weights"] = weights
    tensors["response_mask"] = mask.to(tensors["response_mask"].dtype)
    return metrics
