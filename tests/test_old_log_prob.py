"""Old log-probs: the on-policy fast path equals the recompute path bit for bit; bypass mode uses
the sampler's log-probs; the source is chosen from the config."""

import pytest
import torch

from dapo.actor.dp_actor import Actor, ActorSettings, actor_settings, compute_log_prob
from dapo.actor.old_log_prob import BYPASS, CURRENT, RECOMPUTE, old_log_prob_source
from dapo.batch import Batch
from dapo.bench.common import padded_rl_batch


def _batch(vocab: int, rows: int = 8, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    prompt_len = torch.randint(2, 6, (rows,), generator=g)
    resp_len = torch.randint(1, 8, (rows,), generator=g)
    return padded_rl_batch(prompt_len, resp_len, 5, 7, vocab, g, token_low=7, group_size=2)


def _settings(micro: int) -> ActorSettings:
    return actor_settings(
        ppo_mini_batch_size=8,
        ppo_micro_batch_size_per_gpu=micro,
        grad_clip=1e9,
        loss_agg_mode="token-mean",
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        clip_ratio_c=3.0,
        rollout=dict(temperature=0.7, log_prob_micro_batch_size_per_gpu=micro),
    )


def _update(model_dir, batch: Batch, settings: ActorSettings, recompute: bool):
    from dapo.model.loader import load_model

    model = load_model(model_dir)
    model.config.use_cache = False
    b = batch.select(list(range(len(batch))))
    b.tensors.pop("old_log_probs", None)
    if recompute:
        lp, _ = compute_log_prob(model, b, settings.rollout.temperature, settings.log_prob_micro_batch_size)
        b.tensors["old_log_probs"] = lp
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    metrics = Actor(model, opt, settings).update_policy(b)
    return [p.grad.clone() for p in model.parameters() if p.grad is not None], metrics


@pytest.mark.parametrize("micro", [8, 3])
def test_on_policy_fast_path_is_bit_identical_to_recompute(tiny_random_model_dir, char_tokenizer, micro):
    batch = _batch(len(char_tokenizer))
    assert float(batch.tensors["advantages"].abs().sum()) > 0
    slow, m_slow = _update(tiny_random_model_dir, batch, _settings(micro), recompute=True)
    fast, m_fast = _update(tiny_random_model_dir, batch, _settings(micro), recompute=False)
    assert len(slow) == len(fast) > 0
    for a, b in zip(slow, fast):
        assert torch.equal(a, b)
    assert m_slow["actor/pg_loss"] == m_fast["actor/pg_loss"] != 0.0
    assert m_slow["actor/grad_norm"] == m_fast["actor/grad_norm"] > 0.0
    assert m_fast["actor/pg_clipfrac"] == 0.0  # ratio exactly 1 on-policy
    assert m_fast["actor/entropy"] > 0.0  # the skipped pass's metric comes from the update


def test_bypass_ratio_is_against_the_sampler_log_probs(tiny_random_model_dir, char_tokenizer):
    # old = rollout log-probs far from the current policy: the ratio clips, unlike on-policy
    batch = _batch(len(char_tokenizer))
    b = batch.select(list(range(len(batch))))
    b.tensors["old_log_probs"] = torch.full_like(b.tensors["responses"], -20.0, dtype=torch.float32)
    _, m = _update_with_old(tiny_random_model_dir, b)
    assert m["actor/pg_clipfrac"] > 0.0


def _update_with_old(model_dir, b: Batch):
    from dapo.model.loader import load_model

    model = load_model(model_dir)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    return None, Actor(model, opt, _settings(8)).update_policy(b)


BASE = dict(
    bypass_mode=False,
    ppo_epochs=1,
    mini_batch_trajectories=64,
    batch_trajectories=64,
    prefetch=False,
    rollout_correction=False,
    kl_in_reward=False,
)


@pytest.mark.parametrize(
    "change, expected",
    [
        ({}, CURRENT),
        ({"batch_trajectories": 40}, CURRENT),  # a partial step is still one mini-batch
        ({"ppo_epochs": 2}, RECOMPUTE),
        ({"batch_trajectories": 65}, RECOMPUTE),  # two mini-batches: the second is off-policy
        ({"prefetch": True}, RECOMPUTE),
        ({"rollout_correction": True}, RECOMPUTE),
        ({"kl_in_reward": True}, RECOMPUTE),
        ({"fast_path": False}, RECOMPUTE),
        ({"bypass_mode": True, "ppo_epochs": 4}, BYPASS),
    ],
)
def test_old_log_prob_source(change, expected):
    assert old_log_prob_source(**{**BASE, **change}) == expected
