"""Scale-out: worker groups (in-process, local processes, Ray), FSDP2 actor ranks, balanced
splits, weight sync to the rollout engine and sharded checkpoints. Nothing here imports Ray at
import time; ``dapo.distributed.ray_group`` does so lazily."""

from dapo.distributed.actor_group import DistributedActor, LocalActor, combine_metrics
from dapo.distributed.partition import (
    balance_metrics,
    balanced_partitions,
    make_divisible,
    minibatch_plan,
    pad_to_multiple,
    rank_partitions,
    trim_to_multiple,
)
from dapo.distributed.worker_group import InProcessWorkerGroup, ProcessWorkerGroup, WorkerGroup

__all__ = [
    "DistributedActor",
    "InProcessWorkerGroup",
    "LocalActor",
    "ProcessWorkerGroup",
    "WorkerGroup",
    "balance_metrics",
    "balanced_partitions",
    "combine_metrics",
    "make_divisible",
    "minibatch_plan",
    "pad_to_multiple",
    "rank_partitions",
    "trim_to_multiple",
]
