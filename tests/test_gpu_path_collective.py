"""The weight collective (``rollout.weight_transfer=collective``): the trainer broadcasts its
tensors in a torch.distributed group to the vLLM workers (gloo here; nccl on CUDA is not run).

Without vLLM: two worker processes get whole tensors and blocks of rows of several dtypes bit
for bit and in order; a worker whose loader fails midway is named by the trainer with its error,
and the other worker still gets everything (the failed one kept up with the broadcasts); a
header whose dtype is not a weight's is refused. With the real vLLM CPU build: a server and a
tensor-parallel in-process engine take moved weights (tables in blocks of rows included) and
then sample with the moved model's log-probs. The config's per-device default and refusals."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from dapo.checkpoint.rows import RowBlock
from dapo.rollout.vllm_rollout import VllmSettings
from dapo.rollout.vllm_weight_collective import CollectiveSender
from dapo.rollout.vllm_weight_stream import read_header
from fixtures.collective_helpers import run_worker

R = "actor_rollout_ref.rollout"
TIMEOUT_S = 120.0  # a broken sync fails the test instead of hanging it for the default 600 s


def _stream() -> list[tuple[str, torch.Tensor | RowBlock]]:
    g = torch.Generator().manual_seed(0)
    table = torch.randn(10, 3, generator=g).to(torch.bfloat16)
    return [
        ("a.weight", torch.randn(4, 5, generator=g)),
        ("b.weight", torch.randn(7, generator=g).to(torch.bfloat16)),
        ("table", RowBlock(0, table[:6], (10, 3))),
        ("c.count", torch.randint(-(2**62), 2**62, (3, 2), generator=g)),
        ("table", RowBlock(6, table[6:], (10, 3))),
        ("empty", torch.zeros(0, 4)),
        ("d.weight", torch.randn(3, 3, generator=g)[:, 1]),  # not contiguous
    ]


def _sync(tmp_path, weights, fail_after=(None, None), die=(False, False), die_after=(None, None)):
    """One sync to two worker processes; the sender's error and each worker's record (None for
    one that dies: ``die`` after loading, ``die_after`` that many tensors)."""
    ctx = mp.get_context("spawn")
    sender = CollectiveSender(expected=2, timeout_s=TIMEOUT_S)
    outs = [str(tmp_path / f"w{r}.pt") for r in (0, 1)]
    procs = [
        ctx.Process(
            target=run_worker, args=(r, sender.address(), outs[r], fail_after[r], die[r], die_after[r])
        )
        for r in (0, 1)
    ]
    for p in procs:
        p.start()
    thread = sender.send_in_thread(weights)
    for p in procs:
        p.join(TIMEOUT_S + 60)
    sender.close()
    thread.join(TIMEOUT_S + 60)
    dead = [d or n is not None for d, n in zip(die, die_after, strict=True)]
    assert not thread.is_alive() and [p.exitcode for p in procs] == [3 if d else 0 for d in dead]
    return sender, [None if d else torch.load(o, weights_only=True) for o, d in zip(outs, dead, strict=True)]


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(a.view(torch.uint8), b.contiguous().view(torch.uint8))
    )


def _check_all(got, sent) -> None:
    assert [g[0] for g in got] == [name for name, _ in sent]
    for (name, start, shape, t), (_, want) in zip(got, sent, strict=True):
        if isinstance(want, RowBlock):
            assert (start, shape) == (want.start, tuple(want.shape)), name
            want = want.rows
        else:
            assert start is None and shape == tuple(want.shape), name
        assert _same_bits(t, want.contiguous()), name


def test_gpu_path_collective_two_workers_get_every_tensor_bit_for_bit(tmp_path):
    sent = _stream()
    sender, records = _sync(tmp_path, iter(sent))
    assert sender.error is None
    for rec in records:
        assert rec["error"] == ""
        _check_all(rec["got"], sent)
    assert sender.nbytes == sum(
        (t.rows if isinstance(t, RowBlock) else t).numel()
        * (t.rows if isinstance(t, RowBlock) else t).itemsize
        for _, t in sent
    )


def test_gpu_path_collective_failed_worker_is_named_and_nothing_hangs(tmp_path):
    """Worker 1's loader raises after its 2nd tensor: it keeps receiving to the end, so worker
    0 still gets every tensor, and the trainer raises with worker 1's own error text."""
    sent = _stream()
    sender, records = _sync(tmp_path, iter(sent), fail_after=(None, 2))
    assert isinstance(sender.error, RuntimeError)
    assert "vLLM worker 1 failed" in str(sender.error)
    assert "worker 1's loader broke at table" in str(sender.error)
    assert records[0]["error"] == ""
    _check_all(records[0]["got"], sent)
    assert "loader broke" in records[1]["error"] and len(records[1]["got"]) == 2


