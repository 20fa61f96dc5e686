"""Policy-gradient losses (verl 0.9.1 `core_algos`), and their registry.

Every loss has verl's signature

    fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
       config=None, rollout_is_weights=None) -> (pg_loss, metrics)

with [B, T] tensors, a scalar `pg_loss` and `metrics` a dict of python floats named as verl
names them (`actor/pg_clipfrac`, `actor/ppo_kl`, `actor/pg_clipfrac_lower`; each mode returns
the keys verl's returns). `config` is `actor_rollout_ref.actor` (the schema's `ActorConfig`, as
verl passes its ActorConfig: the loss-mode keys nested under `policy_loss`), a dict, or any object
with the same attribute names; a key it lacks takes the schema's default. Its
`global_batch_info` dict (the trainer wraps the actor config in a `MiniBatchLossConfig` that adds
it) is passed on to `agg_loss` (see dapo.algo.agg for the global-count convention). `rollout_is_weights` [B, T]
(detached truncated importance weights, see dapo.algo.rollout_correction) multiply the
per-token loss before aggregation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from dapo.algo.agg import agg_loss
from dapo.algo.utils import cfg_get, masked_mean
from dapo.config.schema import ActorConfig as _A
from dapo.config.schema import PolicyLossConfig as _PL

# the config schema holds every default once
DEFAULT_LOSS_AGG_MODE = _A.loss_agg_mode

__all__ = [
    "MiniBatchLossConfig",
    "POLICY_LOSS_REGISTRY",
    "register_policy_loss",
    "get_policy_loss_fn",
    "compute_policy_loss_vanilla",
    "compute_policy_loss_gspo",
    "compute_policy_loss_geo_mean",
    "compute_policy_loss_cispo",
    "compute_policy_loss_clip_cov",
    "compute_policy_loss_kl_cov",
]


@dataclass(frozen=True)
class MiniBatchLossConfig:
    """``actor_rollout_ref.actor`` as one mini-batch's loss reads it: every key read through from
    the actor config, plus that mini-batch's ``global_batch_info``. verl writes the counts onto
    its actor config; the run config here is never written, so they travel beside it."""

    actor: Any
    global_batch_info: dict = field(default_factory=dict)

    def __getattr__(self, key: str) -> Any:
        if key == "actor":  # not set yet (copy, unpickle): no recursion
            raise AttributeError(key)
        return getattr(self.actor, key)

    def get(self, key: str, default: Any = None) -> Any:
        """DictConfig-style access, for custom losses written against verl's config."""
        return getattr(self, key, default)


POLICY_LOSS_REGISTRY: dict[str, Callable[..., tuple[torch.Tensor, dict[str, float]]]] = {}


def register_policy_loss(name: str):
    """Decorator: register a policy loss under `name` (a later registration replaces it, as in verl)."""

    def decorator(fn):
        POLICY_LOSS_REGISTRY[name] = fn
        return fn

    return decorator


def get_policy_loss_fn(name: str):
    """The loss registered under `name`; ValueError naming the known ones otherwise."""
    if name not in POLICY_LOSS_REGISTRY:
        raise ValueError(
            f"Unsupported loss mode {name!r} (actor_rollout_ref.actor.policy_loss.loss_mode). "
            f"Supported: {', '.join(sorted(POLICY_LOSS_REGISTRY))}"
        )
    return POLICY_LOSS_REGISTRY[name]


# --------------------------------------------------------------------------------------------
# config access
# --------------------------------------------------------------------------------------------


def _config(config: Any) -> Any:
    return _A() if config is None else config


def _clip_range(config: Any) -> tuple[float, float]:
    """(eps_low, eps_high): clip_ratio_low / clip_ratio_high (the schema's default when absent)."""
    out = []
    for key in ("clip_ratio_low", "clip_ratio_high"):
        value = (
            config.get(key, getattr(_A, key))
            if isinstance(config, Mapping)
            else getattr(config, key, getattr(_A, key))
        )
        if value is None:
            raise ValueError(
                f"{key} is null: the run config fills it from clip_ratio (dapo.config.resolve); pass a number"
            )
        out.append(float(value))
    return out[0], out[1]


