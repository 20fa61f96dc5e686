"""Token budgets that fit the machine: ``ppo_max_token_len_per_gpu=auto`` and
``log_prob_max_token_len_per_gpu=auto``.

A probe runs the real forward (and, for the update, backward) on two sets of the batch's longest
rows, measures each one's peak memory growth, and fits ``peak = fixed + per_token * tokens``. The
budget is the largest token count whose predicted peak stays within ``(1 - margin)`` of the
headroom:

* CUDA: ``torch.cuda.mem_get_info`` free memory plus what torch holds in cache, peaks from
  ``max_memory_allocated``;
* CPU: the smallest of the available RAM, ``trainer.auto_budget.memory_limit_gb`` minus the
  process's RSS, the address-space limit (RLIMIT_AS) minus its virtual size, and the cgroup's
  ``memory.max`` minus its usage; a probe's peak counts the tensor storages it creates (a
  dispatch mode), a step's peak samples RSS and virtual size.

Among the budgets that fit, the one with the highest measured tokens/s on a micro-batch of the
batch's rows is kept (budgets doubling from the longest row). An update step whose measured peak comes within half the margin of the headroom triggers a new
probe before the next one. Every choice is logged once, with its reason.
"""

from __future__ import annotations

import contextlib
import os
import resource
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from dapo.config.schema import AutoBudgetConfig

GiB = 2**30
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _statm() -> tuple[int, int]:
    """(virtual size, RSS) of this process in bytes."""
    try:
        vms, rss = Path("/proc/self/statm").read_text().split()[:2]
        return int(vms) * _PAGE, int(rss) * _PAGE
    except OSError:  # no procfs: the peak RSS is the best available figure
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return peak, peak


