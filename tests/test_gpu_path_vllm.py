"""vLLM's side of the GPU weight path, on the CPU build: the streamed sync in both placements
(the trainer's peak memory measured, no file in /dev/shm for the server), every prompt of a
batch in flight at the server at once, and a prefix-cache reset that vLLM refuses being fatal.

One in-process engine and one server on an ~76 MB random model serve the module; the tied
embedding's in-place sync has an engine of its own on a ~38 MB model that is mostly that table."""

from __future__ import annotations

import os
import re
import threading
import time
import urllib.request

import pytest

from dapo.bench.weight_sync import PeakRss, save_random_model, trainable_bytes
from dapo.rollout.hf import SamplingParams
from dapo.rollout.vllm_rollout import VllmRollout, VllmSettings, WeightSyncError
from fixtures.vllm_helpers import EOS, PAD, PROMPTS, max_logprob_gap, settings, sync_tables_in_blocks
from fixtures.weight_helpers import moved

pytest.importorskip("vllm", reason="vLLM is installed by `make test` (make venv-vllm)")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_random_model(tmp_path_factory.mktemp("small_random"), "small")


@pytest.fixture(scope="module")
def colocated(model_dir):
    eng = VllmRollout(str(model_dir), [EOS], PAD, settings(), seed=1)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def server(model_dir):
    from dapo.rollout.vllm_server import VllmServerRollout

    eng = VllmServerRollout(str(model_dir), [EOS], PAD, settings(), seed=1)
    yield eng
    eng.shutdown()


def _sync_and_check(engine, model_dir) -> list[float]:
    """Two syncs of moved weights: each is seen by the next generation; the trainer's peak
    memory raise of each, as a share of the model's size."""
    ratios = []
    for seed in (1, 2):
        model = moved(model_dir, seed)
        assert max_logprob_gap(engine, model) > 1e-2  # the engine still has the old weights
        with PeakRss() as peak:
            engine.update_weights(model)
        ratios.append(peak.raised / trainable_bytes(model))
        assert max_logprob_gap(engine, model) < 1e-3
    return ratios


def test_gpu_path_colocated_streamed_sync_memory(colocated, model_dir):
    """In process, vLLM's loader reads the model's own tensors one at a time: no copy of the
    weights is made (one would raise the peak by at least the model's size). What a sync does
    add is vLLM's own layer-wise reload of the decoder layers on CPU (each layer rebuilt, then
    repacked for oneDNN), measured here between 0.001x and 0.26x of the model depending on what
    the allocator had free; on a GPU that memory is the device's, not the trainer's."""
    ratios = _sync_and_check(colocated, model_dir)
    assert max(ratios) < 0.5, ratios


def test_gpu_path_colocated_failed_prefix_reset_is_fatal(colocated, model_dir):
    """With requests running (a stream's groups in flight), vLLM refuses to drop its prefix
    cache: the sync raises the run-stopping error that says the checkpoint is intact."""
    stream = colocated.stream(SamplingParams(n=2, temperature=1.0, response_length=200))
    try:
        stream.submit(PROMPTS[:2])
        colocated.llm.llm_engine.step()  # scheduled and prefilled: their blocks are held
        with pytest.raises(
            WeightSyncError, match=r"reset_prefix_cache\(\) returned False.*checkpoint is intact"
        ):
            colocated.update_weights(moved(model_dir, 3))
    finally:
        stream.close()


# after the tests that use the module's in-process engine: shutting a second in-process engine
# down tears down vLLM's process-wide parallel state, which the first one still needs
def test_gpu_path_colocated_sync_writes_tied_embedding_in_place(tmp_path_factory):
    """A model that is 88% its tied embedding: vLLM's own reload rebuilt the table beside the
    old one and packed it for oneDNN beside the old pack, for the embedding and again for the
    tied output layer (1.75x-1.84x the model, measured); written in place with the old packs
    released first, a sync raises the trainer's peak by less than a quarter of the model, and
    the input embedding and the tied output layer both compute with the new weights (the
    log-probs of the moved model; a stale output-layer pack is off by more than 1)."""
    model_dir = save_random_model(tmp_path_factory.mktemp("tied_table"), "tied-table")
    engine = VllmRollout(str(model_dir), [EOS], PAD, settings(), seed=1)
    try:
        ratios = _sync_and_check(engine, model_dir)
    finally:
        engine.shutdown()
    assert max(ratios) < 0.25, ratios


def _server_requests(server) -> float:
    """Requests the server holds now (running + waiting), from its Prometheus metrics."""
    with urllib.request.urlopen(server.url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(("vllm:num_requests_running{", "vllm:num_requests_waiting{")):
            total += float(line.rsplit(" ", 1)[1])
    return total


class _Watch:
    """Polls the server's request count in a thread; ``peak`` is the most it saw."""

    def __init__(self, server):
        self.server, self.peak, self._stop = server, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _server_requests(self.server))
            time.sleep(0.02)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak


