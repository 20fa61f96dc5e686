"""Build the trainer's actor from the config: in-process, local processes or Ray.

``build_actor`` returns an object with the ``LocalActor`` / ``DistributedActor`` interface:

* ``trainer.nnodes * trainer.n_gpus_per_node`` = 1 (the default) and no backend asked: the
  single-process actor (``LocalActor``), exactly today's behaviour;
* otherwise FSDP ranks, on ``trainer.device`` (cpu: gloo, cuda: nccl), in
  ``worker_backend`` = ``process`` (spawned local processes, no Ray needed) or ``ray`` (a private
  local Ray when ``nnodes`` = 1 and no cluster address is given, else ``ray.init(address=...)``).

Sizes are per rank as verl's FSDP workers use them (docs/verl_compat.md, Batch sizes): the
``*_per_gpu`` values (the resolved config has divided the deprecated global keys by the DP size);
``ppo_mini_batch_size * n`` stays global (the driver splits each mini-batch across the ranks) and
must divide by the DP size, or the split is padded with zero-weight rows (logged).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from dapo.actor.dp_actor import Actor, ActorSettings
from dapo.distributed.actor_group import DistributedActor, LocalActor
from dapo.distributed.fsdp_worker import WorkerSpec, worker_factory
from dapo.distributed.worker_group import ProcessWorkerGroup

BACKENDS = ("auto", "inprocess", "process", "ray")


def dp_world_size(cfg: Any) -> int:
    return int(cfg.trainer.nnodes) * int(cfg.trainer.n_gpus_per_node)


def actor_on_ranks(cfg: Any, backend: str | None = None) -> bool:
    """Whether :func:`build_actor` puts the actor on worker ranks (else it runs in the trainer)."""
    backend = backend or cfg.trainer.worker_backend
    return not (backend == "inprocess" or (backend == "auto" and dp_world_size(cfg) == 1))


def driver_holds_weights(cfg: Any) -> bool:
    """Whether the trainer keeps a full copy of the policy. It does not when the actor is on
    worker ranks and vLLM samples (vLLM holds its own copy, fed from the ranks; checkpoints are
    written from the ranks): its model is then a layout on the meta device
    (:mod:`dapo.distributed.rank_weights`). The own engine generates from the trainer's copy,
    and the async loop hands the generation thread a snapshot of it, so both keep one."""
    return not (
        actor_on_ranks(cfg)
        and cfg.actor_rollout_ref.rollout.name == "vllm"
        and cfg.async_training.mode == "sync"
    )


def warn_uneven_mini_batch(settings: ActorSettings, dp: int, log: Callable[[str], None] = print) -> None:
    """Say so when a mini-batch does not split evenly over the ``dp`` data-parallel groups."""
    if settings.ppo_mini_batch_size % dp:
        log(
            f"distributed: ppo_mini_batch_size x rollout.n = {settings.ppo_mini_batch_size} trajectories "
            f"does not divide by {dp} ranks; each mini-batch is padded with zero-weight rows"
        )


def worker_spec(cfg: Any, model_path: str, settings: ActorSettings, use_ref: bool) -> WorkerSpec:
    arr = cfg.actor_rollout_ref
    a, m = arr.actor, arr.model
    o, f = a.optim, a.fsdp_config
    return WorkerSpec(
        model_path=str(model_path),
        settings=settings,
        lr=float(o.lr),
        betas=tuple(o.betas),
        weight_decay=float(o.weight_decay),
        fsdp_size=int(f.fsdp_size),
        param_offload=bool(f.param_offload),
        optimizer_offload=bool(f.optimizer_offload),
        device=str(cfg.trainer.device),
        use_ref=use_ref,
        enable_gradient_checkpointing=bool(m.enable_gradient_checkpointing),
        trust_remote_code=bool(m.trust_remote_code),
        override_config=dict(m.override_config),
        # trainer.torch_threads=0 (all cores) is one thread a rank: the ranks share the cores
        torch_threads=max(1, int(cfg.trainer.torch_threads)),
        seed=int(cfg.trainer.seed),
    )


def build_actor(
    cfg: Any,
    *,
    model_path: str,
    settings: ActorSettings,
    actor: Actor | None = None,
    ref_model: torch.nn.Module | None = None,
    use_ref: bool = False,
    lr_source: Any = None,
    rollout_model: torch.nn.Module | None = None,
    run_dir: str | os.PathLike = ".",
    backend: str | None = None,
    log: Callable[[str], None] = print,
) -> LocalActor | DistributedActor:
    """The actor the trainer drives (see the module docstring). ``actor`` / ``ref_model`` are the
    in-process ones (used when the world size is 1); ``lr_source`` is the driver's optimizer that
    the LR scheduler steps; ``rollout_model`` is the model the rollout engine samples from."""
    backend = backend or cfg.trainer.worker_backend
    if backend not in BACKENDS:
        raise ValueError(f"trainer.worker_backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    dp = dp_world_size(cfg)
    if not actor_on_ranks(cfg, backend):
        if dp != 1:
            raise ValueError(
                f"trainer.worker_backend=inprocess runs one rank, but trainer.nnodes x n_gpus_per_node = {dp}"
            )
        if actor is None:
            raise ValueError("the in-process backend needs the trainer's Actor")
        return LocalActor(actor, ref_model)
    s = settings
    warn_uneven_mini_batch(s, dp // s.sp_size, log)
    factory = worker_factory(worker_spec(cfg, model_path, s, use_ref))
    nnodes = int(cfg.trainer.nnodes)
    cuda = str(cfg.trainer.device) == "cuda"
    started = None
    if backend == "ray" or (backend == "auto" and nnodes > 1):
        from dapo.distributed import ray_group

        address = os.environ.get("RAY_ADDRESS")
        if nnodes == 1 and not address:
            n_gpus = int(cfg.trainer.n_gpus_per_node) if cuda else 0
            started = ray_group.init_local_ray(
                run_dir, num_cpus=max(dp, os.cpu_count() or 1), num_gpus=n_gpus
            )
            log(f"ray: local, started in {started['startup_s']:.1f} s, files in {started['temp_dir']}")
            local = True
        else:
            import ray

            if not ray.is_initialized():
                ray.init(address=address or "auto")
            local = False
        group = ray_group.RayWorkerGroup(
            factory,
            dp,
            num_cpus_per_worker=1,
            num_gpus_per_worker=1 if cuda else 0,
            local=local,
            nnodes=1 if local else nnodes,
        )
    else:
        if nnodes > 1:
            raise ValueError(
                "trainer.worker_backend=process runs on one machine; use ray for trainer.nnodes > 1"
            )
        group = ProcessWorkerGroup(factory, dp)
    log(f"distributed: {dp} FSDP rank(s) via {type(group).__name__}, ready in {group.startup_s:.1f} s")
    out = DistributedActor(
        group,
        s,
        lr_source=lr_source,
        rollout_model=rollout_model,
        balance=bool(cfg.trainer.balance_batch),
        bucket_megabytes=float(cfg.actor_rollout_ref.rollout.update_weights_bucket_megabytes),
        log=log,
    )
    for note in out.info()[0]["notes"]:
        log(f"distributed: {note}")
    if started is not None:
        out.on_shutdown.append(lambda: ray_group.shutdown_local_ray(started))
    return out
