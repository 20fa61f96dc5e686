"""Masked reductions and small helpers shared by the algorithm functions.

Conventions (verl's): a mask is 1 on tokens that count and 0 elsewhere; it may be bool, int or
float. Values outside the mask never leak into a result, not even NaN or inf.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["masked_sum", "masked_mean", "masked_var", "masked_whiten", "cfg_get"]


def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """sum(values * mask); positions with mask == 0 contribute exactly 0 (NaN there is dropped)."""
    kept = torch.where(mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device))
    weighted = kept * mask
    return weighted.sum() if axis is None else weighted.sum(dim=axis)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """masked_sum / (sum(mask) + 1e-8): verl's convention, so an empty mask gives 0, not NaN."""
    count = mask.sum() if axis is None else mask.sum(dim=axis)
    return masked_sum(values, mask, axis) / (count + 1e-8)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance over the masked elements; unbiased (Bessel) by default, like verl.

    Raises ValueError when the unbiased variance is undefined (fewer than two masked elements).
    """
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        n = mask.sum()
        if n == 0:
            raise ValueError("masked_var: the mask selects no element")
        if n == 1:
            raise ValueError("masked_var: the mask selects one element; the unbiased variance is undefined")
        var = var * (n / (n - 1))
    return var


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """(values - mean) / sqrt(var + 1e-8) with masked (unbiased) statistics over the whole tensor."""
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    out = (values - mean) * torch.rsqrt(var + 1e-8)
    return out + mean if not shift_mean else out


def cfg_get(config: Any, key: str, default: Any = None) -> Any:
    """Read `key` from a plain dict, an OmegaConf node, a dataclass or any attribute holder.

    Returns `default` when `config` is None, lacks the key, or holds None for it.
    """
    if config is None:
        return default
    if isinstance(config, Mapping):
        value = config.get(key, default)
    else:
        value = getattr(config, key, default)
    return default if value is None else value