def _available_ram() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def _cgroup_headroom() -> int | None:
    root = Path("/sys/fs/cgroup")
    try:
        limit = (root / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return int(limit) - int((root / "memory.current").read_text().strip())
    except (OSError, ValueError):
        return None


def headroom(device: torch.device, memory_limit_gb: float | None = None) -> tuple[int, str]:
    """(bytes this process may still use, where that number comes from)."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return int(free + cached), "cuda free memory"
    vms, rss = _statm()
    options = []
    ram = _available_ram()
    if ram is not None:
        options.append((ram, "available RAM"))
    if memory_limit_gb:
        options.append((int(memory_limit_gb * GiB) - rss, f"memory_limit_gb={memory_limit_gb}"))
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        options.append((int(soft) - vms, "RLIMIT_AS"))
    cg = _cgroup_headroom()
    if cg is not None:
        options.append((cg, "cgroup memory.max"))
    if not options:
        raise RuntimeError(
            "auto token budgets: no memory figure on this system; set trainer.auto_budget.memory_limit_gb"
        )
    return min(options)


class _TensorPeak(TorchDispatchMode):
    """Bytes of the tensor storages created inside the block and still alive, and their peak
    (CPU has no allocator statistics; RSS misses memory the C allocator reuses without returning)."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        self.current = self.peak = 0

    def _free(self, key: int) -> None:
        self.current -= self.live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            st = t.untyped_storage()
            key, n = st.data_ptr(), st.nbytes()
            if n == 0 or key in self.live:
                continue
            self.live[key] = n
            self.current += n
            self.peak = max(self.peak, self.current)
            weakref.finalize(st, self._free, key)
        return out


@contextlib.contextmanager
def peak_growth(device: torch.device, exact: bool = True, interval_s: float = 0.02) -> Iterator[list[int]]:
    """Yields a one-element list that holds, after the block, its peak memory growth in bytes.
    CUDA: the allocator's peak. CPU: ``exact`` counts tensor storages (slow per op: for probes);
    otherwise the peak of RSS and virtual size, sampled every ``interval_s``."""
    out = [0]
    if device.type != "cuda" and exact:
        mode = _TensorPeak()
        with mode:
            yield out
        out[0] = mode.peak
        return
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device)
        yield out
        torch.cuda.synchronize(device)
        out[0] = max(0, torch.cuda.max_memory_allocated(device) - start)
        return
    vms0, rss0 = _statm()
    peak = [vms0, rss0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(interval_s):
            v, r = _statm()
            peak[0], peak[1] = max(peak[0], v), max(peak[1], r)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        yield out
    finally:
        done.set()
        t.join()
        v, r = _statm()
        out[0] = max(0, max(peak[0], v) - vms0, max(peak[1], r) - rss0)


def longest_rows(lengths: list[int], tokens: int) -> list[int]:
    """Indices of the longest rows whose lengths add up to at least ``tokens`` (all if fewer)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    out, total = [], 0
    for i in order:
        if total >= tokens:
            break
        out.append(i)
        total += lengths[i]
    return out


class AutoBudget:
    """Chooses and re-chooses one token budget (``key``) from probes; ``cfg`` is
    ``trainer.auto_budget`` (the schema's ``AutoBudgetConfig``: ``memory_limit_gb``, ``margin``)."""

    def __init__(
        self, key: str, cfg: AutoBudgetConfig, device: torch.device, log: Callable[[str], None] = print
    ):
        self.key, self.cfg, self.device, self.log = key, cfg, device, log
        self.value: int | None = None
        self.limit = 0
        self._logged: set[str] = set()

    def _say(self, msg: str) -> None:
        if msg not in self._logged:
            self._logged.add(msg)
            self.log(msg)

    def choose(
        self,
        lengths: list[int],
        probe: Callable[[list[int]], None],
        extra_fixed: int = 0,
        timed: Callable[[int], int] | None = None,
    ) -> int:
        """The budget for rows of ``lengths``: probe the longest rows at two sizes, fit, solve."""
        if self.value is not None:
            return self.value
        longest = max(lengths)
        small = longest_rows(lengths, 2 * longest)
        large = longest_rows(lengths, 4 * longest)
        if len(large) == len(small):  # too few rows for two sizes: one probe, no fixed part
            large = small
        points = []
        for rows in (small, large):
            with peak_growth(self.device) as peak:
                probe(rows)
            points.append((sum(lengths[i] for i in rows), peak[0]))
        (t1, p1), (t2, p2) = points
        per_token = max(1.0, (p2 - p1) / (t2 - t1)) if t2 > t1 else max(1.0, p2 / t2)
        fixed = max(0.0, p2 - per_token * t2) + extra_fixed
        room, source = headroom(self.device, self.cfg.memory_limit_gb)
        usable = room * (1 - self.cfg.margin) - fixed
        budget = int(usable // per_token)
        reason = (
            f"probe {t1} and {t2} tokens: {per_token / 1024:.1f} KiB/token + {fixed / 2**20:.0f} MiB; "
            f"headroom {room / 2**20:.0f} MiB ({source}), margin {self.cfg.margin:.0%}"
        )
        if budget < longest:
            self._say(
                f"auto: {self.key}={longest} (the longest row; the memory estimate allows only "
                f"{max(budget, 0)} tokens: expect to run out of memory). {reason}"
            )
            budget = longest
        else:
            fits = budget
            budget, timings = self._fastest(lengths, probe, longest, min(fits, sum(lengths)), timed)
            speeds = ", ".join(f"{c}: {v:.0f} tokens/s" for c, v in timings)
            self._say(
                f"auto: {self.key}={budget} (fastest measured of {speeds}; memory allows {fits}: {reason})"
            )
        self.value, self.limit = budget, room
        return budget

    @staticmethod
    def _fastest(
        lengths: list[int],
        probe: Callable[[list[int]], None],
        longest: int,
        cap: int,
        timed: Callable[[int], int] | None = None,
    ) -> tuple[int, list[tuple[int, float]]]:
        """Time budgets longest x 2^k up to ``cap``: ``timed(budget)`` runs real work with that
        budget and returns its tokens (else one micro-batch of consecutive rows of the batch);
        stop once one is 10% slower than the best. Larger budgets win on devices that need big
        matmuls; on CPU smaller ones often do (less padding, cache)."""
        candidates, c = [], longest
        while c < cap:
            candidates.append(c)
            c *= 2
        candidates.append(cap)
        timings: list[tuple[int, float]] = []
        best = (cap, 0.0)
        for c in candidates:
            if timed is not None:
                t0 = time.perf_counter()
                total = timed(c)
            else:
                rows, total = [], 0
                for i, n in enumerate(lengths):
                    if total + n > c:
                        break
                    rows.append(i)
                    total += n
                rows = rows or [0]
                total = sum(lengths[i] for i in rows)
                probe(rows)  # warm
                t0 = time.perf_counter()
                probe(rows)
            speed = total / max(time.perf_counter() - t0, 1e-9)
            timings.append((c, speed))
            if speed > best[1]:
                best = (c, speed)
            elif speed < 0.9 * best[1]:
                break
        return best[0], timings

    def observe(self, peak_bytes: int) -> None:
        """A step's measured peak growth: near the headroom, probe again before the next step."""
        if self.value is not None and peak_bytes > self.limit * (1 - self.cfg.margin / 2):
            self.log(
                f"auto: {self.key}={self.value} peaked at {peak_bytes / 2**20:.0f} MiB of "
                f"{self.limit / 2**20:.0f} MiB; probing again"
            )
            self.value = None
            self._logged.clear()
