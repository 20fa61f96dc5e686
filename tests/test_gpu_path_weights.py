"""The weight path a GPU run takes, on CPU: FSDP ranks built on the meta device that read only
their own rows of the checkpoint, a sync that streams the trained weights to the trainer in
rounds of one bucket, never a whole model (its peak memory measured, not timed), and the socket
stream that feeds vLLM workers in other processes (the server's, tensor-parallel ones).

One pair of gloo ranks on an ~76 MB random model serves the file."""

from __future__ import annotations

import logging

import pytest
import torch

from dapo.bench.weight_sync import PeakRss, save_random_model, scramble, trainable_bytes
from dapo.checkpoint.rows import RowBlock
from dapo.distributed.weight_sync import PieceSpec, load_pieces_into, plan_rounds, round_pieces
from dapo.model.loader import load_model
from dapo.rollout.vllm_weight_stream import WeightReceiver, WeightSender, tensor_bytes
from fixtures.actor_helpers import process_ranks

BUCKET_MB = 8


@pytest.fixture(scope="module")
def small_model_dir(tmp_path_factory):
    return save_random_model(tmp_path_factory.mktemp("small_random"), "small")


@pytest.fixture(scope="module")
def two_ranks(small_model_dir):
    with process_ranks(
        small_model_dir, rollout_model=load_model(small_model_dir), bucket_megabytes=BUCKET_MB
    ) as actor:
        yield actor


def test_gpu_path_piece_plan_hand_computed():
    """A 3x4 fp32 weight (16 bytes a row) and a 3-element bias in a 32-byte budget: the weight
    goes as rows 0-1 and row 2, the bias whole, in two rounds of 32 and 28 bytes."""
    lin = torch.nn.Linear(4, 3)
    rounds = plan_rounds(lin, 32)
    assert rounds == [
        [PieceSpec("weight", 0, 2, 0, 32)],
        [PieceSpec("weight", 2, 3, 0, 16), PieceSpec("bias", 0, 3, 0, 12)],
    ]
    pieces = [p for r in rounds for p in round_pieces(lin, r)]
    assert [(n, start, tuple(t.shape)) for n, start, t in pieces] == [
        ("weight", 0, (2, 4)),
        ("weight", 2, (1, 4)),
        ("bias", 0, (3,)),
    ]
    other = torch.nn.Linear(4, 3)
    assert load_pieces_into(other, pieces) == 48 + 12
    assert torch.equal(other.weight, lin.weight) and torch.equal(other.bias, lin.bias)
    # a piece that does not fit its parameter is refused, naming it
    with pytest.raises(ValueError, match="weight rows 2"):
        load_pieces_into(other, [("weight", 2, torch.zeros(2, 4))])


def test_gpu_path_meta_init_reads_only_own_rows(two_ranks, small_model_dir):
    """Each rank built the model on the meta device and read its own rows: together the two
    ranks read every row of the checkpoint exactly once, and the sharded weights are the
    checkpoint's (tied output layer included)."""
    info = two_ranks.info()
    assert [i["init"] for i in info] == ["meta", "meta"]
    want = load_model(small_model_dir)
    total_rows = sum(p.shape[0] for p in want.parameters())
    rows = [i["load_rows"] for i in info]
    assert sum(rows) == total_rows
    assert max(rows) <= total_rows // 2 + len(list(want.parameters()))  # dim-0 halves, rounded up
    full = two_ranks.full_state_dict()
    for n, p in want.named_parameters():
        assert torch.equal(full[n], p), n


def test_gpu_path_streamed_sync_peak_memory_two_ranks(two_ranks, small_model_dir):
    """A sync from two ranks brings every weight back into the trainer's rollout model while
    the trainer's peak resident memory grows by about one bucket (8 MiB), far below a model
    (~76 MB): measured with VmHWM, twice."""
    model = two_ranks.rollout_model
    size = trainable_bytes(model)
    want = load_model(small_model_dir)
    raised = []
    for _ in range(2):
        scramble(model)
        with PeakRss() as peak:
            metrics = two_ranks.sync_weights()
        raised.append(peak.raised)
        for n, p in want.named_parameters():
            assert torch.equal(dict(model.named_parameters())[n], p), n
    assert metrics["perf/weight_sync_rounds"] >= size / (BUCKET_MB * 2**20)
    assert abs(metrics["perf/weight_sync_mb"] - size / 2**20) < 1e-6
    assert max(raised) < 0.25 * size, [r / size for r in raised]


class _Worker(WeightReceiver):
    """The weight receiver as vLLM mixes it into a worker, with a loader that keeps the tensors
    (a tensor-parallel worker would keep its slice of each)."""

    def __init__(self, fail: bool = False):
        self.got: dict[str, torch.Tensor] = {}
        self.fail = fail

    def dapo_reload_weights(self, weights_iterator) -> None:
        for name, t in weights_iterator:
            self.got[name] = t
        if self.fail:
            raise ValueError("shape mismatch in layer 3")

    def dapo_largest_numel(self) -> int:
        return 64  # the stand-in's largest tensor: the frames below hold at most 18 elements