def _loss_mode_param(config: Any, key: str, default: float) -> float:
    """A loss-mode key, read from `config.policy_loss` (verl's nesting) or from `config` itself."""
    nested = cfg_get(config, "policy_loss", None)
    value = cfg_get(nested, key, None) if nested is not None else None
    return value if value is not None else cfg_get(config, key, default)


def _global_batch_info(config: Any) -> dict:
    info = cfg_get(config, "global_batch_info", None)
    return dict(info) if info else {}


def _agg(loss_mat, mask, mode, config, rollout_is_weights=None):
    """agg_loss of the per-token losses, each weighted by its rollout IS weight when given."""
    if rollout_is_weights is not None:
        loss_mat = loss_mat * rollout_is_weights
    return agg_loss(loss_mat=loss_mat, loss_mask=mask, loss_agg_mode=mode, **_global_batch_info(config))


def _float(x: torch.Tensor | float) -> float:
    return float(x.detach().item()) if isinstance(x, torch.Tensor) else float(x)


# --------------------------------------------------------------------------------------------
# losses
# --------------------------------------------------------------------------------------------


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = DEFAULT_LOSS_AGG_MODE,
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clip with decoupled ranges (DAPO Clip-Higher) and dual clip for A < 0.

    d = clamp(log_prob - old_log_prob, -20, 20), r = exp(d)
    L_clip = max(-A r, -A clamp(r, 1 - eps_low, 1 + eps_high))
    L = min(L_clip, -A c) if A < 0 else L_clip          (c = clip_ratio_c > 1)
    metrics: pg_clipfrac = mean[-A clip(r) > -A r], ppo_kl = mean(-d),
             pg_clipfrac_lower = mean[L_clip > -A c and A < 0]   (means over masked tokens)
    """
    config = _config(config)
    eps_low, eps_high = _clip_range(config)
    c = cfg_get(config, "clip_ratio_c", _A.clip_ratio_c)
    if not c > 1.0:
        raise ValueError(f"clip_ratio_c (dual-clip constant) must be > 1.0, got {c}")

    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    ppo_kl = masked_mean(-log_ratio, response_mask)

    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    loss_ppo = torch.maximum(loss_unclipped, loss_clipped)
    pg_clipfrac = masked_mean((loss_clipped > loss_unclipped).float(), response_mask)

    loss_dual = -advantages * c
    negative = advantages < 0
    pg_clipfrac_lower = masked_mean(((loss_ppo > loss_dual) & negative).float(), response_mask)
    pg_losses = torch.where(negative, torch.minimum(loss_ppo, loss_dual), loss_ppo)

    pg_loss = _agg(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, {
        "actor/pg_clipfrac": _float(pg_clipfrac),
        "actor/ppo_kl": _float(ppo_kl),
        "actor/pg_clipfrac_lower": _float(pg_clipfrac_lower),
    }


@register_policy_loss("gspo")
def compute_policy_loss_gspo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO (arXiv 2507.18071): sequence-level ratio s_i = exp(mean_t (log_prob - old_log_prob)).

    Per token the ratio is s_i,t = sg[s_i] * pi / sg[pi] (value s_i, gradient of log pi_t),
    log-clamped at 10; then the clipped surrogate max(-A s, -A clamp(s, 1-eps_low, 1+eps_high)).
    """
    config = _config(config)
    eps_low, eps_high = _clip_range(config)

    log_ratio = log_prob - old_log_prob
    seq_len = response_mask.sum(dim=-1).clamp(min=1)
    seq_log_ratio = (log_ratio * response_mask).sum(dim=-1) / seq_len
    log_s = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    s = torch.exp(torch.clamp(log_s, max=10.0))

    loss_unclipped = -advantages * s
    loss_clipped = -advantages * torch.clamp(s, 1 - eps_low, 1 + eps_high)
    pg_losses = torch.maximum(loss_unclipped, loss_clipped)
    pg_loss = _agg(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)

    pg_clipfrac = masked_mean((loss_clipped > loss_unclipped).float(), response_mask)
    ppo_kl = masked_mean(-log_ratio, response_mask)
    return pg_loss, {
        "actor/pg_clipfrac": _float(pg_clipfrac),
        "actor/ppo_kl": _float(ppo_kl),
        "actor/pg_clipfrac_lower": 0.0,
    }


