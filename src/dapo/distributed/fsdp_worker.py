"""One data-parallel rank of the actor (and optional reference): FSDP2 over torch.distributed.

The worker wraps the single-process ``dapo.actor.dp_actor`` code, unchanged:

* the model is sharded with ``fully_shard`` (each decoder layer, then the root) on a device
  mesh of all ranks, or an HSDP mesh (replicate x shard) when ``fsdp_size`` < world size;
* ``update_policy`` receives this rank's piece of every mini-batch (the driver forms the
  mini-batches exactly as one process would, ``partition.minibatch_plan``), all-reduces each
  mini-batch's valid-token and valid-sequence counts, and runs the single-process ``Actor`` on
  the piece. That actor normalises by the *local* counts; the gradient is rescaled by
  c = dp_size * local/global (tokens for token-mean, sequences for seq-mean-*, 1*dp for token-sum)
  on the log-prob (and entropy) outputs, so each rank back-propagates
  ``agg_loss(..., dp_size, batch_num_tokens, global_batch_size)`` and FSDP's gradient average
  divides dp_size back out: token-mean stays the exact mean over the global mini-batch;
* with ``ulysses_sequence_parallel_size`` = sp > 1, consecutive groups of sp ranks receive the
  same rows and split each packed sequence between them (``dapo.distributed.ulysses``); counts
  are divided by sp (each row is held sp times), and FSDP's average over all ranks sums the SP
  ranks' partial gradients. ``use_remove_padding`` (sp = 1 too) runs the model's own forward
  with packed attention, so FSDP's hooks gather the sharded weights;
* old / reference log-probs run on this rank's rows;
* the model is built on the meta device and each rank reads only its own rows of every
  parameter from the checkpoint's safetensors files (``load_rank_rows``): no rank materialises
  the full model;
* ``weight_rounds`` / ``weight_round`` hand the trained weights to the driver in bounded pieces
  (``dapo.distributed.weight_sync``); ``full_state_dict`` gathers them whole on rank 0 (tests);
* ``save_sharded`` / ``load_sharded`` write and read a torch.distributed.checkpoint directory
  (one file per rank, loadable at any world size, also without torch.distributed).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from dapo.actor.dp_actor import Actor, ActorSettings, compute_log_prob
from dapo.batch import Batch
from dapo.model.meta import parameters_on_meta

_LOSS_KEYS = ("actor/pg_loss", "actor/entropy", "actor/kl_loss")
_RANK0_KEYS = ("actor/grad_norm", "actor/lr", "actor/kl_coef")


@dataclass
class WorkerSpec:
    """Everything a rank needs to build itself: a picklable message to a worker process (its own
    flat shape because it crosses a process boundary, and the distributed tests start ranks from
    a model directory alone). ``settings`` is the actor's view of the config."""

    model_path: str
    settings: ActorSettings
    lr: float = 1e-6
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.01
    fsdp_size: int = -1
    param_offload: bool = False
    optimizer_offload: bool = False
    device: str = "cpu"
    use_ref: bool = False
    enable_gradient_checkpointing: bool = False
    trust_remote_code: bool = False
    override_config: dict = field(default_factory=dict)
    torch_threads: int = 1
    seed: int = 1
    backend: str | None = None  # default: gloo on cpu, nccl on cuda


