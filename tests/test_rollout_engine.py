"""The fast rollout engine: same outputs as transformers' generate, exact sampler log-probs."""

import math

import pytest
import torch
from transformers import Qwen2ForCausalLM

from dapo.actor.forward import response_logprobs
from dapo.model.decoder_fn import supports
from dapo.model.tiny import tiny_config
from dapo.rollout.hf import HFRollout, SamplingParams, left_pad
from dapo.rollout.sampling_ops import filter_logits

VOCAB, PAD, EOS = 103, 0, 2


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = tiny_config(VOCAB, PAD, EOS, hidden_size=64, num_hidden_layers=2, intermediate_size=128)
    return Qwen2ForCausalLM(cfg).eval()


def _prompts(k: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(2, 9, (k,), generator=g)
    return [torch.randint(7, VOCAB, (int(n),), generator=g).tolist() for n in lens]


def test_engine_is_used_for_qwen2(model):
    assert supports(model)
    assert HFRollout(model, [EOS], PAD).engine is not None
    assert HFRollout(model, [EOS], PAD, engine="hf").engine is None


def test_greedy_equals_generate(model):
    prompts = _prompts(5)
    width = max(map(len, prompts))
    out = HFRollout(model, [EOS], PAD).generate(
        prompts, SamplingParams(n=2, do_sample=False, response_length=10), prompt_width=width + 2
    )
    ids, mask = left_pad(prompts, width, PAD)
    with torch.no_grad():
        ref = model.generate(
            input_ids=ids.repeat_interleave(2, 0),
            attention_mask=mask.repeat_interleave(2, 0),
            do_sample=False,
            max_new_tokens=10,
            eos_token_id=EOS,
            pad_token_id=PAD,
        )[:, width:]
    for i in range(10):
        n = int(out.response_mask[i].sum())
        assert out.responses[i, :n].tolist() == ref[i, :n].tolist()
        assert (out.responses[i, n:] == PAD).all()


@pytest.mark.parametrize("engine", ["fast", "hf"])
def test_rollout_log_probs_equal_teacher_forced(model, engine):
    """Every row, finished early or not (several EOS ids, aggressive compaction), gets the
    log-probs the actor recomputes; masks and truncation flags are consistent."""
    eos_ids = [EOS, 11, 12, 13, 14, 15]
    ro = HFRollout(model, eos_ids, PAD, seed=3, engine=engine, compact_fraction=0.05)
    params = SamplingParams(n=4, temperature=0.8, top_k=20, top_p=0.9, response_length=24)
    out = ro.generate(_prompts(6, seed=1), params, prompt_width=10)
    lengths = out.response_mask.sum(-1)
    assert 0 < int(lengths.min()) < int(lengths.max())  # rows finished at different steps
    for i in range(out.responses.shape[0]):
        n = int(lengths[i])
        assert out.response_mask[i, :n].all() and not out.response_mask[i, n:].any()
        ended = out.responses[i, n - 1].item() in eos_ids
        assert ended == (not bool(out.truncated[i]))
        assert not any(t in eos_ids for t in out.responses[i, : n - 1].tolist())
    ids = torch.cat([out.prompts, out.responses], 1)
    attn = torch.cat([(out.prompts != PAD).long(), out.response_mask], 1)
    with torch.no_grad():
        lp, _ = response_logprobs(model, ids, attn, params.response_length, params.temperature)
    torch.testing.assert_close(lp * out.response_mask, out.rollout_log_probs, atol=1e-5, rtol=1e-5)


def _chi2_ok(counts: torch.Tensor, probs: torch.Tensor) -> bool:
    """Pearson goodness of fit, bins with expected count < 5 merged; passes unless the
    statistic is beyond df + 6 sqrt(2 df) (far in the tail: the test is deterministic)."""
    total = counts.sum()
    expected = probs * total
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum(0, keepdim=True)])
    exp = torch.cat([expected[big], expected[~big].sum(0, keepdim=True)])
    keep = exp > 0
    stat = float((((obs - exp) ** 2)[keep] / exp[keep]).sum())
    df = int(keep.sum()) - 1
    return stat < df + 6 * math.sqrt(2 * df)


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, -1, 1.0), (0.7, 12, 0.85)])
def test_token_frequencies_match_generate(model, temperature, top_k, top_p):
    """First and second tokens of 4000 samples from our engine and from generate agree with each
    other (two-sample) and with the exact first-token distribution (goodness of fit)."""
    prompt = [17, 33, 58, 71, 9]
    n = 4000
    out = HFRollout(model, [EOS], PAD, seed=11).generate(
        [prompt], SamplingParams(n=n, temperature=temperature, top_k=top_k, top_p=top_p, response_length=2)
    )
    torch.manual_seed(12)
    with torch.no_grad():
        ref = model.generate(
            input_ids=torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=True,
            temperature=temperature,
            top_k=max(top_k, 0),
            top_p=top_p,
            max_new_tokens=2,
            num_return_sequences=n,
            eos_token_id=EOS,
            pad_token_id=PAD,
        )[:, len(prompt) :]
        logits = model(input_ids=torch.tensor([prompt])).logits[0, -1] / temperature
    exact = torch.softmax(filter_logits(logits[None], top_k, top_p)[0], -1)
    ours_first = torch.bincount(out.responses[:, 0], minlength=VOCAB).double()
    ref_first = torch.bincount(ref[:, 0], minlength=VOCAB).double()
    assert _chi2_ok(ours_first, exact.double())
    assert _chi2_ok(ref_first, exact.double())
    # two-sample: pooled frequencies as the null, on first and (first, second) pairs
    for a, b in [
        (ours_first, ref_first),
        (
            torch.bincount(
                out.responses[:, 0] * VOCAB + out.responses[:, 1], minlength=VOCAB * VOCAB
            ).double(),
            torch.bincount(ref[:, 0] * VOCAB + ref[:, 1], minlength=VOCAB * VOCAB).double(),
        ),
    ]:
        pooled = (a + b) / (a.sum() + b.sum())
        assert _chi2_ok(a, pooled) and _chi2_ok(b, pooled)
    tv = 0.5 * float((ours_first / n - ref_first / n).abs().sum())
    assert tv < 0.15  # sampling noise alone is about 0.09 here (near-uniform 103-token law, 4000 draws each)


