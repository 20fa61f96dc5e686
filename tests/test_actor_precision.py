"""model_dtype resolution, and the packed forward and the rollout engine in bfloat16."""

import pytest
import torch

from dapo.actor.forward import packed_response_logprobs, response_logprobs
from dapo.model.precision import cpu_supports_bf16, resolve_model_dtype
from dapo.rollout.hf import HFRollout, SamplingParams
from fixtures.actor_helpers import rl_batch


def test_resolve_names():
    assert resolve_model_dtype(None) is torch.float32
    assert resolve_model_dtype("fp32") is torch.float32
    assert resolve_model_dtype("torch.float32") is torch.float32
    with pytest.warns(UserWarning):
        assert resolve_model_dtype("fp16", "cpu") is torch.float32
    with pytest.raises(ValueError, match="model_dtype"):
        resolve_model_dtype("int8")
    if cpu_supports_bf16():
        assert resolve_model_dtype("bf16", "cpu") is torch.bfloat16
    else:
        with pytest.warns(UserWarning):
            assert resolve_model_dtype("bf16", "cpu") is torch.float32


def test_bf16_packed_close_to_padded_and_rollout_runs(tiny_random_model_dir, char_tokenizer):
    from dapo.model.loader import load_model

    model = load_model(tiny_random_model_dir, dtype=torch.bfloat16).eval()
    b = rl_batch(len(char_tokenizer), rows=4, seed=2)
    ids, attn, mask = b.tensors["input_ids"], b.tensors["attention_mask"], b.tensors["response_mask"]
    with torch.no_grad():
        pad, _ = response_logprobs(model, ids, attn, 7, 1.0)
        packed, _ = packed_response_logprobs(model, ids, attn, 7, 1.0)
    assert packed.dtype == torch.float32
    torch.testing.assert_close(packed, pad * mask, atol=0.05, rtol=0.02)  # bf16 rounding only
    out = HFRollout(model, [char_tokenizer.eos_token_id], char_tokenizer.pad_token_id).generate(
        [[10, 11, 12]], SamplingParams(n=3, response_length=5)
    )
    assert out.rollout_log_probs.dtype == torch.float32 and torch.isfinite(out.rollout_log_probs).all()
