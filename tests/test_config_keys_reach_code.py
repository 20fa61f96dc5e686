"""Each actor / algorithm / reward-shaping key reaches the code that uses it: on a fixed batch,
changing the key (from the command-line config, through the same builders the trainer uses)
changes the update, the advantages or the token rewards. A key that is read by nothing fails."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dapo.actor.dp_actor import Actor, actor_settings_from_config, compute_log_prob
from dapo.algo.advantages import get_adv_estimator_fn
from dapo.bench.common import padded_rl_batch
from dapo.reward.factory import build_reward_manager
from fixtures.config_helpers import run_config
from fixtures.reward_helpers import CharTokenizer, make_batch

# the baseline every case differs from in one key: 4 prompts x n=2, two mini-batches, KL loss on
BASE = [
    "data.train_batch_size=4",
    "data.gen_batch_size=4",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.actor.clip_ratio_low=0.2",
    "actor_rollout_ref.actor.clip_ratio_high=0.28",
    "actor_rollout_ref.actor.clip_ratio_c=3.0",
    "actor_rollout_ref.actor.use_kl_loss=true",
    "actor_rollout_ref.actor.kl_loss_coef=0.1",
    "actor_rollout_ref.actor.grad_clip=1000.0",
]

ACTOR_CASES = [
    "actor_rollout_ref.actor.clip_ratio_low=0.05",
    "actor_rollout_ref.actor.clip_ratio_high=0.05",
    ["actor_rollout_ref.actor.clip_ratio_low=null", "actor_rollout_ref.actor.clip_ratio=0.05"],
    "actor_rollout_ref.actor.clip_ratio_c=1.5",
    "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum",
    "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
    [
        "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm",
        "actor_rollout_ref.actor.loss_scale_factor=3",
    ],
    "actor_rollout_ref.actor.entropy_coeff=0.1",
    "actor_rollout_ref.actor.use_kl_loss=false",
    "actor_rollout_ref.actor.kl_loss_coef=0.5",
    "actor_rollout_ref.actor.kl_loss_type=mse",
    "actor_rollout_ref.actor.ppo_epochs=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.grad_clip=0.01",
    ["actor_rollout_ref.actor.shuffle=true", "actor_rollout_ref.actor.data_loader_seed=3"],
    "actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
    "actor_rollout_ref.actor.policy_loss.loss_mode=cispo",
    [
        "actor_rollout_ref.actor.policy_loss.loss_mode=clip_cov",
        "actor_rollout_ref.actor.policy_loss.clip_cov_ratio=0.5",
    ],
    [
        "actor_rollout_ref.actor.policy_loss.loss_mode=kl_cov",
        "actor_rollout_ref.actor.policy_loss.kl_cov_ratio=0.5",
    ],
    "actor_rollout_ref.rollout.temperature=0.5",
]


@pytest.fixture(scope="module")
def fixed(tiny_random_model_dir, char_tokenizer):
    """(initial weights, batch): old log-probs near the model's own, so the clip ranges and the
    dual clip all bind somewhere; advantages of both signs."""
    from dapo.model.loader import load_model

    model = load_model(tiny_random_model_dir)
    model.config.use_cache = False
    g = torch.Generator().manual_seed(0)
    rows = 8
    batch = padded_rl_batch(
        torch.randint(2, 6, (rows,), generator=g),
        torch.randint(2, 8, (rows,), generator=g),
        5,
        7,
        len(char_tokenizer),
        g,
        token_low=7,
        group_size=2,
    )
    mask = batch.tensors["response_mask"].float()
    own, _ = compute_log_prob(model, batch, 1.0, rows)
    # log-ratios within +-2 on every other row (the dual clip binds), within +-0.3 on the others
    # (the clip ranges bind)
    spread = torch.tensor([2.0, 0.3] * 4).unsqueeze(1)
    batch.tensors["old_log_probs"] = (own + (torch.rand(own.shape, generator=g) * 2 - 1) * spread) * mask
    batch.tensors["ref_log_prob"] = (own + (torch.rand(own.shape, generator=g) * 2 - 1)) * mask
    return {k: v.clone() for k, v in model.state_dict().items()}, batch, tiny_random_model_dir


def _update(fixed, overrides: list[str]) -> torch.Tensor:
    """The parameter change of one update_policy call (plain SGD: proportional to the gradients)."""
    from dapo.model.loader import load_model

    state, batch, model_dir = fixed
    model = load_model(model_dir)
    model.config.use_cache = False
    model.load_state_dict(state)
    settings = actor_settings_from_config(run_config(*BASE, *overrides))
    Actor(model, torch.optim.SGD(model.parameters(), lr=1e-3), settings).update_policy(batch)
    return torch.cat([(p.detach() - state[k]).flatten() for k, p in model.named_parameters()])


def test_every_actor_key_changes_the_update(fixed):
    base = _update(fixed, [])
    assert base.abs().max() > 0
    assert torch.equal(base, _update(fixed, [])), "the update must be deterministic for this test"
    unchanged = []
    for case in ACTOR_CASES:
        overrides = [case] if isinstance(case, str) else case
        if torch.allclose(_update(fixed, overrides), base, rtol=1e-4, atol=1e-7):
            unchanged.append(overrides)
    assert not unchanged, f"these settings did not change the update: {unchanged}"


def test_micro_batch_size_does_not_change_the_update(fixed):
    """The one actor size that must not matter (the gradient is the mini-batch's either way)."""
    base = _update(fixed, [])
    split = _update(fixed, ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1"])
    torch.testing.assert_close(split, base, rtol=1e-4, atol=1e-6)


def _advantages(overrides: list[str]) -> torch.Tensor:
    """Advantages as the trainer computes them from the resolved config."""
    alg = run_config(*overrides).algorithm
    g = torch.Generator().manual_seed(1)
    mask = torch.ones(8, 5)
    mask[:, 3:] = torch.tensor([[1, 0]] * 4 + [[0, 0]] * 4, dtype=torch.float)
    rewards = torch.zeros(8, 5)
    rewards[:, 2] = torch.randint(0, 3, (8,), generator=g).float()
    rewards[:, 1] = torch.rand(8, generator=g) * 0.5
    adv, _ = get_adv_estimator_fn(alg.adv_estimator)(
        token_level_rewards=rewards,
        response_mask=mask,
        index=np.array([str(i // 4) for i in range(8)]),
        norm_adv_by_std_in_grpo=alg.norm_adv_by_std_in_grpo,
        config=alg,
        epsilon=1e-6,
    )
    return adv


@pytest.mark.parametrize(
    "overrides",
    [
        ["algorithm.adv_estimator=rloo"],
        ["algorithm.adv_estimator=reinforce_plus_plus"],
        ["algorithm.adv_estimator=opo"],
        ["algorithm.norm_adv_by_std_in_grpo=false"],
        [["algorithm.adv_estimator=reinforce_plus_plus"], ["algorithm.gamma=0.5"]],
    ],
)
def test_every_algorithm_key_changes_the_advantages(overrides):
    if isinstance(overrides[0], list):  # (base, change) for keys read by one estimator only
        base, change = overrides
        before, after = _advantages(base), _advantages(base + change)
    else:
        before, after = _advantages([]), _advantages(overrides)
    assert not torch.allclose(before, after)


def _scores(overrides: list[str]) -> torch.Tensor:
    cfg = run_config("data.max_response_length=10", *overrides)
    batch = make_batch(["Answer: 7", "Answer: 12345", "Answer: 8"], ["7", "7", "7"], response_len=16)
    with build_reward_manager(cfg, CharTokenizer()) as mgr:
        return mgr(batch)[0]


def test_overlong_and_manager_keys_change_the_token_rewards():
    # default preset: reward_manager dapo, overlong buffer on (len 8 of 24); here max length 10
    base = _scores(["reward_model.overlong_buffer.len=4"])
    # length 9 and 13 exceed 10 - 4 = 6 by 3 and 7 (capped at the buffer): hand-computed penalties
    assert base.sum(-1).tolist() == pytest.approx([1.0 - 3 / 4, -1.0 - 7 / 4, -1.0 - 3 / 4])
    for change in (
        ["reward_model.overlong_buffer.len=2"],
        ["reward_model.overlong_buffer.penalty_factor=0.5"],
        ["reward_model.overlong_buffer.enable=false"],
        ["reward_model.reward_manager=naive"],
    ):
        assert not torch.equal(_scores(["reward_model.overlong_buffer.len=4", *change]), base), change
