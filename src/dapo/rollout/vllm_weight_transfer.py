"""One weight sync to vLLM workers in other processes, over the transport
``actor_rollout_ref.rollout.weight_transfer`` names: ``socket`` (:mod:`dapo.rollout.vllm_weight_stream`)
or ``collective`` (:mod:`dapo.rollout.vllm_weight_collective`: gloo on CPU, nccl on CUDA). Both
engines that need one (the server's workers, the in-process engine's tensor-parallel workers)
sync through :func:`push_weights`; only the RPC that reaches their workers differs."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import torch

from dapo.checkpoint.rows import RowBlock
from dapo.config.validate import WEIGHT_TRANSFERS

if TYPE_CHECKING:
    from dapo.rollout.vllm_rollout import VllmSettings


def make_sender(transfer: str, workers: int, device: str) -> Any:
    """The trainer's side of one sync to ``workers`` workers (``device``: the engine's, cuda or cpu)."""
    if transfer == "collective":
        from dapo.rollout.vllm_weight_collective import CollectiveSender

        return CollectiveSender(expected=workers, backend="nccl" if device == "cuda" else "gloo")
    if transfer == "socket":
        from dapo.rollout.vllm_weight_stream import WeightSender

        return WeightSender(expected=workers)
    raise ValueError(f"weight_transfer must be one of {', '.join(WEIGHT_TRANSFERS)}, got {transfer!r}")


def push_weights(
    weights: Iterable[tuple[str, torch.Tensor | RowBlock]],
    settings: VllmSettings,
    rpc: Callable[[str, dict[str, str]], object],
) -> None:
    """Send ``weights`` to every worker: the sender works in a thread while ``rpc(method, kwargs)``
    makes the workers take them (it returns once they have). A worker's failure that the sender
    heard of is raised (it names the worker) in preference to the RPC's own."""
    sender = make_sender(settings.weight_transfer, settings.tensor_model_parallel_size, settings.device)
    thread = sender.send_in_thread(weights)
    rpc_error: Exception | None = None
    try:
        rpc(sender.method, sender.address())
    except Exception as e:
        rpc_error = e
    finally:
        sender.close()
        thread.join()
    if sender.error is not None:
        raise sender.error from rpc_error
    if rpc_error is not None:
        raise rpc_error
