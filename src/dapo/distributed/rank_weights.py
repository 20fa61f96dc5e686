"""The policy's weights where they live, on the worker ranks, for a driver that holds no copy.

With the actor on FSDP ranks and vLLM as the sampler, the trainer's model is a layout only: its
parameters are on the meta device (names, shapes, dtypes, config; no memory). What needs the
weights reads them from the ranks, one round of pieces at a time (``DistributedActor.iter_pieces``):

* vLLM's loader gets ``(name, tensor)`` pairs as the driver's own model would give them
  (``dapo.rollout.vllm_rollout.state_dict_for_vllm``: the state dict's names, a tied output layer
  under ``lm_head.weight`` too), each parameter assembled from its rows as they arrive and
  dropped once the loader has it; a parameter larger than the sync's bucket (the token-embedding
  tables, in practice) is never assembled here: its rows go on as ``RowBlock`` s, block by block,
  and vLLM's side writes each at its place (``dapo.rollout.vllm_table_rows``);
* checkpoints and the final model write the Hugging Face files from the same pieces
  (:func:`dapo.checkpoint.stream_safetensors.save_pretrained_streamed`).

The driver's extra memory is about one bucket plus the parameters being assembled (each no
larger than a bucket). ``version`` is the actor group's count of weight changes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import torch

from dapo.checkpoint.rows import RowBlock
from dapo.distributed.actor_group import DistributedActor
from dapo.distributed.weight_sync import assemble, bucket_bytes


def param_aliases(layout: torch.nn.Module) -> dict[str, list[str]]:
    """Each parameter's ``named_parameters()`` name -> the names vLLM is sent it under: its
    names in the state dict, and ``lm_head.weight`` for an output layer tied to the embedding
    that the state dict does not list."""
    names = set(layout.state_dict(keep_vars=True))
    by_param: dict[int, list[str]] = {}
    first: dict[int, str] = {}
    for n, p in layout.named_parameters(remove_duplicate=False):
        first.setdefault(id(p), n)
        if n in names:
            by_param.setdefault(id(p), []).append(n)
    out = {first[k]: v for k, v in by_param.items()}
    config = getattr(layout, "config", None)
    if "lm_head.weight" not in names and getattr(config, "tie_word_embeddings", False):
        emb = layout.get_input_embeddings().weight
        out.setdefault(first[id(emb)], []).append("lm_head.weight")
    return out


class RankWeights:
    """The ranks' current weights in the layout of ``layout`` (the driver's meta model)."""

    def __init__(self, actor: DistributedActor, layout: torch.nn.Module):
        self.actor, self.layout = actor, layout
        self.aliases = param_aliases(layout)
        self.targets = {n: (p.dtype, p.shape) for n, p in layout.named_parameters() if n in self.aliases}
        params = {id(p) for p in layout.parameters()}
        # real tensors of the state dict that are no parameter (persistent buffers): the driver's own
        self.buffers = {
            n: t
            for n, t in layout.state_dict(keep_vars=True).items()
            if id(t) not in params and not t.is_meta
        }

    @property
    def version(self) -> int:
        return self.actor.weights_version

    @property
    def sync_metrics(self) -> dict[str, float]:
        """``perf/weight_sync_s``, ``_mb`` and ``_rounds`` of the last stream from the ranks."""
        return dict(self.actor.last_sync)

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor | RowBlock]]:
        """``(name, tensor)`` for vLLM's loader, one parameter at a time; a parameter larger than
        the bucket as ``(name, RowBlock)``, one block of its rows at a time."""
        from dapo.rollout.vllm_reload import trim_heap

        largest = bucket_bytes(self.actor.bucket_megabytes)
        for name, t in assemble(self.actor.iter_pieces(), self.targets, max_whole_bytes=largest):
            for alias in self.aliases[name]:
                yield alias, t
            del t
            # the parameters assembled and freed here come from the heap once glibc's mmap
            # threshold has risen; without this the freed pages stayed resident (0.4x the model)
            trim_heap()
        for name, b in self.buffers.items():
            yield name, b.detach()

    def save_pretrained(self, out_dir: str | os.PathLike, **save_kwargs: Any) -> None:
        """The Hugging Face directory ``save_pretrained`` writes for the ranks' weights."""
        from dapo.checkpoint.stream_safetensors import save_pretrained_streamed

        save_pretrained_streamed(self.layout, out_dir, self.actor.iter_pieces(), **save_kwargs)
