"""Fake prompt sources and rollouts for tests and the simulator (no model anywhere)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from dapo.batch import Batch


class ListSource:
    """Rows of a fixed list, shuffled per epoch (seeded), rolling over epochs forever.

    Mirrors the trainer's stateful sampler: ``take(k)`` never runs dry; ``epoch`` counts
    completed passes; ``state_dict``/``load_state_dict`` give an exact resume.
    """

    def __init__(self, rows: Sequence[dict], seed: int = 0, shuffle: bool = True) -> None:
        if not rows:
            raise ValueError("ListSource needs at least one row")
        self.rows = list(rows)
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.pos = 0
        self.taken = 0
        self._order = self._make_order()

    def __len__(self) -> int:
        return len(self.rows)

    def _make_order(self) -> list[int]:
        order = list(range(len(self.rows)))
        if self.shuffle:
            np.random.default_rng([self.seed, self.epoch]).shuffle(order)
        return order

    def take(self, k: int) -> list[dict]:
        out = []
        for _ in range(k):
            if self.pos >= len(self._order):
                self.epoch += 1
                self.pos = 0
                self._order = self._make_order()
            out.append(dict(self.rows[self._order[self.pos]]))
            self.pos += 1
        self.taken += len(out)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "pos": self.pos, "taken": self.taken}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.epoch, self.pos, self.taken = int(d["epoch"]), int(d["pos"]), int(d["taken"])
        self._order = self._make_order()


def prompt_rows(num: int) -> list[dict]:
    return [{"index": i, "data_source": "fake", "reward_model": {"ground_truth": str(i)}} for i in range(num)]


AccFn = Callable[[dict, int, np.random.Generator], Sequence[float]]


class FakeRollout:
    """``generate(rows) -> Batch`` with ``n`` responses per row, interleaved.

    ``acc_fn(row, n, rng)`` returns the n correctness values (0/1 or bools) of the row's responses.
    Responses get random lengths in [1, response_length], or ``length_fn(row, n, rng)``'s (each in
    that range) when it is given; ``score`` is +1/-1 (math_dapo), the
    token-level scores put score (+ an optional overlong penalty) at the last valid token.
    """

    def __init__(
        self,
        n: int,
        acc_fn: AccFn,
        *,
        response_length: int = 8,
        seed: int = 0,
        overlong_penalty: float = 0.0,
        length_fn: Callable[[dict, int, np.random.Generator], Sequence[int]] | None = None,
    ) -> None:
        self.n = n
        self.acc_fn = acc_fn
        self.response_length = response_length
        self.rng = np.random.default_rng(seed)
        self.overlong_penalty = overlong_penalty
        self.length_fn = length_fn
        self.calls = 0
        self.prompts_generated = 0

    def __call__(self, rows: list[dict]) -> Batch:
        self.calls += 1
        self.prompts_generated += len(rows)
        n, r = self.n, self.response_length
        total = len(rows) * n
        accs: list[float] = []
        for row in rows:
            vals = list(self.acc_fn(row, n, self.rng))
            if len(vals) != n:
                raise ValueError("acc_fn must return n values")
            accs.extend(float(v) for v in vals)
        if self.length_fn is None:
            lengths = self.rng.integers(1, r + 1, size=total)
        else:
            lengths = np.asarray([int(x) for row in rows for x in self.length_fn(row, n, self.rng)])
            if len(lengths) != total or lengths.min() < 1 or lengths.max() > r:
                raise ValueError(f"length_fn must return n lengths in [1, {r}]")
        mask = torch.zeros(total, r, dtype=torch.float32)
        scores = torch.zeros(total, r, dtype=torch.float32)
        for i, ln in enumerate(lengths.tolist()):
            mask[i, :ln] = 1.0
            pen = -self.overlong_penalty * (ln / r) if ln > r // 2 else 0.0
            scores[i, ln - 1] = (1.0 if accs[i] > 0 else -1.0) + pen
        logp = torch.as_tensor(-self.rng.random((total, r)), dtype=torch.float32) * mask
        index = [row["index"] for row in rows for _ in range(n)]
        return Batch(
            tensors={
                "responses": torch.arange(total * r).reshape(total, r) % 97,
                "response_mask": mask,
                "rollout_log_probs": logp,
                "token_level_scores": scores,
                "token_level_rewards": scores.clone(),
            },
            non_tensors={
                "index": index,
                "acc": [bool(a > 0) for a in accs],
                "score": [1.0 if a > 0 else -1.0 for a in accs],
            },
        )


def scripted(table: dict[int, Sequence[Sequence[float]]]) -> AccFn:
    """acc_fn that returns, for prompt ``index``, the next entry of ``table[index]`` (cycling)."""
    seen: dict[int, int] = {}

    def fn(row: dict, n: int, rng: np.random.Generator) -> Sequence[float]:
        i = row["index"]
        k = seen.get(i, 0)
        seen[i] = k + 1
        seq = table[i]
        return seq[k % len(seq)]

    return fn


def bernoulli(prob: Callable[[dict], float]) -> AccFn:
    """acc_fn drawing each response correct with probability ``prob(row)``."""

    def fn(row: dict, n: int, rng: np.random.Generator) -> Sequence[float]:
        return (rng.random(n) < prob(row)).astype(float).tolist()

    return fn


class FakeGroupStream:
    """A :class:`~dapo.sampling.stream.GroupStream` over a :class:`FakeRollout`, with an engine
    clock: every group in flight decodes one token per sample per tick, so a group finishes when
    its longest response is done, and an aborted group has generated ``min(length, ticks)``
    tokens per sample. ``wait`` advances the clock to the next finish."""

    def __init__(self, rollout: FakeRollout):
        self.rollout = rollout
        self.clock = 0
        self._flight: list[tuple[int, dict, Batch, list[int]]] = []  # (start, row, batch, lengths)
        self.submitted: list[dict] = []
        self.aborted_tokens = 0.0
        self.max_in_flight = 0

    @property
    def in_flight(self) -> int:
        return len(self._flight)

    def submit(self, rows: list[dict]) -> None:
        for row in rows:
            b = self.rollout([row])
            lengths = b.tensors["response_mask"].sum(-1).to(torch.int64).tolist()
            self._flight.append((self.clock, row, b, lengths))
            self.submitted.append(row)
        self.max_in_flight = max(self.max_in_flight, len(self._flight))

    def wait(self) -> tuple[list[dict], Batch]:
        if not self._flight:
            raise RuntimeError("wait() with nothing in flight")
        self.clock = min(start + max(lens) for start, _, _, lens in self._flight)
        done = [g for g in self._flight if g[0] + max(g[3]) <= self.clock]
        self._flight = [g for g in self._flight if g[0] + max(g[3]) > self.clock]
        return [g[1] for g in done], Batch.concat([g[2] for g in done])

    def abort(self) -> tuple[int, float]:
        groups = len(self._flight)
        tokens = float(sum(min(ln, self.clock - start) for start, _, _, lens in self._flight for ln in lens))
        self._flight = []
        self.aborted_tokens += tokens
        return groups, tokens


class FakeGroupEngine:
    """The generation side of :class:`~dapo.sampling.async_loop.AsyncSampler` without a model.

    The engine decodes on a clock of its own, whatever the trainer does: a group takes
    ``delay(prompt_ids)`` ticks once it is decoding (0: it finishes when submitted), and a thread
    ticks every ``tick_s`` seconds while a group is decoding and the engine is not held
    (``hold(True)`` pauses decoding: nothing finishes until it is released). The first half of a
    group's tokens is stamped with the policy version it started at, the rest with the version
    it finished at (:func:`fake_finish` packs it); :meth:`publish` sets the version.

    ``slots``: at most this many groups decode at once (None: all); the rest wait in a queue in
    submission order with no token yet, as requests wait in vLLM's scheduler, so
    :meth:`oldest_versions` does not list them and their versions start when they get a slot.
    :meth:`close` stops the clock."""

    def __init__(
        self, delay: Callable[[list[int]], int] = lambda p: 0, slots: int | None = None, tick_s: float = 0.002
    ) -> None:
        import queue
        import threading

        self.finished: Any = queue.Queue()
        self.delay, self.version, self.held, self.ever_held = delay, 0, False, False
        self.slots, self.tick_s = slots, float(tick_s)
        self._cv = threading.Condition()
        # key -> [prompt, start version (None while queued), ticks left]
        self._flight: dict[Any, list] = {}
        self.submitted: list[Any] = []
        self.dropped: list[Any] = []
        self._stop = False
        self._clock = threading.Thread(target=self._tick, name="fake-engine-clock", daemon=True)
        self._clock.start()

    def submit(self, key: Any, prompt: list[int]) -> None:
        with self._cv:
            self._flight[key] = [list(prompt), None, int(self.delay(list(prompt)))]
            self.submitted.append(key)
            self._release()

    def drop(self, keys: list[Any]) -> None:
        with self._cv:
            for k in keys:
                if self._flight.pop(k, None) is not None:
                    self.dropped.append(k)
            self._release()

    def oldest_versions(self) -> dict[Any, int]:
        with self._cv:
            return {k: f[1] for k, f in self._flight.items() if f[1] is not None}

    def queued(self) -> int:
        """Groups submitted and waiting for a slot."""
        with self._cv:
            return sum(1 for f in self._flight.values() if f[1] is None)

    def hold(self, on: bool) -> None:
        with self._cv:
            self.held = on
            self.ever_held |= on
            self._release()

    def publish(self, version: int) -> None:
        with self._cv:
            self.version = int(version)

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        self._clock.join(timeout=10)

    def _tick(self) -> None:
        import time

        with self._cv:
            while not self._stop:
                if self.held or not any(f[1] is not None for f in self._flight.values()):
                    self._cv.wait()  # idle until something is submitted or released
                    continue
                due = time.monotonic() + self.tick_s
                while not self._stop and (left := due - time.monotonic()) > 0:
                    self._cv.wait(left)
                if self._stop or self.held:
                    continue
                for f in self._flight.values():
                    if f[1] is not None:
                        f[2] -= 1
                self._release()

    def _release(self) -> None:
        running = sum(1 for f in self._flight.values() if f[1] is not None)
        for f in self._flight.values():  # the queue takes the free slots, oldest first
            if f[1] is None and (self.slots is None or running < self.slots):
                f[1] = self.version
                running += 1
        self._cv.notify_all()  # the clock: something may be decoding now
        if self.held:
            return
        done = [k for k, f in self._flight.items() if f[1] is not None and f[2] <= 0]
        for k in done:
            prompt, start, _ = self._flight.pop(k)
            self.finished.put(_FakeGroup(k, prompt, start, self.version))
        if done and any(f[1] is None for f in self._flight.values()):
            self._release()  # the finished groups freed slots for the queue


class _FakeGroup:
    def __init__(self, key: Any, prompt: list[int], start: int, end: int) -> None:
        self.key, self.prompt, self.start, self.end = key, prompt, start, end


def fake_finish(rollout: FakeRollout) -> Callable[[list[dict], list[Any]], Batch]:
    """``finish(rows, groups)`` for :class:`FakeGroupEngine`: ``rollout``'s scored batch with
    each group's ``token_versions`` (first half of each response at its start version)."""

    def finish(rows: list[dict], groups: list[Any]) -> Batch:
        b = rollout(rows)
        mask = b.tensors["response_mask"] > 0
        versions = torch.full(mask.shape, -1, dtype=torch.long)
        for i, g in enumerate(groups):
            for j in range(i * rollout.n, (i + 1) * rollout.n):
                ln = int(mask[j].sum())
                versions[j, :ln] = g.end
                versions[j, : (ln + 1) // 2] = g.start
        b.tensors["token_versions"] = versions
        return b

    return finish