def test_unsupported_model_uses_generic_loop():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    m = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2, n_positions=64)).eval()
    assert not supports(m)
    with pytest.raises(ValueError):
        HFRollout(m, [EOS], PAD, engine="fast")
    ro = HFRollout(m, [EOS], PAD)
    assert ro.engine is None
    out = ro.generate(_prompts(2), SamplingParams(n=2, response_length=5))
    assert out.responses.shape == (4, 5)


def _greedy_both_engines(m, prompts, length=12):
    params = SamplingParams(n=1, do_sample=False, response_length=length)
    outs = [
        HFRollout(m, [EOS], PAD, engine=e).generate(prompts, params, prompt_width=10) for e in ("fast", "hf")
    ]
    return outs


def test_length_dependent_rotary_matches_the_step_by_step_loop():
    # dynamic NTK scaling recomputes frequencies from the longest position seen: the fast engine
    # must not evaluate it once for the whole rollout
    torch.manual_seed(0)
    cfg = tiny_config(VOCAB, PAD, EOS, hidden_size=64, num_hidden_layers=2, intermediate_size=128)
    cfg.max_position_embeddings = 8
    cfg.rope_parameters = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    m = Qwen2ForCausalLM(cfg).eval()
    fast, ref = _greedy_both_engines(m, _prompts(4, seed=2), length=16)
    assert torch.equal(fast.responses, ref.responses)
    torch.testing.assert_close(fast.rollout_log_probs, ref.rollout_log_probs, atol=1e-5, rtol=1e-5)


def test_float16_with_a_large_hidden_norm_stays_finite():
    # the norm folded into the next matmul must not overflow float16's range
    torch.manual_seed(0)
    cfg = tiny_config(VOCAB, PAD, EOS, hidden_size=64, num_hidden_layers=2, intermediate_size=128)
    m = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():
        m.model.embed_tokens.weight.mul_(2000.0)  # hidden norms in the tens of thousands
    m = m.half()
    fast, ref = _greedy_both_engines(m, _prompts(4, seed=3))
    assert torch.isfinite(ref.rollout_log_probs).all()
    assert torch.isfinite(fast.rollout_log_probs).all()
    assert torch.equal(fast.responses[:, :4], ref.responses[:, :4])
