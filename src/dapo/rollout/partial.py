"""Partial rollouts on the in-process vLLM engine: requests that survive a weight sync.

Each sample of a group is its own vLLM request (``n = 1``, its own seed with
``rollout.per_request_seed``), stepped one engine step at a time. At a weight sync (:meth:`PartialRollout.sync`) every request in flight is
aborted with the tokens it has so far, the new weights are loaded, the prefix cache is reset
(its blocks were computed with the old weights; a continuation must not read them), and each
unfinished sample is resubmitted as ``prompt + tokens so far`` with the rest of its token budget.
Every token records the policy version of the weights that produced it
(``token_versions``), so a group whose samples crossed a sync carries two or more versions and
the rollout correction (token-level IS against the per-token sampler log-probs) covers each
token with the policy that actually sampled it.

:class:`EngineWorker` runs a :class:`PartialRollout` on a thread of its own (the generation
thread): it steps the engine whenever requests are in flight, applies the newest published
weights between two engine steps (so generation never waits for the update, and the update
never waits for generation), and hands finished groups to whoever scores them through a queue.
"""

from __future__ import annotations

import queue
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from dapo.rollout.hf import RolloutOutput, SamplingParams, left_pad
from dapo.rollout.vllm_rollout import VllmRollout, sampling_fields


@dataclass
class Sample:
    """One trajectory in flight: its tokens, sampler log-probs and per-token policy versions."""

    prompt: list[int]
    tokens: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish: str | None = None  # vLLM's finish reason once done ("stop" | "length" | ...)
    rid: str | None = None  # the vLLM request currently generating it


@dataclass
class FinishedGroup:
    key: Any  # what the submitter gave the group
    prompt: list[int]
    samples: list[Sample]


class GroupsInFlight(ABC):
    """What :class:`EngineWorker` drives, in process (:class:`PartialRollout`) or on the server's
    streams (:class:`dapo.rollout.server_partial.ServerPartialRollout`). Both keep the groups in
    flight, submit, resume or restart suspended samples and sync the weights the same way; each
    engine has its own requests (``_add``: one per sample), steps, suspension and drops."""

    rollout: Any  # the engine's weights go through its ``load_weights``

    def __init__(self, params: SamplingParams, version: int, partial: bool) -> None:
        self.params, self.version, self.partial = params, int(version), partial
        self._groups: dict[Any, tuple[list[int], list[Sample]]] = {}
        self.resumed = 0  # samples resubmitted after a sync with tokens so far
        self.aborted_tokens = 0  # tokens of samples thrown away (partial=False, or dropped groups)

    @property
    def in_flight(self) -> int:
        """Groups submitted and not yet handed back."""
        return len(self._groups)

    def oldest_versions(self) -> dict[Any, int]:
        """Per group in flight, the oldest policy version among its tokens (the current version
        for a group with no token yet)."""
        # a snapshot: the generation thread pops finished groups while the trainer's thread
        # reads this (list() of a dict's items runs under the GIL in one go)
        return {
            k: min((s.versions[0] for s in samples if s.versions), default=self.version)
            for k, (_, samples) in list(self._groups.items())
        }

    def submit(self, key: Any, prompt: list[int]) -> None:
        """Start one group of ``params.n`` samples of ``prompt``, known as ``key``."""
        samples = [Sample(list(prompt)) for _ in range(int(self.params.n))]
        self._groups[key] = (list(prompt), samples)
        for s in samples:
            self._add(key, s)

    @property
    @abstractmethod
    def busy(self) -> bool:
        """Requests are running, or finished ones wait to be handed back by :meth:`step`."""

    @abstractmethod
    def _add(self, key: Any, s: Sample) -> None:
        """Send ``s`` (its prompt and tokens so far) as a request of group ``key``."""

    @abstractmethod
    def step(self) -> list[FinishedGroup]:
        """Advance the requests; the groups whose every sample has finished."""

    @abstractmethod
    def suspend(self) -> list[tuple[Any, Sample]]:
        """Stop every request, keeping its tokens; the unfinished samples, for :meth:`resume`."""

    @abstractmethod
    def drop(self, keys: list[Any]) -> None:
        """Abort these groups for good (their tokens counted in ``aborted_tokens``)."""

    @abstractmethod
    def close(self) -> None: ...

    def resume(self, held: list[tuple[Any, Sample]]) -> None:
        for key, s in held:
            if key in self._groups:
                if s.tokens:
                    self.resumed += 1
                self._add(key, s)

    def sync(self, weights: dict[str, torch.Tensor], version: int) -> None:
        """Load ``weights`` (policy version ``version``) with no request of ours running. With
        ``partial`` the samples in flight continue under them from their tokens so far; without,
        their groups start again from the prompt."""
        held = self.suspend()
        self.rollout.load_weights(weights)
        self.version = int(version)
        if not self.partial:
            self.restart(held)
        self.resume(held)

    def restart(self, held: list[tuple[Any, Sample]]) -> None:
        """Throw away the tokens of suspended samples (counted): they start again from the prompt."""
        for _, s in held:
            self.aborted_tokens += len(s.tokens)
            s.tokens, s.log_probs, s.versions = [], [], []


