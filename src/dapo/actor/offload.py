"""The actor's side of the colocated handoff: what it gives up while vLLM generates on its device.

Before generation the actor frees its gradients (the next mini-batch zeroes them anyway) and
moves its optimizer state out of the optimizer into a host store (CPU memory, pinned on CUDA);
with ``actor.fsdp_config.param_offload`` its parameters go to the host too, once the weights
have been sent to vLLM. Before the update everything comes back where it was, bitwise.

On CPU the same steps run: the optimizer state leaves the optimizer for the store without a copy
(host and device are one memory), parameters stay where they are. :class:`MemoryLedger` records,
at each phase, which tensors the actor and the store hold, by kind and device, so the handoff
can be checked on a machine without a GPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch

PARAM, GRAD, OPTIM = "param", "grad", "optim"
ACTOR, HOST = "actor", "host"  # owners: reachable from the model and optimizer | the offload store


@dataclass(frozen=True)
class LedgerEntry:
    owner: str
    kind: str
    device: str
    count: int
    nbytes: int


@dataclass
class MemoryLedger:
    """Per phase, the latest snapshot of tensors by (owner, kind, device), and the steps of the
    latest switch in the order they ran."""

    snapshots: dict[str, list[LedgerEntry]] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)

    def record(self, phase: str, tensors: Iterable[tuple[str, str, torch.Tensor]]) -> None:
        sums: dict[tuple[str, str, str], list[int]] = {}
        for owner, kind, t in tensors:
            c = sums.setdefault((owner, kind, t.device.type), [0, 0])
            c[0] += 1
            c[1] += t.numel() * t.element_size()
        self.snapshots[phase] = [LedgerEntry(o, k, d, n, b) for (o, k, d), (n, b) in sorted(sums.items())]

    def event(self, name: str) -> None:
        self.events.append(name)

    def nbytes(
        self, phase: str, owner: str | None = None, kind: str | None = None, device: str | None = None
    ) -> int:
        """Bytes recorded at ``phase`` matching the given owner, kind and device type."""
        return sum(
            e.nbytes
            for e in self.snapshots.get(phase, [])
            if (owner is None or e.owner == owner)
            and (kind is None or e.kind == kind)
            and (device is None or e.device == device)
        )


class ActorOffload:
    """Frees and restores one in-process actor's memory around generation."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        offload_params: bool,
        ledger: MemoryLedger,
    ):
        self.model, self.optimizer = model, optimizer
        self.offload_params = bool(offload_params)
        self.ledger = ledger
        self.device = next(model.parameters()).device
        self.host = torch.device("cpu")
        # per parameter (the optimizer's own keys), its state while it is offloaded
        self._store: dict[torch.nn.Parameter, dict[str, object]] = {}
        self._devices: dict[tuple[int, str], torch.device] = {}

    def tensors(self) -> Iterator[tuple[str, str, torch.Tensor]]:
        """``(owner, kind, tensor)`` for every tensor the actor and the store hold now."""
        for p in self.model.parameters():
            yield ACTOR, PARAM, p.data
            if p.grad is not None:
                yield ACTOR, GRAD, p.grad
        for state in self.optimizer.state.values():
            for v in state.values():
                if torch.is_tensor(v):
                    yield ACTOR, OPTIM, v
        for state in self._store.values():
            for v in state.values():
                if torch.is_tensor(v):
                    yield HOST, OPTIM, v

    def release(self) -> None:
        """Free the gradients and move the optimizer state to the host store."""
        self.optimizer.zero_grad(set_to_none=True)
        self.model.zero_grad(set_to_none=True)
        pin = self.device.type == "cuda"
        for p in list(self.optimizer.state):
            state = self.optimizer.state.pop(p)
            moved: dict[str, object] = {}
            for k, v in state.items():
                if torch.is_tensor(v):
                    self._devices[(id(p), k)] = v.device
                    v = _to_host(v, pin)
                moved[k] = v
            self._store[p] = moved
        if pin:
            torch.cuda.synchronize()
        self.ledger.event("actor: gradients freed, optimizer state to host")

    def offload_parameters(self) -> None:
        """With ``param_offload``, the parameters to the host (after they were sent to vLLM)."""
        if not self.offload_params:
            return
        for p in self.model.parameters():
            if p.device != self.host:
                p.data = p.data.to(self.host, non_blocking=True)
        self.ledger.event("actor: parameters to host")

    def restore(self) -> None:
        """Parameters and optimizer state back on the actor's device, as they were."""
        for p in self.model.parameters():
            if p.device != self.device:
                p.data = p.data.to(self.device, non_blocking=True)
        for p, state in self._store.items():
            self.optimizer.state[p] = {
                k: v.to(self._devices.pop((id(p), k)), non_blocking=True) if torch.is_tensor(v) else v
                for k, v in state.items()
            }
        self._store.clear()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.ledger.event("actor: parameters and optimizer state restored")


def _to_host(t: torch.Tensor, pin: bool) -> torch.Tensor:
    if t.device.type == "cpu":
        return t
    out = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=pin)
    out.copy_(t, non_blocking=pin)
    return out
