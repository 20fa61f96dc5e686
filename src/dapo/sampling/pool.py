"""The pool of kept groups carried over between training steps (``carry_over``).

A step's batch is taken oldest first from the carried groups and then the step's fresh ones; what
is left stays for later steps, or is dropped without ``carry_over``. A carried group is dropped
once it is more than ``max_staleness`` policy updates old, or when newer groups of its prompt say
its next group would have no spread (the skip policy's ``solved_since``), so the step generates a
replacement instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from dapo.batch import Batch
from dapo.sampling.batch_state import batch_from_state, batch_to_state
from dapo.sampling.step_stats import StepStats


@dataclass
class Group:
    batch: Batch  # the group's n trajectories
    version: int  # policy version when generated
    index: int | None  # prompt index


def with_staleness(b: Batch, version: int) -> Batch:
    """Tag each row with the policy updates between its generation and training at ``version``."""
    b["staleness"] = np.asarray([version - int(v) for v in b.non_tensors["gen_version"]], dtype=object)
    return b


class GroupPool:
    def __init__(self, groups: list[Group] | None = None) -> None:
        self.groups: list[Group] = list(groups or [])

    def __len__(self) -> int:
        return len(self.groups)

    def __iter__(self) -> Iterator[Group]:
        return iter(self.groups)

    def drop_stale(self, version: int, max_staleness: int, st: StepStats) -> None:
        """Groups older than ``max_staleness`` policy updates are never trained on."""
        live = []
        for g in self.groups:
            if version - g.version > max_staleness:
                st.stale_dropped += 1
            else:
                live.append(g)
        self.groups = live

    def recheck(self, solved: Callable[[Group], bool], st: StepStats) -> None:
        """Drop the carried groups whose prompt this step's groups found solved (or unsolvable).
        Run after every round or streamed group, so the groups still needed are generated in
        the same step rather than the batch coming up short."""
        rechecked = [g for g in self.groups if not solved(g)]
        st.recheck_dropped += len(self.groups) - len(rechecked)
        self.groups = rechecked

    def take(
        self,
        fresh: list[Group],
        size: int,
        *,
        exhausted: str | None,
        carry_over: bool,
        solved: Callable[[Group], bool],
        st: StepStats,
    ) -> Batch | None:
        """The step's batch: up to ``size`` groups, the carried ones (re-checked) before the fresh
        ones, so carried groups are used before they expire; None when the step is skipped
        (``exhausted`` is ``"skip"``, or ``"train"`` with no group at all). Called with
        ``exhausted=None`` once the pool and ``fresh`` hold ``size`` groups (the re-check here may
        still leave fewer). The rest stays in the pool with ``carry_over``, else it is dropped."""
        self.recheck(solved, st)
        carried = len(self.groups)
        groups = self.groups + fresh
        if exhausted == "skip" or (exhausted == "train" and not groups):
            if carry_over:
                self.groups = groups  # nothing is lost; staleness still bounds their use
            else:
                st.surplus_dropped += len(groups)
                self.groups = []
            return None
        take, rest = groups[:size], groups[size:]
        if carry_over:
            self.groups = rest
        else:
            st.surplus_dropped += len(rest)
            self.groups = []
        st.carried_in = min(carried, len(take))
        return Batch.concat([g.batch for g in take])

    def state_dict(self) -> list[dict[str, Any]]:
        return [
            {"version": g.version, "index": g.index, "batch": batch_to_state(g.batch)} for g in self.groups
        ]

    @staticmethod
    def from_state_dict(d: list[dict[str, Any]]) -> GroupPool:
        return GroupPool([Group(batch_from_state(g["batch"]), int(g["version"]), g["index"]) for g in d])
