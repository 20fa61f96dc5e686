"""Ray actors as a worker group (the only module of dapo that imports Ray, lazily).

``init_local_ray`` starts a private single-machine Ray: loopback only, no dashboard, no auth
token under the home directory (``RAY_AUTH_MODE=disabled``), no usage reporting, a bounded
object store and its temporary files inside the run directory. On a cluster, call
``ray.init(address="auto")`` (or pass ``address``) instead and the same group spreads its
actors over the nodes; rank 0's node address and a free port there rendezvous
torch.distributed.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dapo.distributed.worker_group import WorkerFactory, WorkerGroup, free_port

# a unix socket path (sockets/plasma_store under the session dir) must stay under 108 bytes
_MAX_TEMP_DIR_LEN = 40


def ray_available() -> bool:
    """Whether ray is installed (without importing it: see ``init_local_ray``)."""
    import importlib.util

    return importlib.util.find_spec("ray") is not None


def _require_ray():
    try:
        import ray
    except ImportError as e:
        raise ImportError("Ray worker groups need ray: pip install 'dapo[scale]' (or pip install ray)") from e
    return ray


def local_ray_env() -> dict[str, str]:
    """Environment that keeps a local Ray private: set before ``ray.init``."""
    return {
        "RAY_AUTH_MODE": "disabled",  # otherwise an auth token is written under ~/.ray
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_DISABLE_DOCKER_CPU_WARNING": "1",
    }


def ray_temp_dir(run_dir: str | os.PathLike) -> Path:
    """``<run_dir>/ray``; when that path is too long for Ray's unix sockets, a short directory
    under the system temp dir linked from ``<run_dir>/ray``."""
    target = Path(run_dir).resolve() / "ray"
    if len(str(target)) <= _MAX_TEMP_DIR_LEN:
        target.mkdir(parents=True, exist_ok=True)
        return target
    if target.is_symlink() and target.resolve().is_dir():
        return target.resolve()
    short = Path(tempfile.mkdtemp(prefix="dapo-ray-"))
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        target.symlink_to(short, target_is_directory=True)
    return short


def init_local_ray(
    run_dir: str | os.PathLike,
    num_cpus: int,
    object_store_mb: int = 200,
    num_gpus: int | None = None,
) -> dict[str, Any]:
    """Start (or reuse) a single-machine Ray; returns {'temp_dir', 'startup_s'}."""
    imported_before = "ray" in sys.modules
    for k, v in local_ray_env().items():
        os.environ.setdefault(k, v)
    ray = _require_ray()
    if imported_before and os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") == "0":
        # Ray reads this switch when it is imported; set too late, it would turn 127.0.0.1 into
        # the machine's external address (services.resolve_ip_for_localhost)
        from ray._private import ray_constants

        ray_constants.ENABLE_RAY_CLUSTER = False
    if ray.is_initialized():
        return {"temp_dir": None, "startup_s": 0.0}
    temp = ray_temp_dir(run_dir)
    t0 = time.perf_counter()
    ray.init(
        address="local",
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        include_dashboard=False,
        _temp_dir=str(temp),
        _node_ip_address="127.0.0.1",
        object_store_memory=int(object_store_mb) * 2**20,
        log_to_driver=True,
        configure_logging=False,
    )
    return {"temp_dir": str(temp), "startup_s": time.perf_counter() - t0}


def shutdown_local_ray(started: dict[str, Any] | None = None) -> None:
    """Stop the local Ray; remove the short temp directory ``ray_temp_dir`` made for a long run
    directory path (a ``<run_dir>/ray`` directory itself is kept with the run)."""
    import shutil

    ray = _require_ray()
    ray.shutdown()
    temp = (started or {}).get("temp_dir")
    if temp and Path(temp).name.startswith("dapo-ray-") and Path(temp).parent == Path(tempfile.gettempdir()):
        shutil.rmtree(temp, ignore_errors=True)


class _RayHost:
    """Hosts one worker inside a Ray actor."""

    def __init__(self) -> None:
        self.worker: Any = None

    def node_addr_and_port(self) -> tuple[str, int]:
        import ray

        ip = ray.util.get_node_ip_address()
        return ip, free_port(ip if ip != "127.0.0.1" else "127.0.0.1")

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def start(self, factory: WorkerFactory, rank: int, world: int, addr: str, port: int) -> int:
        self.worker = factory(rank, world, addr, port)
        return os.getpid()

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.worker, method)(*args, **kwargs)

    def close(self) -> None:
        close = getattr(self.worker, "close", None)
        if close is not None:
            close()


class RayWorkerGroup(WorkerGroup):
    """``world_size`` Ray actors, each hosting ``factory(rank, world, addr, port)``.

    ``num_cpus`` / ``num_gpus`` per actor; ``local`` uses 127.0.0.1 for the rendezvous,
    otherwise rank 0's node address. ``nnodes`` > 1 places the ranks as verl's resource pool
    does: one placement group of ``nnodes`` bundles (one per node, ``world_size / nnodes``
    workers' resources each) with the STRICT_SPREAD strategy, so every bundle is on another node;
    ranks ``k * per_node .. (k + 1) * per_node - 1`` share bundle k (node-major rank order)."""

    def __init__(
        self,
        factory: WorkerFactory,
        world_size: int,
        num_cpus_per_worker: float = 1,
        num_gpus_per_worker: float = 0,
        local: bool = True,
        nnodes: int = 1,
        placement_timeout_s: float = 120.0,
    ):
        ray = _require_ray()
        if not ray.is_initialized():
            raise RuntimeError(
                "call init_local_ray(...) or ray.init(address=...) before building a RayWorkerGroup"
            )
        t0 = time.perf_counter()
        self.world_size = world_size
        self._pg = None
        host = ray.remote(_RayHost)
        opts = [{"num_cpus": num_cpus_per_worker, "num_gpus": num_gpus_per_worker} for _ in range(world_size)]
        if nnodes > 1:
            if world_size % nnodes:
                raise ValueError(f"{world_size} ranks do not divide over trainer.nnodes={nnodes}")
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            per_node = world_size // nnodes
            bundle = {"CPU": num_cpus_per_worker * per_node}
            if num_gpus_per_worker:
                bundle["GPU"] = num_gpus_per_worker * per_node
            self._pg = ray.util.placement_group(
                [dict(bundle) for _ in range(nnodes)], strategy="STRICT_SPREAD"
            )
            ready, _ = ray.wait([self._pg.ready()], timeout=placement_timeout_s)
            if not ready:
                ray.util.remove_placement_group(self._pg)
                raise RuntimeError(
                    f"ray: no {nnodes} distinct nodes with {bundle} free each within {placement_timeout_s:.0f} s "
                    f"(trainer.nnodes={nnodes}; cluster resources: {ray.cluster_resources()})"
                )
            for r, o in enumerate(opts):
                o["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                    self._pg, placement_group_bundle_index=r // per_node
                )
        self._actors = [host.options(**o).remote() for o in opts]
        self.node_ids = ray.get([a.node_id.remote() for a in self._actors])
        if local:
            addr, port = "127.0.0.1", free_port()
        else:
            addr, port = ray.get(self._actors[0].node_addr_and_port.remote())
        self.pids = ray.get(
            [a.start.remote(factory, r, world_size, addr, port) for r, a in enumerate(self._actors)]
        )
        self.startup_s = time.perf_counter() - t0

    def call(self, method: str, per_rank_args, **kwargs: Any) -> list[Any]:
        import ray

        if len(per_rank_args) != self.world_size:
            raise ValueError(f"{self.world_size} ranks, got {len(per_rank_args)} argument sets")
        return ray.get(
            [a.call.remote(method, *args, **kwargs) for a, args in zip(self._actors, per_rank_args)]
        )

    def shutdown(self) -> None:
        import ray

        actors, self._actors = getattr(self, "_actors", []), []
        if not actors:
            return
        try:
            ray.get([a.close.remote() for a in actors], timeout=60)
        except Exception:  # a dead actor cannot close; killing it below is enough
            pass
        for a in actors:
            ray.kill(a)
        if self._pg is not None:
            ray.util.remove_placement_group(self._pg)
            self._pg = None