class _GradScale(torch.autograd.Function):
    """Identity forward; gradient times ``c`` backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, c: float) -> torch.Tensor:
        ctx.c = c
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        return g * ctx.c, None


def grad_scale(x: torch.Tensor | None, c: float) -> torch.Tensor | None:
    if x is None or c == 1.0 or not x.requires_grad:
        return x
    return _GradScale.apply(x, c)


def build_mesh(world: int, fsdp_size: int, device_type: str):
    """1-D mesh over all ranks, or an HSDP 2-D mesh (replicate, shard) of shard groups of
    ``fsdp_size`` ranks (verl's ``fsdp_config.fsdp_size``; -1 = all ranks)."""
    from torch.distributed.device_mesh import init_device_mesh

    if fsdp_size <= 0 or fsdp_size >= world:
        return init_device_mesh(device_type, (world,), mesh_dim_names=("fsdp",))
    if world % fsdp_size:
        raise ValueError(f"fsdp_config.fsdp_size={fsdp_size} must divide the world size {world}")
    return init_device_mesh(device_type, (world // fsdp_size, fsdp_size), mesh_dim_names=("ddp", "fsdp"))


def shard_model(model: torch.nn.Module, mesh: Any, offload: bool, reshard_after_forward: bool = True) -> None:
    """``fully_shard`` each decoder layer, then the root (embeddings, final norm, head)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

    policy = CPUOffloadPolicy() if offload else OffloadPolicy()
    inner = getattr(model, "model", None)
    for layer in getattr(inner, "layers", []) or []:
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward, offload_policy=policy)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward, offload_policy=policy)


class FSDPActorWorker:
    """Built by a worker group as ``FSDPActorWorker(spec)(rank, world, addr, port)`` -- see
    ``worker_factory``."""

    def __init__(self, spec: WorkerSpec, rank: int, world: int, master_addr: str, master_port: int):
        t0 = time.perf_counter()
        self.spec, self.rank, self.world = spec, rank, world
        torch.set_num_threads(max(1, int(spec.torch_threads)))
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        cuda = spec.device == "cuda"
        if master_addr in ("127.0.0.1", "localhost") and not cuda:
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        if (
            cuda and torch.cuda.device_count() > 1
        ):  # local processes share the node's GPUs; Ray gives one each
            torch.cuda.set_device(rank % torch.cuda.device_count())
        self.device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        backend = spec.backend or ("nccl" if cuda else "gloo")
        self.notes: list[str] = []
        # a group already in this process (an in-process vLLM engine makes one) is borrowed, and
        # left to its owner at close: destroying it broke that engine and every later one
        self._owns_group = not dist.is_initialized()
        if self._owns_group:
            dist.init_process_group(
                backend,
                init_method=f"tcp://{master_addr}:{master_port}",
                rank=rank,
                world_size=world,
            )
        self.mesh = build_mesh(world, spec.fsdp_size, "cuda" if cuda else "cpu")
        self.sp = spec.settings.sp_size
        if world % self.sp:
            raise ValueError(
                f"actor_rollout_ref.actor.ulysses_sequence_parallel_size={self.sp} must divide the world size {world}"
            )
        self.sp_group = None
        if self.sp > 1:
            from dapo.distributed.ulysses import sp_groups

            self.sp_group, _ = sp_groups(world, self.sp)
        offload = bool(spec.param_offload or spec.optimizer_offload)
        if offload and not cuda:
            self.notes.append("param/optimizer offload is a no-op on CPU (parameters already live there)")
            offload = False
        elif spec.param_offload != spec.optimizer_offload and offload:
            self.notes.append(
                "FSDP2 offloads parameters, gradients and optimizer state together (CPUOffloadPolicy): "
                "param_offload and optimizer_offload both turn it on"
            )
        self.model = self._load(spec, offload)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=spec.lr, betas=tuple(spec.betas), weight_decay=spec.weight_decay
        )
        s = spec.settings
        self._scale = 1.0
        self.configure(s)
        self.ref_model = None
        if spec.use_ref:
            self.ref_model = self._load(spec, offload).eval().requires_grad_(False)
        self.init_s = time.perf_counter() - t0

    def _load(self, spec: WorkerSpec, offload: bool) -> torch.nn.Module:
        """The model, sharded on this rank's mesh, with this rank's rows read from the checkpoint."""
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(spec.model_path, trust_remote_code=spec.trust_remote_code)
        for k, v in (spec.override_config or {}).items():
            setattr(config, k, v)
        with parameters_on_meta():
            model = AutoModelForCausalLM.from_config(
                config, dtype=torch.float32, trust_remote_code=spec.trust_remote_code
            )
        if spec.enable_gradient_checkpointing:
            model.gradient_checkpointing_enable()
        # buffers are real (only parameters are on meta); to_empty would leave them uninitialised
        buffers = {(m, n): b for m in model.modules() for n, b in m._buffers.items() if b is not None}
        shard_model(model, self.mesh, offload)
        model.to_empty(device="cpu" if offload else self.device)  # offloaded shards live on the CPU
        for (module, name), b in buffers.items():
            module._buffers[name] = b.to(self.device)  # computed with, so on the compute device
        self.load_rows = load_rank_rows(model, spec.model_path)
        return model.train()

    def configure(self, settings: ActorSettings) -> None:
        """(Re)build the single-process actor on this rank's model and optimizer. It sees one
        mini-batch per call (the driver plans epochs and mini-batches); the packed forward is the
        SP one (``ulysses_response_logprobs``)."""
        counters = getattr(self, "actor", None)
        dyn = settings.actor.use_dynamic_bsz
        if dyn and self.world > 1:
            # every FSDP forward/backward is a collective: all ranks must run the same number of
            # micro-batches (verl all-reduces k with MAX); the actor takes no minimum count yet
            self.notes.append(
                "use_dynamic_bsz needs equal micro-batch counts on every rank; using ppo_micro_batch_size"
            )
            dyn = False
        # budgets only size dynamic micro-batches, which ranks do not use yet: an auto one keeps its start value
        actor = dataclasses.replace(
            settings.actor,
            ppo_epochs=1,
            shuffle=False,
            ppo_mini_batch_size=1 << 62,
            use_dynamic_bsz=dyn,
            ppo_max_token_len_per_gpu=settings.ppo_token_budget,
        )
        rollout = dataclasses.replace(
            settings.rollout,
            log_prob_use_dynamic_bsz=False,
            log_prob_max_token_len_per_gpu=settings.log_prob_token_budget,
        )
        model = dataclasses.replace(settings.model, use_remove_padding=False)
        self.settings = dataclasses.replace(settings, actor=actor, rollout=rollout, model=model)
        self.actor = Actor(self.model, self.optimizer, self.settings)
        if counters is not None:
            self.actor.nonfinite_steps = counters.nonfinite_steps
            self.actor.consecutive_nonfinite = counters.consecutive_nonfinite
        if not hasattr(self.actor, "_forward"):
            raise RuntimeError(
                "dapo.actor.dp_actor.Actor no longer has _forward: update the FSDP worker's hook"
            )
        base_forward = self.actor._forward
        self._packed = None
        if settings.model.use_remove_padding or self.sp > 1:
            # the model's own forward (FSDP's hooks gather the shards) with packed attention,
            # the sequence split over the SP group when there is one
            from dapo.distributed.ulysses import ulysses_response_logprobs

            self._packed = functools.partial(ulysses_response_logprobs, group=self.sp_group)
            base_forward = self._packed

        def scaled_forward(*args: Any, **kwargs: Any):
            # this rank's share of the global loss: see update_policy
            lp, ent = base_forward(*args, **kwargs)
            return grad_scale(lp, self._scale), grad_scale(ent, self._scale)

        self.actor._forward = scaled_forward

    # ------------------------------------------------------------------ info

    def info(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "world": self.world,
            "backend": dist.get_backend(),
            "mesh": tuple(self.mesh.shape),
            "sp": self.sp,
            "init_s": self.init_s,
            "init": "meta",
            "load_rows": self.load_rows,
            "notes": self.notes,
            "pid": os.getpid(),
        }

    # ------------------------------------------------------------------ log-probs

    def compute_log_prob(
        self,
        batch: Batch,
        temperature: float,
        micro_batch_size: int,
        calculate_entropy: bool = False,
        role: str = "actor",
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        model = self.model if role == "actor" else self.ref_model
        if model is None:
            raise ValueError("this worker group was built without a reference model (use_ref=False)")
        lp, ent = compute_log_prob(
            model,
            batch.to(self.device),
            temperature,
            micro_batch_size,
            calculate_entropy,
            forward=self._packed,
        )
        return lp.cpu(), (ent.cpu() if ent is not None else None)

    # ------------------------------------------------------------------ update

    def update_policy(self, pieces: list[Batch], lr: float | None = None) -> list[dict[str, float]]:
        """One optimizer step per mini-batch; ``pieces[j]`` is this rank's part of mini-batch j.
        Returns per mini-batch the local metrics plus ``_w_loss`` / ``_w_tok`` (this rank's share
        of the global normaliser and of the global token count)."""
        if lr is not None:
            for g in self.optimizer.param_groups:
                g["lr"] = float(lr)
        mode = self.settings.actor.loss_agg_mode
        local = torch.zeros((len(pieces), 2), dtype=torch.float64)
        for j, p in enumerate(pieces):
            m = p.tensors["response_mask"]
            local[j, 0] = float(m.sum())
            local[j, 1] = float((m.sum(-1) > 0).sum())
        glob = local.to(self.device, copy=True)  # nccl reduces device tensors only
        dist.all_reduce(glob, op=dist.ReduceOp.SUM)  # exact global counts per mini-batch
        glob = glob.cpu()
        glob /= self.sp  # the ranks of an SP group hold the same rows
        out = []
        for j, p in enumerate(pieces):
            tok_share = float(local[j, 0] / glob[j, 0]) if glob[j, 0] > 0 else 0.0
            seq_share = float(local[j, 1] / glob[j, 1]) if glob[j, 1] > 0 else 0.0
            if mode == "token-mean":
                share = tok_share
            elif mode == "token-sum":
                share = 1.0  # a plain sum: each rank's local sum is its whole part of the global one
            else:
                share = seq_share
            self._scale = self.world * share
            try:
                stats = self.actor.update_policy(p.to(self.device))
            finally:
                self._scale = 1.0
            stats["_w_loss"] = share
            stats["_w_tok"] = tok_share
            out.append(stats)
        return out

    @property
    def counters(self) -> dict[str, int]:
        return {
            "nonfinite_steps": self.actor.nonfinite_steps,
            "consecutive_nonfinite": self.actor.consecutive_nonfinite,
        }

    def get_counters(self) -> dict[str, int]:
        return self.counters

    def set_counters(self, nonfinite_steps: int, consecutive_nonfinite: int = 0) -> None:
        self.actor.nonfinite_steps = int(nonfinite_steps)
        self.actor.consecutive_nonfinite = int(consecutive_nonfinite)

    # ------------------------------------------------------------------ weights

    def weight_rounds(self, bucket_megabytes: float) -> int:
        """Plan this rank's pieces of the trained weights into rounds of at most
        ``bucket_megabytes / world`` bytes (``weight_sync.plan_rounds``); their number."""
        from dapo.distributed.weight_sync import bucket_bytes, plan_rounds

        self._rounds = plan_rounds(self.model, max(1, bucket_bytes(bucket_megabytes) // self.world))
        return len(self._rounds)

    def weight_round(self, i: int) -> list:
        """Round ``i`` of the planned pieces as ``(name, first row, rows)`` on the CPU ([] past the end)."""
        from dapo.distributed.weight_sync import round_pieces

        rounds = getattr(self, "_rounds", [])
        return round_pieces(self.model, rounds[i]) if i < len(rounds) else []

    def full_state_dict(self, trainable_only: bool = True) -> dict[str, torch.Tensor] | None:
        """The unsharded weights on rank 0 (CPU), None elsewhere; collective."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        sd = get_model_state_dict(
            self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
        if self.rank != 0:
            return None
        if trainable_only:
            names = {n for n, p in self.model.named_parameters() if p.requires_grad}
            sd = {k: v for k, v in sd.items() if k in names}
        return sd

    def save_sharded(self, path: str) -> None:
        save_sharded(self.model, self.optimizer, path)

    def load_sharded(self, path: str) -> None:
        load_sharded(self.model, self.optimizer, path)

    def close(self) -> None:
        if self._owns_group and dist.is_initialized():
            try:
                dist.barrier()
            finally:
                dist.destroy_process_group()


def checkpoint_files(path: str) -> dict[str, str]:
    """Parameter name -> the safetensors file holding it, for a Hugging Face model directory."""
    import json

    root = Path(path)
    index = root / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {k: str(root / v) for k, v in weight_map.items()}
    single = root / "model.safetensors"
    if not single.exists():
        from dapo.errors import DapoError

        raise DapoError(
            f"actor_rollout_ref.model.path={path}: FSDP ranks read their shards from safetensors files, "
            "and this directory has none; re-save the model with save_pretrained(safe_serialization=True)"
        )
    from safetensors import safe_open

    with safe_open(str(single), framework="pt") as f:
        return {k: str(single) for k in f.keys()}


def load_rank_rows(model: torch.nn.Module, path: str) -> int:
    """Copy this rank's rows of every parameter (``weight_sync.local_rows``: FSDP2 shards dim 0)
    from the checkpoint, reading only those rows (safetensors slices are memory-mapped reads).
    A tied output layer that the checkpoint omits takes its embedding's rows. Returns the rows read."""
    from safetensors import safe_open

    from dapo.distributed.weight_sync import local_rows

    files = checkpoint_files(path)
    tied = {n: n for n in files}
    inputs = getattr(model, "get_input_embeddings", lambda: None)()
    if inputs is not None and "lm_head.weight" not in files:
        for n, p in model.named_parameters():
            if p is inputs.weight:
                tied["lm_head.weight"] = n
    handles: dict[str, Any] = {}
    rows_read = 0
    try:
        with torch.no_grad():
            for name, p in model.named_parameters():
                src = tied.get(name)
                if src is None:
                    raise KeyError(f"{path}: the checkpoint has no tensor {name}")
                local, offset, _ = local_rows(p)
                file = files[src]
                if file not in handles:
                    handles[file] = safe_open(file, framework="pt").__enter__()
                if local.dim() == 0:
                    local.copy_(handles[file].get_tensor(src))
                    continue
                n = local.shape[0]
                if n:
                    local.copy_(handles[file].get_slice(src)[offset : offset + n])
                    rows_read += n
    finally:
        for h in handles.values():
            h.__exit__(None, None, None)
    return rows_read


def save_sharded(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, path: str) -> None:
    """Each rank writes its shards of model (and optimizer) state into ``path`` (DCP format)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    if optimizer is None:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=path)
        return
    msd, osd = get_state_dict(model, optimizer)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=path)


def load_sharded(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, path: str) -> None:
    """Load a DCP directory written at any world size into ``model`` (FSDP-sharded at this world
    size, or a plain module in a single process without torch.distributed). The directory is read
    by ``dapo.checkpoint.dcp``, which unpickles nothing but DCP's metadata types and plain data."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_state_dict,
        set_model_state_dict,
        set_state_dict,
    )

    from dapo.checkpoint import dcp as checkpoint_dcp

    if optimizer is None:
        state = {"model": get_model_state_dict(model)}
        checkpoint_dcp.load(state, path)
        set_model_state_dict(model, state["model"])
        return
    msd, osd = get_state_dict(model, optimizer)
    state = {"model": msd, "optim": osd}
    # partial: the loading side may carry param-group keys the saver did not have (e.g. the LR
    # scheduler's initial_lr on the driver); those keep their current values
    checkpoint_dcp.load(state, path, allow_partial_load=True)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


class worker_factory:  # noqa: N801 (a picklable callable used like a function)
    """``factory(rank, world, addr, port)`` for the worker groups."""

    def __init__(self, spec: WorkerSpec):
        self.spec = spec

    def __call__(self, rank: int, world: int, master_addr: str, master_port: int) -> FSDPActorWorker:
        return FSDPActorWorker(self.spec, rank, world, master_addr, master_port)
