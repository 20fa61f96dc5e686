"""Micro-batched gradients equal the full mini-batch gradient for every loss_agg_mode."""

import numpy as np
import pytest
import torch

from dapo.actor.dp_actor import Actor, ActorSettings, actor_settings
from dapo.algo.agg import LOSS_AGG_MODES
from dapo.batch import Batch
from dapo.bench.common import padded_rl_batch


def _batch(vocab: int, rows: int = 8, P: int = 5, R: int = 7, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    prompt_len = torch.randint(2, P + 1, (rows,), generator=g)
    resp_len = torch.randint(1, R + 1, (rows,), generator=g)
    return padded_rl_batch(prompt_len, resp_len, P, R, vocab, g, token_low=7, group_size=2)


def _settings(micro: int, mode: str, remove_padding: bool = False, **actor: object) -> ActorSettings:
    return actor_settings(
        ppo_mini_batch_size=8,
        ppo_micro_batch_size_per_gpu=micro,
        data_loader_seed=0,
        grad_clip=1e9,
        loss_agg_mode=mode,
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        clip_ratio_c=3.0,
        kl_loss_coef=0.0,
        **actor,
        rollout=dict(temperature=0.7, log_prob_micro_batch_size_per_gpu=8),
        model=dict(use_remove_padding=remove_padding),
    )


def _grads(model_dir, batch: Batch, settings: ActorSettings) -> tuple[list[torch.Tensor], dict]:
    from dapo.model.loader import load_model

    model = load_model(model_dir)
    model.config.use_cache = False
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    metrics = Actor(model, opt, settings).update_policy(batch)
    return [p.grad.clone() for p in model.parameters() if p.grad is not None], metrics


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("micro", [1, 3, 4])
def test_micro_batched_gradient_equals_full_batch(tiny_random_model_dir, char_tokenizer, mode, micro):
    batch = _batch(len(char_tokenizer))
    # seq-mean-token-sum-norm needs a constant divisor when micro-batches are re-padded
    full, m_full = _grads(tiny_random_model_dir, batch, _settings(8, mode))
    split, m_split = _grads(tiny_random_model_dir, batch, _settings(micro, mode))
    assert len(full) == len(split) > 0
    for a, b in zip(full, split):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert m_full["actor/pg_loss"] == pytest.approx(m_split["actor/pg_loss"], rel=1e-5, abs=1e-7)
    assert m_full["actor/pg_clipfrac"] == pytest.approx(m_split["actor/pg_clipfrac"], abs=1e-6)


def test_entropy_bonus_is_split_invariant(tiny_random_model_dir, char_tokenizer):
    batch = _batch(len(char_tokenizer), seed=3)
    full, _ = _grads(tiny_random_model_dir, batch, _settings(8, "token-mean", entropy_coeff=0.01))
    split, _ = _grads(tiny_random_model_dir, batch, _settings(2, "token-mean", entropy_coeff=0.01))
    for a, b in zip(full, split):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_response_logprobs_ignore_padding_columns(tiny_random_model_dir, char_tokenizer):
    """Log-probs of a row do not change when other rows force extra padding around it."""
    from dapo.actor.forward import response_logprobs
    from dapo.model.loader import load_model

    model = load_model(tiny_random_model_dir).eval()
    b = _batch(len(char_tokenizer), rows=4, seed=5)
    ids, attn = b.tensors["input_ids"], b.tensors["attention_mask"]
    with torch.no_grad():
        together, _ = response_logprobs(model, ids, attn, 7, 1.0)
        for i in range(4):
            alone, _ = response_logprobs(model, ids[i : i + 1], attn[i : i + 1], 7, 1.0)
            m = b.tensors["response_mask"][i].bool()
            np.testing.assert_allclose(alone[0][m].numpy(), together[i][m].numpy(), rtol=1e-4, atol=1e-5)
