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
from dapo.rollout.vllm_weight_collective import CollectiveSender
from dapo.rollout.vllm_weight_stream import read_header
from fixtures.collective_helpers import run_worker

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


def _sync(tmp_path, weights, fail_after=(None, None)):
    """One sync to two worker processes; the sender's error and each worker's record."""
    ctx = mp.get_context("spawn")
    sender = CollectiveSender(expected=2, timeout_s=TIMEOUT_S)
    outs = [str(tmp_path / f"w{r}.pt") for r in (0, 1)]
    procs = [
        ctx.Process(target=run_worker, args=(r, sender.address(), outs[r], fail_after[r])) for r in (0, 1)
    ]
    for p in procs:
        p.start()
    thread = sender.send_in_thread(weights)
    for p in procs:
        p.join(TIMEOUT_S + 60)
    sender.close()
    thread.join(TIMEOUT_S + 60)
    assert not thread.is_alive() and all(p.exitcode == 0 for p in procs)
    return sender, [torch.load(o, weights_only=True) for o in outs]


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
