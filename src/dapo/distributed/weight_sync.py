"""Copy trained weights into the rollout engine's model in place, without touching the disk.

The FSDP ranks gather the full (unsharded) trainable parameters on rank 0; the worker group
carries them to the driver through shared memory (process pipes) or Ray's object store, and
``load_weights_into`` copies them into the rollout model's existing tensors, so engines that
hold references to those tensors (the fast CPU engine re-fuses them at every ``generate``) see
the new values. Only trainable parameters travel (buffers such as rotary tables do not change),
and nothing is sent when the update took no optimizer step.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch


def load_weights_into(model: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> int:
    """Copy ``state`` into ``model``'s parameters of the same names; returns bytes copied.
    Every trainable parameter of the model must be present (tied weights count once)."""
    params = dict(model.named_parameters())
    missing = [n for n, p in params.items() if p.requires_grad and n not in state]
    if missing:
        raise KeyError(f"weight sync: {len(missing)} parameters missing, e.g. {missing[:3]}")
    nbytes = 0
    with torch.no_grad():
        for name, value in state.items():
            p = params.get(name)
            if p is None:
                continue  # a tied alias (e.g. lm_head.weight) that the model lists under one name
            if p.shape != value.shape:
                raise ValueError(
                    f"weight sync: {name} has shape {tuple(value.shape)}, model {tuple(p.shape)}"
                )
            p.copy_(value.to(device=p.device, dtype=p.dtype))
            nbytes += value.numel() * value.element_size()
    return nbytes