class PartialRollout(GroupsInFlight):
    """Groups of ``params.n`` samples stepped on a :class:`VllmRollout`'s engine, kept across
    weight syncs (``partial=True``) or aborted at them (``partial=False``)."""

    def __init__(self, rollout: VllmRollout, params: SamplingParams, version: int = 0, partial: bool = True):
        from vllm.sampling_params import RequestOutputKind

        super().__init__(params, version, partial)
        self.rollout = rollout
        self._kind = RequestOutputKind.DELTA
        self._engine = rollout.llm.llm_engine
        self._by_rid: dict[str, tuple[Any, Sample]] = {}
        self._next = 0

    @property
    def busy(self) -> bool:
        """Requests are running (what :class:`EngineWorker` steps for)."""
        return bool(self._by_rid)

    def _add(self, key: Any, s: Sample) -> None:
        from vllm import SamplingParams as VllmSamplingParams

        r = self.rollout
        (seed,) = r.request_seeds(1)  # None unless rollout.per_request_seed (slow on GPUs)
        left = int(self.params.response_length) - len(s.tokens)
        fields = sampling_fields(self.params, r.eos_token_ids, seed)
        fields["n"], fields["max_tokens"] = 1, left
        sp = VllmSamplingParams(**fields)
        sp.output_kind = self._kind
        rid = f"dapo-partial-{id(self):x}-{self._next}"
        self._next += 1
        (prompt,) = r.llm.renderer.render_cmpl([{"prompt_token_ids": s.prompt + s.tokens}])
        self._engine.add_request(rid, prompt, sp)
        s.rid = rid
        self._by_rid[rid] = (key, s)

    def step(self) -> list[FinishedGroup]:
        """One engine step; the groups whose every sample has finished, in submission order."""
        if not self._by_rid:
            return []
        done: list[Any] = []
        for out in self._engine.step():
            entry = self._by_rid.get(out.request_id)
            if entry is None:
                continue
            key, s = entry
            for c in out.outputs:
                new = list(c.token_ids)
                s.tokens.extend(new)
                s.log_probs.extend(float(st[t].logprob) for t, st in zip(new, c.logprobs or []))
                s.versions.extend([self.version] * len(new))
                if c.finish_reason is not None:
                    s.finish = c.finish_reason
            if s.finish is not None:
                del self._by_rid[out.request_id]
                s.rid = None
                if all(x.finish is not None for x in self._groups[key][1]):
                    done.append(key)
        return [FinishedGroup(k, *self._groups.pop(k)) for k in done]

    def suspend(self) -> list[tuple[Any, Sample]]:
        """Abort every request in flight, keeping its tokens: the engine is idle afterwards (the
        prefix-cache reset and a batched ``generate`` need that). :meth:`resume` restarts them."""
        held = list(self._by_rid.values())
        if self._by_rid:
            self._engine.abort_request(list(self._by_rid))
        self._by_rid.clear()
        for _, s in held:
            s.rid = None
        return held

    def drop(self, keys: list[Any]) -> None:
        """Abort these groups for good (their tokens counted in ``aborted_tokens``)."""
        keys = [k for k in keys if k in self._groups]
        rids = [s.rid for k in keys for s in self._groups[k][1] if s.rid is not None]
        if rids:
            self._engine.abort_request(rids)
        for k in keys:
            for s in self._groups.pop(k)[1]:
                self.aborted_tokens += len(s.tokens)
                if s.rid is not None:
                    self._by_rid.pop(s.rid, None)

    def close(self) -> None:
        self.drop(list(self._groups))


def pack_group(
    groups: list[FinishedGroup], response_length: int, prompt_width: int, pad_token_id: int
) -> RolloutOutput:
    """Finished groups as a RolloutOutput (prompt-major, ``n`` rows per group) and their
    per-token policy versions ``[rows, response_length]`` (-1 on padding)."""
    prompts, _ = left_pad([g.prompt for g in groups], prompt_width, pad_token_id)
    samples = [s for g in groups for s in g.samples]
    n = len(groups[0].samples) if groups else 1
    b = len(samples)
    responses = torch.full((b, response_length), pad_token_id, dtype=torch.long)
    logps = torch.zeros((b, response_length), dtype=torch.float32)
    mask = torch.zeros((b, response_length), dtype=torch.long)
    versions = torch.full((b, response_length), -1, dtype=torch.long)
    finished = torch.zeros(b, dtype=torch.bool)
    for i, s in enumerate(samples):
        k = min(len(s.tokens), response_length)
        if k:
            responses[i, :k] = torch.as_tensor(s.tokens[:k])
            logps[i, :k] = torch.as_tensor(s.log_probs[:k], dtype=torch.float32)
            mask[i, :k] = 1
            versions[i, :k] = torch.as_tensor(s.versions[:k])
        finished[i] = s.finish == "stop"
    out = RolloutOutput(
        prompts=prompts.repeat_interleave(n, dim=0),
        responses=responses,
        response_mask=mask,
        rollout_log_probs=logps * mask,
        truncated=~finished,
    )
    out.token_versions = versions  # type: ignore[attr-defined]
    return out