def test_gpu_path_server_all_prompts_in_flight(server):
    """100 prompts are 100 requests at the server at once (the old client kept 32 open)."""
    prompts = [[5 + (3 * i + j) % 400 for j in range(6)] for i in range(100)]
    watch = _Watch(server)
    try:
        out = server.generate(prompts, SamplingParams(n=1, temperature=1.0, response_length=48))
    finally:
        peak = watch.stop()
    assert out.responses.shape == (100, 48)
    assert server.max_in_flight == 100
    assert peak == 100


def test_gpu_path_server_streamed_sync_no_shm_file(server, model_dir):
    """The server's workers pull the weights over a socket: they arrive (the log-probs match the
    new model), no file appears in /dev/shm, and the trainer's peak barely moves."""
    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    ratios = _sync_and_check(server, model_dir)
    shm_after = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    assert not [n for n in shm_after - shm_before if "dapo" in n]
    assert max(ratios) < 0.25, ratios


def test_gpu_path_server_failed_prefix_reset_is_fatal(server, model_dir):
    """A sync while a request runs at the server: the server reports the reset as failed, and
    the sync raises the run-stopping error. Whether the request is still running when the reset
    comes is a race on a loaded machine (a random model may end early), so a sync that found the
    server idle (and succeeded) is tried again, at most five times."""
    raised = None
    for attempt in range(5):
        done = threading.Event()

        def long_generation(done: threading.Event = done) -> None:
            try:
                server.generate([PROMPTS[0]] * 4, SamplingParams(n=4, temperature=1.0, response_length=400))
            finally:
                done.set()

        thread = threading.Thread(target=long_generation, daemon=True)
        thread.start()
        deadline = time.monotonic() + 300  # a hang guard, not a measurement
        while _server_requests(server) < 1 and not done.is_set():
            assert time.monotonic() < deadline, "the request never reached the server"
            time.sleep(0.02)
        try:
            if not done.is_set():
                server.update_weights(moved(model_dir, 4 + attempt))
        except WeightSyncError as e:
            raised = e
        thread.join(timeout=300)
        if raised is not None:
            break
    assert raised is not None, "no sync overlapped a running request in five tries"
    assert re.search(r"reset_prefix_cache\(\) returned \{'success': False\}", str(raised)), str(raised)


def test_gpu_path_tensor_parallel_two_workers_pull_the_stream(model_dir):
    """tensor_model_parallel_size=2 in process (the CPU build runs it; `dapo validate` still
    holds CPU runs to 1): the two workers live in their own processes, each pulls the socket
    stream and keeps its slice through vLLM's loaders (of the tables sent in blocks of rows, its
    own rows); the new weights are seen (log-probs of the moved model), and the trainer makes no
    copy of them."""
    settings = VllmSettings.for_model(
        "float32", 512, max_num_seqs=16, max_num_batched_tokens=512, tensor_model_parallel_size=2
    )
    eng = VllmRollout(str(model_dir), [EOS], PAD, settings, seed=1)
    try:
        ratios = _sync_and_check(eng, model_dir)
        # the tables in blocks of rows that straddle the two workers' halves of the vocabulary:
        # each keeps its own rows
        sync_tables_in_blocks(eng, model_dir, 5)
    finally:
        eng.shutdown()
    assert max(ratios) < 0.25, ratios


def test_gpu_path_server_sleeps_level_2_in_the_handoff(server, model_dir):
    """A server on the trainer's devices takes turns with the actor as the in-process engine
    does: it sleeps at level 2 (its weights discarded, so the sync must send them again), then
    wakes its weights, takes the new ones and wakes its KV cache; it generates from them."""
    from dapo.actor.offload import MemoryLedger
    from dapo.rollout.handoff import Handoff
    from dapo.rollout.runner import weights_version

    model = moved(model_dir, 4)
    ledger = MemoryLedger()
    handoff = Handoff(server, None, "cpu", ledger)
    server.update_weights(model)
    server.synced_version = weights_version(model)
    handoff.phase = "rollout"
    handoff.to_trainer()
    assert ledger.events == ["vllm: sleep level 2"] and server.synced_version is None
    assert not server.sleep()  # asleep already

    def sync() -> bool:
        if server.synced_version == weights_version(model):
            return False
        server.update_weights(model)
        server.synced_version = weights_version(model)
        return True

    handoff.to_rollout(sync)
    assert ledger.events == [
        "vllm: sleep level 2",
        "vllm: wake weights",
        "weights sent",
        "vllm: wake kv_cache",
    ]
    assert max_logprob_gap(server, model) < 1e-3