def test_gpu_path_collective_refuses_a_dtype_that_is_not_a_weights(tmp_path):
    """A complex tensor's header names a dtype outside the weights' list: both workers refuse
    it (and stay in step: the sync ends, the trainer reports it)."""
    sent = [("a.weight", torch.ones(2)), ("z", torch.zeros(3, dtype=torch.complex64)), ("b", torch.ones(1))]
    sender, records = _sync(tmp_path, iter(sent))
    assert "has dtype 'complex64', not a weight's" in str(sender.error)
    for rec in records:
        assert "not a weight's" in rec["error"] and [g[0] for g in rec["got"]] == ["a.weight"]


def test_gpu_path_collective_refuses_a_frame_larger_than_the_workers_largest_tensor(tmp_path):
    """A header claiming more elements than the worker's largest tensor (64 for the stand-in) is
    refused before anything is allocated for it; its bytes are drained and the sync goes on to
    its end, so the next tensor still arrives in step (and is dropped: the loader has failed)."""
    sent = [("a.weight", torch.ones(2)), ("huge", torch.ones(65)), ("b", torch.ones(1))]
    sender, records = _sync(tmp_path, iter(sent))
    assert "huge has shape [65], more elements than the largest tensor this worker takes (64)" in str(
        sender.error
    )
    for rec in records:
        assert "more elements than the largest" in rec["error"] and [g[0] for g in rec["got"]] == ["a.weight"]


def test_gpu_path_collective_trainer_failure_stops_the_workers(tmp_path):
    """The trainer's own iterator fails after two tensors (a rank's piece did not come): the
    workers are told, stop with that error, and the trainer raises its own."""

    def weights():
        yield from _stream()[:2]
        raise OSError("rank 3 sent nothing")

    sender, records = _sync(tmp_path, weights())
    assert isinstance(sender.error, OSError) and str(sender.error) == "rank 3 sent nothing"
    for rec in records:
        assert "the trainer stopped the weight stream: OSError: rank 3 sent nothing" in rec["error"]
        assert len(rec["got"]) == 2


def test_gpu_path_collective_worker_that_dies_before_acknowledging_is_named(tmp_path):
    """Worker 1 takes every tensor and dies before it acknowledges: once the RPC has returned
    (close()), the trainer names it at once rather than waiting out the timeout for its answer."""
    sent = _stream()
    sender, records = _sync(tmp_path, iter(sent), die=(False, True))
    assert isinstance(sender.error, RuntimeError)
    assert "vLLM worker 1 never acknowledged the weights" in str(sender.error)
    assert records[0]["error"] == ""
    _check_all(records[0]["got"], sent)


def test_gpu_path_collective_worker_that_dies_midway_stops_the_others(tmp_path):
    """Worker 1 dies after its 2nd tensor: the trainer's broadcast fails and it lets its group
    go at once (not when its error, whose traceback holds the group, is collected), so worker 0
    hears the group close instead of waiting out the timeout for the next broadcast."""
    sender, records = _sync(tmp_path, iter(_stream()), die_after=(None, 2))
    assert "a broadcast failed" in str(sender.error)
    assert len(records[0]["got"]) in (2, 3)  # the 3rd may have gone before the broadcast failed
    assert records[0]["error"].startswith("RuntimeError: ") and "Timed out" not in records[0]["error"]


@pytest.mark.parametrize(
    "bad, says",
    [
        (("x" * 2**20, torch.ones(1)), "ValueError: weight collective: a header of"),
        (("x", [1.0, 2.0]), "AttributeError: 'list' object has no attribute 'detach'"),
    ],
    ids=["header-too-large", "not-a-tensor"],
)
def test_gpu_path_collective_frame_the_trainer_cannot_send_stops_the_workers(tmp_path, bad, says):
    """A frame that fails on the trainer before any of it is broadcast (its header too large, or
    not a tensor) ends the stream with the trainer's error: the workers stop at once instead of
    waiting out the group's timeout for a header that never comes."""
    sender, records = _sync(tmp_path, iter([*_stream()[:2], bad]))
    assert says in f"{type(sender.error).__name__}: {sender.error}"
    for rec in records:
        assert f"the trainer stopped the weight stream: {says}" in rec["error"]
        assert len(rec["got"]) == 2


