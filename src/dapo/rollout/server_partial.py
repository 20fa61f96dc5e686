"""Partial rollouts on the vLLM server placement (``async_training.mode=separate_async``).

The server counterpart of :class:`dapo.rollout.partial.PartialRollout`, with the interface
:class:`dapo.rollout.partial.EngineWorker` drives. The engine runs in the server's process, so
generation goes on while the trainer updates; this side only reads. Each sample is its own
streaming request on ``/inference/v1/generate`` (``n = 1``, its own seed with
``rollout.per_request_seed``), and its tokens and sampled-token log-probs arrive chunk by chunk
(:mod:`dapo.rollout.server_stream`) on an asyncio event loop that belongs to the thread calling
:meth:`ServerPartialRollout.step` (the generation thread): ``step`` runs the loop for a moment,
and the streams write what arrived into their samples.

At a weight sync every request is aborted with ``/abort_requests`` (vLLM's RL endpoint; an empty
list aborts all, which is safe because the server is the run's own) and each stream is read to its
end, so the samples hold every token the server sent and the server runs nothing when the weights
arrive (the prefix-cache reset would fail otherwise); the weights then go over the placement's
weight stream, the prefix cache is dropped, and each unfinished sample is resubmitted as ``prompt +
tokens so far`` with the rest of its token budget. Every token records the policy version it was
generated under, as on the in-process engine.
"""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from typing import Any

from dapo.rollout.hf import SamplingParams
from dapo.rollout.partial import FinishedGroup, GroupsInFlight, Sample
from dapo.rollout.server_stream import sse_events
from dapo.rollout.vllm_rollout import sampling_fields
from dapo.rollout.vllm_server import ServerError, VllmServerRollout, connection_limit

GENERATE = "/inference/v1/generate"
ABORTED = "abort"  # vLLM's finish reason of an aborted request
# an aborted request ends within an engine step or two; a stream still open after this is a
# server that no longer answers, and the sync (which holds the generation thread) gives up
DRAIN_LIMIT_S = 300.0


