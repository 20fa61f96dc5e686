"""Micro-batched gradients equal the full mini-batch gradient for every loss_agg_mode."""

import numpy as np
import pytest
import torch

from dapo.algo.agg import LOSS_AGG_MODES
from fixtures.actor_helpers import micro_settings, policy_grads, rl_batch


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("micro", [1, 3, 4])
def test_micro_batched_gradient_equals_full_batch(tiny_random_model_dir, char_tokenizer, mode, micro):
    batch = rl_batch(len(char_tokenizer))
    # seq-mean-token-sum-norm needs a constant divisor when micro-batches are re-padded
    full, m_full = policy_grads(tiny_random_model_dir, batch, micro_settings(8, mode))
    split, m_split = policy_grads(tiny_random_model_dir, batch, micro_settings(micro, mode))
    assert len(full) == len(split) > 0
    for a, b in zip(full, split):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert m_full["actor/pg_loss"] == pytest.approx(m_split["actor/pg_loss"], rel=1e-5, abs=1e-7)
    assert m_full["actor/pg_clipfrac"] == pytest.approx(m_split["actor/pg_clipfrac"], abs=1e-6)


def test_entropy_bonus_is_split_invariant(tiny_random_model_dir, char_tokenizer):
    batch = rl_batch(len(char_tokenizer), seed=3)
    full, _ = policy_grads(tiny_random_model_dir, batch, micro_settings(8, "token-mean", entropy_coeff=0.01))
    split, _ = policy_grads(tiny_random_model_dir, batch, micro_settings(2, "token-mean", entropy_coeff=0.01))
    for a, b in zip(full, split):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_response_logprobs_ignore_padding_columns(tiny_random_model_dir, char_tokenizer):
    """Log-probs of a row do not change when other rows force extra padding around it."""
    from dapo.actor.forward import response_logprobs
    from dapo.model.loader import load_model

    model = load_model(tiny_random_model_dir).eval()
    b = rl_batch(len(char_tokenizer), rows=4, seed=5)
    ids, attn = b.tensors["input_ids"], b.tensors["attention_mask"]
    with torch.no_grad():
        together, _ = response_logprobs(model, ids, attn, 7, 1.0)
        for i in range(4):
            alone, _ = response_logprobs(model, ids[i : i + 1], attn[i : i + 1], 7, 1.0)
            m = b.tensors["response_mask"][i].bool()
            np.testing.assert_allclose(alone[0][m].numpy(), together[i][m].numpy(), rtol=1e-4, atol=1e-5)