def test_gpu_path_stream_to_two_tp_workers():
    """Two workers (the tensor-parallel case) pull one stream: both get every tensor bit for bit
    (fp32, bf16, a scalar, an empty one, a block of rows of a larger tensor with its place), a
    connection without the token is turned away, and the bytes sent are views of the trainer's
    own tensors (no copy)."""
    import socket
    import threading

    weights = {
        "a.weight": torch.randn(5, 3),
        "b.weight": torch.randn(4, 2).to(torch.bfloat16),
        "scale": torch.tensor(2.5),
        "empty": torch.zeros(0, 7),
        "table.weight": RowBlock(2, torch.randn(2, 3), (6, 3)),
    }
    view = tensor_bytes(weights["a.weight"])
    assert view.obj.ctypes.data == weights["a.weight"].data_ptr() and len(view) == 5 * 3 * 4
    sender = WeightSender(expected=2, timeout_s=60)
    thread = sender.send_in_thread(weights.items())
    stranger = socket.create_connection(("127.0.0.1", sender.port))
    stranger.sendall(b"0" * len(sender.token))  # a wrong token: closed, not counted
    workers = [_Worker(), _Worker()]
    pulls = [threading.Thread(target=w.dapo_receive_weights, kwargs=sender.address()) for w in workers]
    for t in pulls:
        t.start()
    for t in pulls:
        t.join(timeout=60)
    thread.join(timeout=60)
    assert sender.error is None
    assert stranger.recv(1) == b""  # the sender hung up on it
    stranger.close()
    for w in workers:
        assert list(w.got) == list(weights)
        for n, t in weights.items():
            got = w.got[n]
            if isinstance(t, RowBlock):
                assert isinstance(got, RowBlock) and (got.start, got.shape) == (t.start, t.shape)
                got, t = got.rows, t.rows
            assert got.dtype == t.dtype and torch.equal(got, t), n
    assert sender.nbytes == 5 * 3 * 4 + 4 * 2 * 2 + 4 + 2 * 3 * 4


def test_gpu_path_stream_worker_failure_reaches_trainer():
    """A worker whose loader fails tells the trainer why; the sender raises it."""
    import threading

    sender = WeightSender(expected=1, timeout_s=60)
    thread = sender.send_in_thread([("w", torch.ones(2, 2))])
    worker = _Worker(fail=True)

    def pull() -> None:
        with pytest.raises(ValueError):
            worker.dapo_receive_weights(**sender.address())

    t = threading.Thread(target=pull)
    t.start()
    t.join(timeout=60)
    thread.join(timeout=60)
    assert isinstance(sender.error, RuntimeError)
    assert "ValueError: shape mismatch in layer 3" in str(sender.error)


def test_gpu_path_stream_and_assembly_refuse_what_no_sync_sends():
    """A header too long, a dtype that is no weight's, a whole shape larger than any tensor the
    worker takes, rows that do not fit it, and a block whose dtype or whole shape differs from its
    parameter's first: each refused before anything is allocated for it, in one line naming it."""
    import json
    import socket
    import struct

    from dapo.checkpoint.rows import RowAssembly
    from dapo.rollout.vllm_weight_stream import receive

    def frames(*headers: bytes, raw: bytes = b"", max_numel: int | None = None) -> list:
        a, b = socket.socketpair()
        with a:
            a.sendall(raw + b"".join(struct.pack("!I", len(h)) + h for h in headers))
        with b:
            return list(receive(b, max_numel))

    with pytest.raises(ValueError, match="a frame header of 2097152 bytes"):
        frames(raw=struct.pack("!I", 2**21))  # refused before its bytes are read
    head = {"name": "w", "dtype": "Tensor", "shape": [1]}
    with pytest.raises(ValueError, match="w has dtype 'Tensor', not a weight's"):
        frames(json.dumps(head).encode())
    with pytest.raises(ValueError, match=r"w has shape \[-1\]"):
        frames(json.dumps(head | {"dtype": "float32", "shape": [-1]}).encode())
    assert frames(json.dumps(head | {"dtype": "bfloat16", "shape": [0]}).encode(), b'{"end": true}')
    # a whole tensor's shape is a claim too: past the worker's largest tensor it is refused before
    # it is allocated (10**12 float32 would be 4 TB)
    huge = json.dumps(head | {"dtype": "float32", "shape": [10**6, 10**6]}).encode()
    with pytest.raises(ValueError, match=r"w has shape \[1000000, 1000000\], more elements than the largest"):
        frames(huge, max_numel=4096)
    fits = json.dumps(head | {"dtype": "float32", "shape": [2, 2]}).encode()
    end = b'{"end": true}'
    payload = torch.arange(4, dtype=torch.float32)
    a, b = socket.socketpair()
    with a:
        a.sendall(struct.pack("!I", len(fits)) + fits + payload.numpy().tobytes())
        a.sendall(struct.pack("!I", len(end)) + end)
    with b:
        ((name, t),) = list(receive(b, max_numel=4))  # exactly the bound is taken
    assert name == "w" and torch.equal(t, payload.reshape(2, 2))

    r, big = torch.ones(2, 3), 10**6
    with pytest.raises(ValueError, match=r"weight sync: w: whole shape \(1000000, 3\) is larger"):
        RowAssembly("weight sync", max_numel=1000).add("w", 0, r, r.dtype, (big, 3))
    with pytest.raises(ValueError, match=r"weight sync: w rows 0\+\(2, 3\) do not fit \(1000000, 4\)"):
        RowAssembly("weight sync").add("w", 0, r, r.dtype, (big, 4))
    a = RowAssembly("weight sync", max_numel=1000)
    assert a.add("w", 0, r, r.dtype, (4, 3)) is None
    with pytest.raises(
        ValueError, match=r"w: a block of torch.float16 \(4, 3\) after blocks of torch.float32"
    ):
        a.add("w", 2, r.half(), torch.float16, (4, 3))
    with pytest.raises(ValueError, match=r"w: a block of torch.float32 \(6, 3\) after blocks"):
        a.add("w", 2, r, r.dtype, (6, 3))
    assert torch.equal(a.add("w", 2, r, r.dtype, (4, 3)), torch.ones(4, 3))