class ServerPartialRollout(GroupsInFlight):
    """Groups of ``params.n`` samples streamed from a :class:`VllmServerRollout`, kept across
    weight syncs (``partial=True``) or started again at them (``partial=False``).

    Not thread-safe: one thread (the generation thread) calls everything but
    :meth:`oldest_versions` and :attr:`in_flight`, which only read."""

    def __init__(
        self,
        rollout: VllmServerRollout,
        params: SamplingParams,
        version: int = 0,
        partial: bool = True,
        poll_s: float = 0.05,
        abort_retry_s: float = 0.5,
    ):
        super().__init__(params, version, partial)
        self.rollout = rollout
        # how long one step() waits for a sample to finish: it bounds how late the worker sees a
        # publish or a drop while nothing finishes
        self.poll_s = poll_s
        # a request posted just before an abort may reach the engine after it: abort again
        self.abort_retry_s = abort_retry_s
        self._loop = asyncio.new_event_loop()
        self._gate = asyncio.Semaphore(connection_limit())
        self._streams: dict[str, tuple[Any, Sample, asyncio.Task]] = {}
        self._done: list[Any] = []  # groups whose every sample finished, not yet handed back
        self._news = asyncio.Event()  # a stream ended
        self._error: BaseException | None = None
        self._suspending = False
        self._next = 0

    @property
    def busy(self) -> bool:
        """Requests are running, or finished groups wait for :meth:`step` to hand them back."""
        return bool(self._streams) or bool(self._done)

    def _add(self, key: Any, s: Sample) -> None:
        r = self.rollout
        (seed,) = r.request_seeds(1)  # None unless rollout.per_request_seed
        left = int(self.params.response_length) - len(s.tokens)
        if left <= 0:  # aborted on its last token: nothing left to generate
            s.finish = "length"
            self._sample_done(key)
            return
        fields = sampling_fields(self.params, r.eos_token_ids, seed)
        fields["n"], fields["max_tokens"] = 1, left
        rid = f"dapo-partial-{id(self):x}-{self._next}"
        self._next += 1
        body = {
            "request_id": rid,
            "token_ids": s.prompt + s.tokens,
            "sampling_params": fields,
            "stream": True,
        }
        s.rid = rid
        self._streams[rid] = (key, s, self._loop.create_task(self._stream(rid, key, s, body)))

    async def _stream(self, rid: str, key: Any, s: Sample, body: dict[str, Any]) -> None:
        finish = None
        try:
            async with self._gate:
                if self._suspending:  # never sent: nothing to abort, nothing lost
                    return
                r = self.rollout
                r.in_flight += 1
                r.max_in_flight = max(r.max_in_flight, r.in_flight)
                try:
                    # closed in this task when it is cancelled (drop), not by the loop later
                    async with aclosing(sse_events(r.port, GENERATE, body)) as events:
                        async for event in events:
                            finish = self._take(s, event) or finish
                finally:
                    r.in_flight -= 1
            if finish == ABORTED or finish is None:
                if not self._suspending:
                    raise ServerError(
                        f"{GENERATE}: the vLLM server ended request {rid} unfinished ({finish})"
                    )
            else:
                s.finish = finish
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # step() raises it on the generation thread
            self._error = self._error or e
        finally:
            if self._streams.get(rid, (None, None, None))[1] is s:
                del self._streams[rid]
                s.rid = None
                if s.finish is not None:
                    self._sample_done(key)
            self._news.set()

    def _take(self, s: Sample, event: dict[str, Any]) -> str | None:
        """Add one event's tokens, log-probs and versions to ``s``; its finish reason, if any."""
        finish = None
        for c in event.get("choices") or []:
            new = [int(t) for t in c.get("token_ids") or []]
            content = (c.get("logprobs") or {}).get("content") or []
            if len(content) != len(new):
                raise ServerError(f"{GENERATE}: {len(new)} tokens came with {len(content)} log-probs")
            s.tokens.extend(new)
            s.log_probs.extend(float(x["logprob"]) for x in content)
            s.versions.extend([self.version] * len(new))
            finish = c.get("finish_reason") or finish
        return finish

    def _sample_done(self, key: Any) -> None:
        group = self._groups.get(key)
        if group is not None and key not in self._done and all(x.finish is not None for x in group[1]):
            self._done.append(key)

    def _raise_error(self) -> None:
        if self._error is not None:
            e, self._error = self._error, None
            raise e

    async def _wait(self) -> None:
        try:
            await asyncio.wait_for(self._news.wait(), self.poll_s)
        except TimeoutError:
            pass
        self._news.clear()

    def _check_alive(self) -> None:
        """A server that has exited answers nothing: say so rather than wait on its streams."""
        proc = self.rollout.proc
        if proc is None or proc.poll() is not None:
            code = None if proc is None else proc.returncode
            raise ServerError(
                f"the vLLM server exited (code {code}) with requests in flight; its log "
                f"({self.rollout.log_path}) ends:\n{self.rollout.log_tail()}"
            )

    def step(self) -> list[FinishedGroup]:
        """Read the streams for a moment; the groups whose every sample has finished."""
        if self._streams and not self._done:
            self._loop.run_until_complete(self._wait())
        self._raise_error()
        if self._streams:
            self._check_alive()
        done, self._done = self._done, []
        return [FinishedGroup(k, *self._groups.pop(k)) for k in done if k in self._groups]

    async def _drain(self, tasks: list[asyncio.Task]) -> None:
        tries = 0
        while tasks:
            # blocking for one short request: the server sends on, the sockets buffer it
            self.rollout.abort_all()
            _, pending = await asyncio.wait(tasks, timeout=self.abort_retry_s)
            tasks = list(pending)
            tries += 1
            if tasks and tries % 20 == 0:
                self._check_alive()
            if tasks and tries * self.abort_retry_s >= DRAIN_LIMIT_S:
                raise ServerError(
                    f"{len(tasks)} aborted requests still streaming from the vLLM server after "
                    f"{DRAIN_LIMIT_S:g} s; its log is {self.rollout.log_path}"
                )

    def suspend(self) -> list[tuple[Any, Sample]]:
        """Abort every request, keeping its tokens, and read each stream to its end: the server
        runs none of them afterwards. :meth:`resume` restarts those that had not finished."""
        running = list(self._streams.values())
        if running:
            self._suspending = True
            try:
                self._loop.run_until_complete(self._drain([t for _, _, t in running]))
            finally:
                self._suspending = False
        self._raise_error()
        return [(key, s) for key, s, _ in running if s.finish is None]

    def drop(self, keys: list[Any]) -> None:
        """Abort these groups for good (their tokens counted in ``aborted_tokens``): their
        connections close, which vLLM takes as an abort."""
        tasks = []
        for k in [k for k in keys if k in self._groups]:
            for s in self._groups.pop(k)[1]:
                self.aborted_tokens += len(s.tokens)
                if s.rid is not None:
                    tasks.append(self._streams.pop(s.rid)[2])
                    s.rid = None
            if k in self._done:
                self._done.remove(k)
        for t in tasks:
            t.cancel()
        if tasks:
            self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self.drop(list(self._groups))
        self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        self._loop.close()
