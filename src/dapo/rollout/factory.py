"""The rollout engine ``actor_rollout_ref.rollout.name`` asks for: the own engine (``hf``) or vLLM."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

TRANSFER_WORDS = {"socket": "over a local socket", "collective": "by a torch.distributed broadcast"}


def vllm_dtype(rollout_cfg: Any, model: torch.nn.Module) -> str:
    """``rollout.dtype``, or the actor's parameter dtype when null."""
    if rollout_cfg.dtype:
        return str(rollout_cfg.dtype)
    return str(next(model.parameters()).dtype).removeprefix("torch.")


def build_rollout(
    cfg: Any,
    model: torch.nn.Module,
    model_path: str,
    eos_ids: list[int],
    pad_id: int,
    log: Callable[[str], None] = print,
) -> Any:
    """An engine with ``generate(prompt_ids, params, prompt_width) -> RolloutOutput``, from the
    resolved run config (``rollout.seed``, ``prompt_length`` and ``response_length`` filled)."""
    r = cfg.actor_rollout_ref.rollout
    if r.name != "vllm":
        from dapo.rollout.hf import HFRollout

        return HFRollout(model, eos_ids, pad_id, seed=int(cfg.trainer.seed))
    from dapo.rollout.vllm_rollout import VllmSettings, check_model

    device = "cuda" if cfg.trainer.device == "cuda" else "cpu"
    check_model(model.config, device)
    max_len = int(r.prompt_length) + int(r.response_length)
    settings = VllmSettings.from_config(r, vllm_dtype(r, model), max_len, device)
    if r.placement == "server":
        from dapo.rollout.vllm_server import VllmServerRollout

        engine: Any = VllmServerRollout(
            model_path,
            eos_ids,
            pad_id,
            settings,
            seed=int(r.seed),
            startup_timeout_s=r.server_startup_timeout_s,
            devices=None if r.server_devices is None else list(r.server_devices),
        )
        where = "" if r.server_devices is None else f" on CUDA devices {list(r.server_devices)}"
        log(
            f"vLLM server: pid {engine.pid} (its own process group) at {engine.url}{where}, "
            f"weights sent {TRANSFER_WORDS[settings.weight_transfer]}, log in {engine.log_path}"
        )
    else:
        from dapo.rollout.vllm_rollout import VllmRollout

        engine = VllmRollout(model_path, eos_ids, pad_id, settings, seed=int(r.seed))
    if settings.load_format == "dummy":  # no weights yet: the first generation syncs
        engine.synced_version = None
    return engine
