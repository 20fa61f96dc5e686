"""The algorithm functions give the CPU numbers on a CUDA device (skipped without one)."""

import numpy as np
import pytest
import torch

from dapo.algo import (
    agg_loss,
    compute_global_batch_info,
    compute_rollout_correction,
    get_adv_estimator_fn,
    get_policy_loss_fn,
    kl_penalty,
    logprobs_and_entropy,
)
from fixtures.loss_helpers import loss_config

torch.set_num_threads(1)
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def _inputs(device):
    g = torch.Generator().manual_seed(0)
    b, t = 8, 6
    mask = (torch.arange(t) < torch.randint(1, t + 1, (b,), generator=g).unsqueeze(1)).float()
    old = -torch.rand(b, t, generator=g) * 2
    new = old + 0.3 * torch.randn(b, t, generator=g)
    rewards = torch.zeros(b, t)
    rewards[torch.arange(b), mask.sum(-1).long() - 1] = torch.randint(0, 2, (b,), generator=g).float()
    logits = torch.randn(b, t, 50, generator=g)
    labels = torch.randint(0, 50, (b, t), generator=g)
    return [x.to(device) for x in (mask, old, new, rewards, logits, labels)]


def _run(device):
    mask, old, new, rewards, logits, labels = _inputs(device)
    out = {}
    index = np.array([i // 4 for i in range(mask.shape[0])])
    for name in ["grpo", "rloo", "opo", "reinforce_plus_plus_baseline", "grpo_passk", "reinforce_plus_plus"]:
        out[name] = get_adv_estimator_fn(name)(token_level_rewards=rewards, response_mask=mask, index=index)[
            0
        ]
    adv = out["grpo"]
    cfg = loss_config(compute_global_batch_info(mask), clip_ratio_low=0.2, clip_ratio_high=0.28, kl_cov_ratio=0.2,
                      clip_cov_ratio=1.0, clip_cov_lb=-10.0, clip_cov_ub=10.0)  # fmt: skip
    for mode in ["vanilla", "gspo", "geo_mean", "cispo", "clip_cov", "kl_cov"]:
        x = new.clone().requires_grad_(True)
        loss, _ = get_policy_loss_fn(mode)(old, x, adv, mask, "token-mean", cfg)
        loss.backward()
        out[mode], out[mode + ".grad"] = loss, x.grad
    out["agg"] = agg_loss(new, mask, "seq-mean-token-sum-norm")
    out["k3+"] = kl_penalty(new, old, "k3+")
    out["tis"], out["rs"], _ = compute_rollout_correction(
        old, new, mask, "token", 2.0, rollout_rs="seq_mean_k3,token_k1", rollout_rs_threshold="0.05,0.7_1.5"
    )
    x = logits.clone().requires_grad_(True)
    lp, h = logprobs_and_entropy(x, labels, 0.7, True, chunk_rows=7)
    (lp + h).sum().backward()
    out["lp"], out["h"], out["dlogits"] = lp, h, x.grad
    return out


def test_cuda_matches_cpu():
    cpu, gpu = _run("cpu"), _run("cuda")
    for key, value in cpu.items():
        assert gpu[key].device.type == "cuda", key
        assert torch.allclose(gpu[key].cpu(), value, atol=1e-5), key
