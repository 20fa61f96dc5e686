"""How much a weight sync raises the trainer's peak memory: FSDP ranks -> vLLM, one assembled
parameter at a time, those larger than the bucket one block of rows at a time
(``dapo.distributed.rank_weights``: what the trainer does with actor ranks
and vLLM, holding no copy of the policy), or, with ``driver_copy``, ranks -> a full copy in the
trainer (``DistributedActor.sync_weights``) -> vLLM (``update_weights``), in either placement.

The trainer's peak resident set is read from ``/proc/self/status`` (``VmHWM``) after resetting
it (``/proc/self/clear_refs``), so each figure is the peak reached during that one call above
the resident set before it. ``benchmarks/weight_sync_memory.py`` runs the grid; the tests run
one small point of it.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from dapo.checkpoint.rows import RowBlock

# random-weight models of real shapes (their configs, not their weights)
SHAPES: dict[str, dict[str, Any]] = {
    "smollm2-135m": dict(
        arch="llama",
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        rope_theta=100000.0,
        tie_word_embeddings=True,
    ),
    "qwen2.5-0.5b": dict(
        arch="qwen2",
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
    ),
    # ~76 MB in fp32: big enough that a full copy stands out of the interpreter's noise, with a
    # small embedding (5%: vLLM's CPU reload of the largest layer is what colocated syncs add)
    "small": dict(
        arch="llama",
        vocab_size=2048,
        hidden_size=512,
        intermediate_size=1024,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
    ),
    # ~38 MB in fp32, 88% of it the tied embedding: what a sync costs for the table (which vLLM's
    # own CPU reload rebuilt and repacked beside the old pack) stands out of everything else
    "tied-table": dict(
        arch="llama",
        vocab_size=32768,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
    ),
    # ~5 MB in fp32 with a vocabulary vLLM pads (4001 rows -> 4032): a table loaded in blocks of
    # rows must leave the padding as vLLM's own loader does
    "padded-vocab": dict(
        arch="llama",
        vocab_size=4001,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
    ),
}


def save_random_model(out: str | Path, shape: str, seed: int = 0) -> Path:
    """A model of ``SHAPES[shape]`` with random weights, saved as a Hugging Face directory."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    kw = dict(SHAPES[shape])
    arch = kw.pop("arch")
    config_cls, model_cls = (
        (LlamaConfig, LlamaForCausalLM) if arch == "llama" else (Qwen2Config, Qwen2ForCausalLM)
    )
    torch.manual_seed(seed)
    out = Path(out)
    model_cls(config_cls(bos_token_id=1, eos_token_id=2, pad_token_id=0, **kw)).save_pretrained(out)
    return out


def trainable_bytes(model: torch.nn.Module) -> int:
    """The bytes of the model's trainable parameters (tied ones once): "the model's size"."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {key}")


class PeakRss:
    """``with PeakRss() as m: ...``; then ``m.raised`` is the peak resident bytes reached inside
    above the resident bytes at entry (Linux only)."""

    def __enter__(self) -> PeakRss:
        gc.collect()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current resident set
        self.before = _status_kib("VmRSS") * 1024
        return self

    def __exit__(self, *exc: object) -> None:
        self.raised = max(0, _status_kib("VmHWM") * 1024 - self.before)


def scramble(model: torch.nn.Module) -> None:
    """Overwrite the rollout model's weights so that a sync has to bring every one back."""
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(0.5)


