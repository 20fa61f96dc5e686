"""Optimizers and learning-rate schedules: the RL actor's (verl's keys) and the warm starts'.

The actor's schedule is verl's constant-with-warmup or cosine-with-warmup, stepped once per
training step (not per generation round or mini-batch). The warm starts of the built-in tiny
models use a linear warm-up and a linear decay to 5%, with the gradient norm clipped at 1.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch


def lr_lambda(
    scheduler_type: str, warmup: int, total: int, min_lr_ratio: float, num_cycles: float
) -> Callable[[int], float]:
    """verl's constant-with-warmup and cosine-with-warmup schedules, as a factor of the base LR."""

    def fn(step: int) -> float:
        if warmup > 0 and step < warmup:
            return float(step) / float(max(1, warmup))
        if scheduler_type == "constant":
            return 1.0
        progress = float(step - warmup) / float(max(1, total - warmup))
        cos = 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress))
        return max(0.0, min_lr_ratio + (1.0 - min_lr_ratio) * cos)

    return fn


def build_optimizer(
    model: torch.nn.Module, optim: Any, total_training_steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW and its schedule from a resolved ``actor_rollout_ref.actor.optim``
    (``dapo.config.resolve`` turns a ratio warmup into ``lr_warmup_steps``)."""
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=optim.lr, betas=tuple(optim.betas), weight_decay=optim.weight_decay
    )
    warmup = optim.lr_warmup_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lr_lambda(
            optim.lr_scheduler_type, warmup, total_training_steps, optim.min_lr_ratio, optim.num_cycles
        ),
    )
    return optimizer, scheduler


def sft_optimizer(
    model: torch.nn.Module, lr: float, steps: int, warmup: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW with a linear warm-up over ``warmup`` steps and a linear decay to 5% at ``steps``."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * max(0.05, 1 - s / steps)
    )
    return opt, sched


def sft_step(
    model: torch.nn.Module,
    loss: torch.Tensor,
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LRScheduler,
) -> None:
    """One warm-start update: backward, clip the gradient norm at 1, step the optimizer and LR."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