@register_policy_loss("geo_mean")
def compute_policy_loss_geo_mean(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = DEFAULT_LOSS_AGG_MODE,
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GMPO (arXiv 2507.20673): geometric mean of token ratios, clipped per token in log space.

    d = log_prob - old_log_prob, d_c = clamp(d, -eps_low, eps_high), sgn = sign(A);
    d* = sgn * min(sgn d, sgn d_c);  ratio_i = exp(sum_t d* m / (n_i + 1e-8));
    A_i = sum_t A m / (n_i + 1e-8);  loss_i = -A_i ratio_i.
    `loss_agg_mode` is not used (the loss is per sequence): pg_loss = sum_i loss_i / N, with N the
    `global_batch_info` global_batch_size (times dp_size) when given, else the number of rows
    (verl's torch.mean). verl always uses the local row mean; see docs/algorithms.md.
    GMPO's recipe uses clip_ratio_low = clip_ratio_high = 0.4 (log-space range).
    """
    config = _config(config)
    eps_low, eps_high = _clip_range(config)

    log_ratio = log_prob - old_log_prob
    ppo_kl = masked_mean(-log_ratio, response_mask)
    sgn = torch.sign(advantages)
    log_ratio_c = torch.clamp(log_ratio, -eps_low, eps_high)
    log_ratio_min = sgn * torch.minimum(sgn * log_ratio, sgn * log_ratio_c)

    n = response_mask.sum(dim=-1)
    ratio = torch.exp((log_ratio_min * response_mask).sum(dim=-1) / (n + 1e-8))
    seq_adv = (advantages * response_mask).sum(dim=-1) / (n + 1e-8)
    pg_losses = -seq_adv * ratio
    if rollout_is_weights is not None:
        seq_w = torch.exp((torch.log(rollout_is_weights + 1e-10) * response_mask).sum(dim=-1) / (n + 1e-8))
        pg_losses = pg_losses * seq_w

    info = _global_batch_info(config)
    if info.get("global_batch_size") is not None:
        pg_loss = pg_losses.sum() / info["global_batch_size"] * info.get("dp_size", 1)
    else:
        pg_loss = pg_losses.mean()

    clipped = log_ratio != log_ratio_c
    pg_clipfrac = masked_mean((clipped & (advantages > 0)).float(), response_mask)
    pg_clipfrac_lower = masked_mean((clipped & (advantages < 0)).float(), response_mask)
    return pg_loss, {
        "actor/pg_clipfrac": _float(pg_clipfrac),
        "actor/ppo_kl": _float(ppo_kl),
        "actor/pg_clipfrac_lower": _float(pg_clipfrac_lower),
    }


@register_policy_loss("cispo")
def compute_policy_loss_cispo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = DEFAULT_LOSS_AGG_MODE,
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO (arXiv 2506.13585): loss = -sg[clamp(r, 1-eps_low, 1+eps_high)] * A * log_prob,
    r = exp(clamp(log_prob - old_log_prob, -20, 20)). Every token keeps a gradient."""
    config = _config(config)
    eps_low, eps_high = _clip_range(config)

    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    ppo_kl = masked_mean(-log_ratio, response_mask)
    clipped_ratio = torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    pg_losses = -clipped_ratio.detach() * advantages * log_prob
    pg_clipfrac = masked_mean((ratio != clipped_ratio).float(), response_mask)

    pg_loss = _agg(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, {
        "actor/pg_clipfrac": _float(pg_clipfrac),
        "actor/ppo_kl": _float(ppo_kl),
        "actor/pg_clipfrac_lower": 0.0,
    }


@register_policy_loss("clip_cov")
def compute_policy_loss_clip_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = DEFAULT_LOSS_AGG_MODE,
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clip-Cov (arXiv 2505.22617): PPO clip loss, plus the gradient of a few high-covariance
    tokens is cut.

    cov_t = (A_t - mean(A)) * (log_prob_t - mean(log_prob)) over masked tokens. Among masked
    tokens not already clipped by PPO with clip_cov_lb < cov_t < clip_cov_ub, pick at random
    max(1, int(clip_cov_ratio * n_tokens)) and zero their loss. (No ratio clamp, as in verl.)
    pg_clipfrac is the fraction of zeroed tokens. The draw uses torch's global RNG.
    """
    config = _config(config)
    eps_low, eps_high = _clip_range(config)
    ratio_sel = _loss_mode_param(config, "clip_cov_ratio", _PL.clip_cov_ratio)
    cov_lb = _loss_mode_param(config, "clip_cov_lb", _PL.clip_cov_lb)
    cov_ub = _loss_mode_param(config, "clip_cov_ub", _PL.clip_cov_ub)
    if not ratio_sel > 0:
        raise ValueError(f"policy_loss.clip_cov_ratio must be > 0, got {ratio_sel}")

    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    ppo_kl = masked_mean(-log_ratio, response_mask)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1 - eps_low, 1 + eps_high)

    valid = response_mask > 0
    with torch.no_grad():
        clipped_by_ppo = (loss_clipped > loss_unclipped) & valid
        cov = (advantages - masked_mean(advantages, response_mask)) * (
            log_prob - masked_mean(log_prob, response_mask)
        )
        cov = cov.masked_fill(~valid | clipped_by_ppo, float("-inf"))
        n_select = max(int(ratio_sel * response_mask.sum().item()), 1)
        candidates = torch.nonzero((cov < cov_ub) & (cov > cov_lb) & valid)
        keep = torch.ones_like(advantages)
        if len(candidates) > 0:
            chosen = candidates[torch.randperm(len(candidates))[: min(n_select, len(candidates))]]
            keep[chosen[:, 0], chosen[:, 1]] = 0
    pg_clipfrac = masked_mean((keep == 0).float(), response_mask)

    pg_losses = torch.maximum(loss_unclipped, loss_clipped) * keep
    pg_loss = _agg(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, {"actor/pg_clipfrac": _float(pg_clipfrac), "actor/ppo_kl": _float(ppo_kl)}


@register_policy_loss("kl_cov")
def compute_policy_loss_kl_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = DEFAULT_LOSS_AGG_MODE,
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL-Cov (arXiv 2505.22617): unclipped policy gradient -A r, plus a penalty
    ppo_kl_coef * |log_prob - old_log_prob| on the max(1, int(kl_cov_ratio * n_tokens)) masked
    tokens with the largest covariance (A_t - mean A)(log_prob_t - mean log_prob).
    The metric actor/ppo_kl is the masked mean of |log_prob - old_log_prob| here (verl's choice).
    """
    config = _config(config)
    ratio_sel = _loss_mode_param(config, "kl_cov_ratio", _PL.kl_cov_ratio)
    kl_coef = _loss_mode_param(config, "ppo_kl_coef", _PL.ppo_kl_coef)
    if not ratio_sel > 0:
        raise ValueError(f"policy_loss.kl_cov_ratio must be > 0, got {ratio_sel}")

    log_ratio = log_prob - old_log_prob
    abs_kl = log_ratio.abs()
    ratio = torch.exp(log_ratio)
    ppo_kl_abs = masked_mean(abs_kl, response_mask)
    loss_pg = -advantages * ratio
    loss_pg_kl = loss_pg + kl_coef * abs_kl

    valid = response_mask > 0
    with torch.no_grad():
        flat_valid = torch.nonzero(valid.reshape(-1), as_tuple=True)[0]
        penalised = torch.zeros(valid.numel(), dtype=torch.bool, device=valid.device)
        if flat_valid.numel() > 0:
            adv_v = advantages.detach().reshape(-1)[flat_valid].cpu()
            logp_v = log_prob.detach().reshape(-1)[flat_valid].cpu()
            cov = (adv_v - adv_v.mean()) * (logp_v - logp_v.mean())
            k = max(1, int(cov.numel() * ratio_sel))
            top = torch.topk(cov, k, largest=True).indices.to(flat_valid.device)
            penalised[flat_valid[top]] = True
        penalised = penalised.reshape(valid.shape)
    pg_losses = torch.where(penalised, loss_pg_kl, loss_pg)

    pg_loss = _agg(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, {"actor/ppo_kl": _float(ppo_kl_abs)}
