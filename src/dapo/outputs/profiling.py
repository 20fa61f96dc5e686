"""Phase timers, profiler traces for chosen steps, FLOPs-per-token / MFU estimates and peak memory.

* :class:`Timer` adds up the seconds of each named phase (``with timer("gen"): ...``).

* :func:`profile_step` wraps one training step in ``torch.profiler`` when the step is listed
  in ``trainer.profile_steps`` and writes a Chrome trace (open in chrome://tracing or Perfetto).
* :func:`flops_per_token` is the usual dense-transformer estimate ``6 N + 12 L H T``: ``N``
  matmul parameters (attention and MLP projections of every layer, plus embedding and LM
  head as verl counts them), and the attention score/value term for a context of ``T`` tokens.
  Forward + backward, i.e. a training token; a forward-only token is a third of it.
* :func:`estimate_mfu`: achieved FLOP/s over the device's promised peak (dense bf16).
* :func:`peak_memory_gb`: CUDA ``max_memory_allocated``, or on CPU the process's peak RSS.
"""

from __future__ import annotations

import contextlib
import os
import resource
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

GiB = 1024**3


@dataclass
class Timer:
    """Seconds per phase, accumulated over every entry of the phase."""

    raw: dict[str, float] = field(default_factory=dict)

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.raw[name] = self.raw.get(name, 0.0) + time.perf_counter() - t0

    def add(self, other: Timer) -> None:
        """Add ``other``'s phases to this timer's."""
        for k, v in other.raw.items():
            self.raw[k] = self.raw.get(k, 0.0) + v


@contextlib.contextmanager
def profile_step(
    step: int, profile_steps: Iterable[int] | None, out_dir: str | os.PathLike
) -> Iterator[Path | None]:
    """Profile this step if it is in ``profile_steps``; yields the trace path (None when not profiled).

    The trace is ``<out_dir>/step_<step>.json``, written when the block exits (also on error).
    """
    steps = {int(s) for s in (profile_steps or ())}
    if int(step) not in steps:
        yield None
        return
    from torch.profiler import ProfilerActivity, profile

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"step_{int(step)}.json"
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    prof = profile(activities=activities, record_shapes=True, profile_memory=True, with_stack=False)
    prof.__enter__()
    try:
        yield path
    finally:
        prof.__exit__(None, None, None)
        prof.export_chrome_trace(str(path))


def _get(cfg: Any, name: str, default: Any = None) -> Any:
    if isinstance(cfg, dict):
        return cfg.get(name, default)
    return getattr(cfg, name, default)