@pytest.mark.parametrize(
    "header, says",
    [
        ({"name": "x", "dtype": "complex64", "shape": [2]}, "not a weight's"),
        ({"name": "x", "dtype": "float32", "shape": [-1]}, "has shape"),
        ({"name": "x", "dtype": "float32", "shape": [True]}, "has shape"),
        ({"name": "x", "dtype": "float32", "shape": [2], "start": -1, "whole": [4]}, "from row -1"),
        ({"name": "x", "dtype": "float32", "shape": [2], "start": 0, "whole": "[4]"}, "has shape"),
        ({"dtype": "float32", "shape": [2]}, "without a name"),
    ],
)
def test_gpu_path_collective_header_checks(header, says):
    with pytest.raises(ValueError, match=says):
        read_header(header)


@pytest.fixture
def senders(monkeypatch):
    """The senders the syncs use (the trainer's side of each)."""
    import dapo.rollout.vllm_weight_transfer as transfer

    made, make = [], transfer.make_sender

    def spy(*args, **kwargs):
        made.append(make(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(transfer, "make_sender", spy)
    return made


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    pytest.importorskip("vllm", reason="vLLM is installed by `make test` (make venv-vllm)")
    from dapo.bench.weight_sync import save_random_model

    return save_random_model(tmp_path_factory.mktemp("small_random"), "small")


def _two_syncs(engine, model_dir, senders) -> None:
    """Whole tensors, then the tables in blocks of rows: each sync broadcast (gloo) the model's
    bytes, and the engine then samples with the moved model's log-probs."""
    from dapo.bench.weight_sync import trainable_bytes
    from fixtures.vllm_helpers import max_logprob_gap, sync_tables_in_blocks
    from fixtures.weight_helpers import moved

    model = moved(model_dir, 1)
    assert max_logprob_gap(engine, model) > 1e-2
    engine.update_weights(model)
    assert max_logprob_gap(engine, model) < 1e-3
    sync_tables_in_blocks(engine, model_dir, 2)
    assert [type(s).__name__ for s in senders] == ["CollectiveSender"] * 2
    assert [s.backend for s in senders] == ["gloo"] * 2
    assert senders[0].nbytes == senders[1].nbytes >= trainable_bytes(model)


def test_gpu_path_collective_server_takes_broadcast_weights(model_dir, senders):
    """The server placement with weight_transfer=collective: its worker joins the trainer's
    group and loads what is broadcast, tables sent in blocks of rows included."""
    from dapo.rollout.vllm_server import VllmServerRollout
    from fixtures.vllm_helpers import EOS, PAD, settings

    eng = VllmServerRollout(str(model_dir), [EOS], PAD, settings(weight_transfer="collective"), seed=1)
    try:
        _two_syncs(eng, model_dir, senders)
    finally:
        eng.shutdown()


def test_gpu_path_collective_tensor_parallel_two_workers(model_dir, senders):
    """tensor_model_parallel_size=2 in process over the collective: both workers (ranks 1 and 2
    of the group) keep their own slices, and of the tables in blocks that straddle their halves
    of the vocabulary, their own rows."""
    from dapo.rollout.vllm_rollout import VllmRollout
    from fixtures.vllm_helpers import EOS, PAD, settings

    s = settings(weight_transfer="collective", tensor_model_parallel_size=2, max_num_seqs=16)
    eng = VllmRollout(str(model_dir), [EOS], PAD, s, seed=1)
    try:
        _two_syncs(eng, model_dir, senders)
    finally:
        eng.shutdown()


def test_gpu_path_collective_is_the_default_only_for_a_server_on_its_own_gpus():
    from fixtures.config_helpers import run_config

    vllm = ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.model.path=/models/m"]
    server = [*vllm, "trainer.device=cuda", f"{R}.placement=server"]
    r = run_config(*server, f"{R}.server_devices=[1]").actor_rollout_ref.rollout
    assert r.weight_transfer == "collective"
    assert VllmSettings.from_config(r, "bfloat16", 64, "cuda").weight_transfer == "collective"
    # vLLM on the trainer's GPUs (NCCL cannot pair ranks on one device), or on the CPU: the socket
    assert run_config(*server).actor_rollout_ref.rollout.weight_transfer == "socket"
    shared = run_config(*server, f"{R}.server_devices=[0, 1]").actor_rollout_ref.rollout
    assert shared.weight_transfer == "socket"  # device 0 is the trainer's
    assert run_config(*vllm, "trainer.device=cuda").actor_rollout_ref.rollout.weight_transfer == "socket"
    r = run_config(*vllm, f"{R}.placement=server").actor_rollout_ref.rollout
    assert r.weight_transfer == "socket"
    assert VllmSettings.from_config(r, "float32", 64, "cpu").weight_transfer == "socket"
    assert VllmSettings.for_model("float32", 64).weight_transfer == "socket"
    # a value that is set is kept: gloo on the CPU, the socket to a server on its own GPUs
    r = run_config(
        *vllm, f"{R}.placement=server", f"{R}.weight_transfer=collective"
    ).actor_rollout_ref.rollout
    assert r.weight_transfer == "collective"
    r = run_config(
        *server, f"{R}.server_devices=[1]", f"{R}.weight_transfer=socket"
    ).actor_rollout_ref.rollout
    assert r.weight_transfer == "socket"


def test_gpu_path_collective_refusals():
    from fixtures.config_helpers import config_problems as problems

    vllm = ["actor_rollout_ref.rollout.name=vllm", "trainer.device=cuda"]
    (p,) = problems(*vllm, f"{R}.weight_transfer=nccl")
    assert p == f"{R}.weight_transfer: must be null, socket or collective, got 'nccl'"
    for where in ([], [f"{R}.placement=server"]):
        (p,) = problems(*vllm, *where, f"{R}.weight_transfer=collective")
        assert p.startswith(
            f"{R}.weight_transfer=collective: on trainer.device=cuda it needs rollout.server_devices"
        )
        assert "set weight_transfer=socket or null" in p
    assert (
        problems(*vllm, f"{R}.placement=server", f"{R}.server_devices=[1]", f"{R}.weight_transfer=collective")
        == []
    )
    cpu = ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.model.path=/models/m"]
    assert problems(*cpu, f"{R}.weight_transfer=collective") == []  # gloo
    # a server device that is also the trainer's (its ranks use 0 .. n_gpus_per_node-1)
    (p,) = problems(
        *vllm, f"{R}.placement=server", f"{R}.server_devices=[0]", f"{R}.weight_transfer=collective"
    )
    assert p.startswith(
        f"{R}.weight_transfer=collective: server_devices [0] include a device of the trainer's"
    )
    assert "set weight_transfer=socket or null, or give the server other devices" in p
    two = [*vllm, "trainer.n_gpus_per_node=2", f"{R}.placement=server", f"{R}.weight_transfer=collective"]
    assert len(problems(*two, f"{R}.server_devices=[1]")) == 1
    assert problems(*two, f"{R}.server_devices=[2]") == []


def test_gpu_path_collective_explain_names_the_device(capsys):
    from dapo.cli import main

    model = "actor_rollout_ref.model.path=/models/m"
    assert main(["validate", "--explain", f"{R}.weight_transfer", f"{R}.name=vllm", model]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert (
        lines[0]
        == f"{R}.weight_transfer = socket (set null, resolved for trainer.device=cpu)   [default null]"
    )
    assert "collective" in lines[1] and "has no effect" in lines[1]


def test_gpu_path_collective_without_effect_is_said():
    """A transport set for the one in-process worker, which is handed the tensors directly, is
    warned about; the server's, or two tensor-parallel workers', is not."""
    from dapo.run_config import build_run_config

    vllm = ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.model.path=/models/m"]

    def warned(*overrides):
        return [w for w in build_run_config([*vllm, *overrides]).warnings if "weight_transfer" in w]

    (w,) = warned(f"{R}.weight_transfer=collective")
    assert w.startswith(f"{R}.weight_transfer=collective: no effect here (one in-process vLLM worker")
    assert warned() == []  # null: nothing set
    assert warned(f"{R}.weight_transfer=collective", f"{R}.placement=server") == []