def resident_param_bytes(model: torch.nn.Module) -> int:
    """The bytes of the model's parameters that hold memory (not on the meta device)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if not p.is_meta)


def check_sent(
    weights: Iterable[tuple[str, torch.Tensor | RowBlock]], want: Mapping[str, torch.Tensor], what: str
) -> int:
    """Check that what a sync sends is ``want`` (blocks of rows at their place); the bytes of the
    largest tensor or block handed over."""
    largest = 0
    for n, t in weights:
        rows = t.rows if isinstance(t, RowBlock) else t
        largest = max(largest, rows.numel() * rows.element_size())
        if n not in want:
            continue
        ref = want[n][t.start : t.stop] if isinstance(t, RowBlock) else want[n]
        if not torch.equal(ref, rows):
            raise AssertionError(f"{what}: {n} is not the ranks'")
    return largest


def measure_sync(
    model_dir: str | Path,
    placement: str,
    ranks: int,
    bucket_megabytes: float,
    repeats: int = 2,
    log: Any = print,
    driver_copy: bool = False,
) -> dict[str, Any]:
    """Start ``ranks`` FSDP ranks (local processes) and a vLLM engine in ``placement`` on the
    model, then sync ``repeats`` times; per sync, the trainer's peak raise in bytes and as a
    share of the model's size (with ``driver_copy``, also split into the ranks -> copy part and
    the copy -> vLLM part), and the bytes of parameters the trainer holds. Checks that the
    weights sent are the ranks', and gives the largest tensor (or block of rows) sent."""
    from dapo.actor.dp_actor import actor_settings
    from dapo.distributed import DistributedActor, ProcessWorkerGroup
    from dapo.distributed.fsdp_worker import WorkerSpec, worker_factory
    from dapo.distributed.rank_weights import RankWeights
    from dapo.model.loader import load_model, load_model_layout
    from dapo.rollout.vllm_rollout import VllmSettings

    settings = actor_settings(ppo_micro_batch_size_per_gpu=1)
    driver_model = (
        load_model(model_dir).eval().requires_grad_(True) if driver_copy else load_model_layout(model_dir)
    )
    size = trainable_bytes(driver_model)
    group = ProcessWorkerGroup(
        worker_factory(WorkerSpec(model_path=str(model_dir), settings=settings)), ranks
    )
    actor = DistributedActor(
        group,
        settings,
        rollout_model=driver_model if driver_copy else None,
        bucket_megabytes=bucket_megabytes,
    )
    stream = None if driver_copy else RankWeights(actor, driver_model)
    vs = VllmSettings.for_model("float32", 256, max_num_seqs=8, max_num_batched_tokens=256)
    if placement == "server":
        from dapo.rollout.vllm_server import VllmServerRollout

        engine: Any = VllmServerRollout(str(model_dir), [2], 0, vs, seed=0)
    else:
        from dapo.rollout.vllm_rollout import VllmRollout

        engine = VllmRollout(str(model_dir), [2], 0, vs, seed=0)
    want = dict(load_model(model_dir).named_parameters())
    syncs = []
    try:
        for i in range(repeats):
            point: dict[str, Any] = {}
            if stream is not None:
                with PeakRss() as whole_part:
                    engine.load_weights(stream.named_weights())
                whole = whole_part.raised
                point["largest_piece"] = check_sent(stream.named_weights(), want, f"sync {i}")
            else:
                scramble(driver_model)
                with PeakRss() as ranks_part:
                    actor.sync_weights()
                with PeakRss() as vllm_part:
                    engine.update_weights(driver_model)
                # the whole sync's peak above its start (the second part starts where the first ended)
                whole = max(ranks_part.raised, vllm_part.before + vllm_part.raised - ranks_part.before)
                point.update(ranks_to_trainer=ranks_part.raised, trainer_to_vllm=vllm_part.raised)
                for n, p in driver_model.named_parameters():
                    if not torch.equal(p, want[n]):
                        raise AssertionError(f"sync {i}: {n} did not arrive")
            point.update(
                whole=whole,
                ratio=whole / size,
                rounds=actor.last_sync["perf/weight_sync_rounds"],
                driver_param_bytes=resident_param_bytes(driver_model),
            )
            syncs.append(point)
            log(f"  sync {i}: peak raise {whole / 2**20:.1f} MiB = {whole / size:.3f} x model")
    finally:
        engine.shutdown()
        actor.shutdown()
    return {
        "placement": placement,
        "ranks": ranks,
        "bucket_megabytes": bucket_megabytes,
        "driver_copy": driver_copy,
        "model_bytes": size,
        "driver_param_bytes": resident_param_bytes(driver_model),
        "syncs": syncs,
        "max_ratio": max(s["ratio"] for s in syncs),
    }