def matmul_params(model_config: Any) -> dict[str, int]:
    """Parameter counts that take part in matmuls, from a Hugging Face decoder config."""
    h = int(_get(model_config, "hidden_size"))
    L = int(_get(model_config, "num_hidden_layers"))
    heads = int(_get(model_config, "num_attention_heads"))
    kv = int(_get(model_config, "num_key_value_heads", None) or heads)
    head_dim = int(_get(model_config, "head_dim", None) or h // heads)
    inter = int(_get(model_config, "intermediate_size", None) or 4 * h)
    vocab = int(_get(model_config, "vocab_size"))
    attn = h * heads * head_dim + 2 * h * kv * head_dim + heads * head_dim * h
    # gated MLP (gate, up, down) as in Llama/Qwen2; a plain MLP would be 2 * h * inter
    mlp = 3 * h * inter
    return {
        "layers": L * (attn + mlp),
        "embedding_and_lm_head": 2 * vocab * h,
        "attention_width": heads * head_dim,
        "num_layers": L,
    }


def flops_per_token(model_config: Any, seq_len: float = 0.0) -> float:
    """Training FLOPs (forward + backward) for one token with ``seq_len`` tokens of context.

    ``6 * N + 12 * num_layers * num_heads * head_dim * seq_len``.
    """
    p = matmul_params(model_config)
    n = p["layers"] + p["embedding_and_lm_head"]
    return 6.0 * n + 12.0 * p["num_layers"] * p["attention_width"] * float(seq_len)


def batch_flops(model_config: Any, seq_lens: Iterable[int]) -> float:
    """Training FLOPs of a batch whose sequences have ``seq_lens`` tokens (causal attention over each)."""
    p = matmul_params(model_config)
    n = p["layers"] + p["embedding_and_lm_head"]
    lens = [int(s) for s in seq_lens]
    return 6.0 * n * sum(lens) + 12.0 * p["num_layers"] * p["attention_width"] * sum(s * s for s in lens)


# dense bf16 tensor-core peaks (FLOP/s) by device-name substring, most specific first
_PEAKS = (
    ("B200", 2250e12),
    ("H200", 989e12),
    ("H100", 989e12),
    ("H800", 989e12),
    ("H20", 148e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
    ("L40", 181e12),
    ("A10", 125e12),
    ("4090", 165e12),
    ("V100", 125e12),
    ("T4", 65e12),
)


def promised_flops(device: torch.device | str | None = None) -> float | None:
    """The dense bf16 peak of the CUDA device, or None when unknown (CPU, unlisted GPU).

    ``DAPO_PEAK_FLOPS`` (FLOP/s) overrides it, for unlisted devices and CPUs.
    """
    env = os.environ.get("DAPO_PEAK_FLOPS")
    if env:
        return float(env)
    dev = torch.device(device) if device is not None else None
    if dev is not None and dev.type != "cuda":
        return None
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(dev)
    for key, peak in _PEAKS:
        if key in name:
            return peak
    return None


def estimate_mfu(
    model_config: Any,
    seq_lens: Iterable[int],
    seconds: float,
    n_devices: int = 1,
    peak_flops: float | None = None,
) -> float | None:
    """Model FLOPs utilisation of an update over ``seq_lens`` that took ``seconds``; None without a peak."""
    peak = peak_flops if peak_flops is not None else promised_flops()
    if not peak or seconds <= 0:
        return None
    return batch_flops(model_config, seq_lens) / (seconds * peak * max(1, n_devices))


def peak_memory_gb(device: torch.device | str | None = None) -> float:
    """Peak memory in GiB: CUDA ``max_memory_allocated`` on a CUDA device, else the process's peak RSS."""
    dev = torch.device(device) if device is not None else None
    if (
        (dev is None or dev.type == "cuda")
        and torch.cuda.is_available()
        and (dev is not None or torch.cuda.is_initialized())
    ):
        return torch.cuda.max_memory_allocated(dev) / GiB
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes
    return rss / GiB if sys.platform == "darwin" else rss * 1024 / GiB


def matmul_peak_flops(dtype: torch.dtype = torch.float32, size: int = 1024, seconds: float = 1.0) -> float:
    """Best FLOP/s of a square matmul in this process (same threads, same dtype as the model)."""
    a = torch.randn(size, size, dtype=dtype)
    b = torch.randn(size, size, dtype=dtype)
    torch.mm(a, b)
    best = 0.0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        torch.mm(a, b)
        dt = time.perf_counter() - t
        best = max(best, 2 * size**3 / dt)
    return best


def device_peak_flops(device: torch.device, dtype: torch.dtype) -> float | None:
    """The device's promised peak; on a CPU, the best matmul FLOP/s measured now (it draws from
    the global torch generator, so callers measure once per run)."""
    peak = promised_flops(device)
    if peak is None and device.type == "cpu":
        peak = matmul_peak_flops(dtype, size=512, seconds=0.3)
    return peak


def actor_perf_metrics(
    model_config: Any, seq_lens: Iterable[int], seconds: float, device: torch.device, peak_flops: float | None
) -> dict[str, float]:
    """``perf/mfu/actor`` (when a peak is known) and ``perf/max_memory_allocated_gb`` of an update."""
    out = {}
    mfu = estimate_mfu(model_config, seq_lens, seconds, peak_flops=peak_flops)
    if mfu is not None:
        out["perf/mfu/actor"] = mfu
    out["perf/max_memory_allocated_gb"] = peak_memory_gb(device)
    return out