class EngineWorker:
    """The generation thread: steps a :class:`PartialRollout` while groups are in flight, takes
    the newest published weights between two steps, and puts finished groups on ``finished``.

    Everything that touches the engine happens on this thread; other threads post requests
    (:meth:`submit`, :meth:`publish`, :meth:`drop`) and :meth:`idle` blocks until the engine has
    no request running (validation generates on the same engine meanwhile)."""

    def __init__(self, engine: GroupsInFlight):
        self.engine = engine
        self.finished: queue.Queue[FinishedGroup | BaseException] = queue.Queue()
        self._cv = threading.Condition()
        self._submits: list[tuple[Any, list[int]]] = []
        self._drops: list[Any] = []
        self._weights: tuple[dict[str, torch.Tensor], int] | None = None
        self._idle = self._hold = False  # validation's pause, the staleness bound's pause
        self._idle_ack = False
        self._stop = False
        self.syncs = 0
        # OpenMP's thread count is per thread: vLLM's CPU attention checks that the thread that
        # steps the engine uses the count its metadata was built with (the creating thread's)
        self._torch_threads = torch.get_num_threads()
        self._thread = threading.Thread(target=self._run, name="dapo-generation", daemon=True)
        self._thread.start()

    def submit(self, key: Any, prompt: list[int]) -> None:
        with self._cv:
            self._submits.append((key, list(prompt)))
            self._cv.notify_all()

    def drop(self, keys: list[Any]) -> None:
        with self._cv:
            self._drops.extend(keys)
            self._cv.notify_all()

    def publish(self, weights: dict[str, torch.Tensor], version: int) -> None:
        """New weights for the engine; a newer publish before the thread took them replaces them."""
        with self._cv:
            self._weights = (weights, int(version))
            self._cv.notify_all()

    def oldest_versions(self) -> dict[Any, int]:
        with self._cv:
            return self.engine.oldest_versions()

    def hold(self, on: bool) -> None:
        """Pause decoding (the requests in flight keep their tokens) or go on; does not wait."""
        with self._cv:
            if self._hold != on:
                self._hold = on
                self._cv.notify_all()

    @property
    def _paused(self) -> bool:
        return self._idle or self._hold

    @contextmanager
    def idle(self) -> Iterator[None]:
        """Inside: the published weights are loaded and the engine runs no request of ours (they
        are suspended with their tokens and resumed afterwards)."""
        with self._cv:
            self._idle, self._idle_ack = True, False
            self._cv.notify_all()
            while not self._idle_ack and self._thread.is_alive():
                self._cv.wait(0.5)
        try:
            yield
        finally:
            with self._cv:
                self._idle = False
                self._cv.notify_all()

    def _run(self) -> None:
        torch.set_num_threads(self._torch_threads)
        eng = self.engine
        held: list | None = None
        try:
            while True:
                with self._cv:
                    while not self._stop and not self._work_locked(held is not None):
                        self._cv.wait(0.5)
                    if self._stop:
                        break
                    drops, self._drops = self._drops, []
                    submits, self._submits = ([], self._submits) if self._paused else (self._submits, [])
                    weights, self._weights = self._weights, None
                    paused = self._paused
                    if drops:
                        eng.drop(drops)
                    if weights is not None:
                        eng.sync(*weights)
                        self.syncs += 1
                        if held is not None and not eng.partial:  # held samples start over too
                            eng.restart(held)
                    if paused and held is None:
                        held = eng.suspend()
                    if paused:
                        self._idle_ack = True
                        self._cv.notify_all()
                    if not paused and held is not None:
                        eng.resume(held)
                        held = None
                    for key, prompt in submits:
                        eng.submit(key, prompt)
                    if paused:
                        continue
                for g in eng.step():  # outside the lock: posting stays cheap while a step runs
                    self.finished.put(g)
        except BaseException as e:  # the scoring side raises it on the trainer's thread
            self.finished.put(e)
        finally:
            eng.close()

    def _work_locked(self, holding: bool) -> bool:
        if self._drops or self._weights is not None:
            return True
        if self._paused:
            return not holding or (self._idle and not self._idle_ack)
        return holding or bool(self._submits) or self.engine.busy

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        self._thread.join(timeout=60)