def test_gpu_path_every_table_must_reach_vllm():
    """A tied pair is covered by either of its names; an untied output layer left out of the
    stream is named, not left with its old weights."""
    from dapo.rollout.vllm_reload import check_tables_covered

    embed, head = torch.nn.Parameter(torch.zeros(4, 2)), torch.nn.Parameter(torch.zeros(4, 2))
    tied = {"lm_head.weight": embed, "model.embed_tokens.weight": embed}
    check_tables_covered(tied, ["lm_head.weight"])
    check_tables_covered(tied, [None, "model.embed_tokens.weight"])
    untied = {"lm_head.weight": head, "model.embed_tokens.weight": embed}
    check_tables_covered(untied, ["model.embed_tokens.weight", "lm_head.weight"])
    with pytest.raises(RuntimeError, match=r"lack its embedding table lm_head.weight$"):
        check_tables_covered(untied, ["model.embed_tokens.weight"])


def test_gpu_path_blocks_without_an_in_place_writer_are_put_together_and_warned_once(caplog):
    """A tensor that reaches vLLM's worker in blocks of rows and has no in-place writer (not an
    embedding table) is put together whole for vLLM's loaders, whatever the blocks' order; that
    is named once per parameter for the process's life, with its size, not at every sync. Whole
    tensors pass through untouched, and a parameter whose rows stop short fails the sync."""
    from dapo.checkpoint.rows import RowAssembly
    from dapo.rollout import vllm_reload

    name = "model.layers.0.mlp.down_proj.weight"
    w = torch.arange(6 * 1024 * 64, dtype=torch.float32).reshape(6 * 1024, 64)  # 1.5 MiB
    norm = torch.ones(64)
    blocks = [RowBlock(s, w[s : s + 1024], tuple(w.shape)) for s in (4096, 0, 5120, 1024, 3072, 2048)]
    vllm_reload._warned_whole.discard(name)
    with caplog.at_level(logging.WARNING, logger=vllm_reload.logger.name):
        for _ in range(2):  # two syncs
            got, assembled = {}, set()
            pairs = [("model.norm.weight", norm), *((name, b) for b in blocks)]
            for n, t in vllm_reload.whole_tensors(pairs, RowAssembly("test"), assembled):
                got[n] = t
            assert got["model.norm.weight"] is norm
            assert torch.equal(got[name], w) and assembled == {name}
    warned = [r.getMessage() for r in caplog.records if name in r.getMessage()]
    assert warned == [
        f"weight sync: {name} (1.5 MiB) was sent in blocks of rows and is put together "
        "whole in vLLM's worker: no in-place writer for it"
    ]
    with pytest.raises(KeyError, match=r"1 parameters incomplete.*down_proj"):
        list(vllm_reload.whole_tensors([(name, b) for b in blocks[:-1]], RowAssembly("test")))


def test_gpu_path_server_devices_and_bucket_keys_are_checked():
    """The server's own devices need the server placement on CUDA and enough ids for its
    tensor-parallel workers; the sync's bucket must hold at least 1 MiB."""
    from fixtures.config_helpers import config_problems as problems

    vllm = ["actor_rollout_ref.rollout.name=vllm", "trainer.device=cuda"]
    (p,) = problems(*vllm, "actor_rollout_ref.rollout.server_devices=[2,3]")
    assert "rollout.server_devices: needs placement=server" in p
    server = [*vllm, "actor_rollout_ref.rollout.placement=server"]
    (p,) = problems(
        *server,
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
        "actor_rollout_ref.rollout.server_devices=[3,3]",
    )
    assert "at least tensor_model_parallel_size=2 distinct device ids" in p and "[3, 3]" in p
    assert problems(*server, "actor_rollout_ref.rollout.server_devices=[2,3]") == []
    (p,) = problems("actor_rollout_ref.rollout.update_weights_bucket_megabytes=0")
    assert "update_weights_bucket_megabytes: must be >= 1 MiB" in p
