"""Model dtype from config (``actor_rollout_ref.actor.fsdp_config.model_dtype``), bf16 where supported.

``resolve_model_dtype("bf16", device)`` is bfloat16 on a GPU that supports it and on a CPU with
native bf16 matmuls (AVX512-BF16 / AMX, what oneDNN reports); elsewhere it falls back to float32
with a warning, since emulated bf16 is slower than float32 and no more accurate. Log-probs,
entropies and losses stay float32 whatever the model dtype (``dapo.algo.entropy`` upcasts).
"""

from __future__ import annotations

import warnings

import torch

_NAMES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "float": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
}


def cpu_supports_bf16() -> bool:
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def resolve_model_dtype(name: str | None, device: str | torch.device = "cpu") -> torch.dtype:
    """The torch dtype to load the model in; ``None`` means float32."""
    if name is None:
        return torch.float32
    key = str(name).lower().replace("torch.", "")
    if key not in _NAMES:
        raise ValueError(
            f"actor_rollout_ref.actor.fsdp_config.model_dtype={name!r}: expected one of fp32, bf16, fp16"
        )
    dtype = _NAMES[key]
    dev = torch.device(device)
    if dtype == torch.bfloat16:
        ok = (
            torch.cuda.is_available() and torch.cuda.is_bf16_supported()
            if dev.type == "cuda"
            else cpu_supports_bf16()
        )
        if not ok:
            warnings.warn(
                f"model_dtype={name}: this {dev.type} has no native bf16; using float32", stacklevel=2
            )
            return torch.float32
    if dtype == torch.float16 and dev.type == "cpu":
        warnings.warn(
            f"model_dtype={name}: float16 is not supported for training on CPU; using float32", stacklevel=2
        )
        return torch.float32
    return dtype
