"""Policy losses: verl 0.9.1 vectors (docs/verl_compat.md), hand vectors per mode, clip/dual-clip invariants."""

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo.algo.agg import compute_global_batch_info
from dapo.algo.policy_loss import (
    POLICY_LOSS_REGISTRY,
    get_policy_loss_fn,
    register_policy_loss,
)
from fixtures.loss_helpers import loss_config

torch.set_num_threads(1)

# Appendix A: old p = 0.5 everywhere, new p as below, A = +1 on row 0 and -1 on row 1.
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
OLD = torch.full((2, 4), 0.5).log()
NEW = torch.tensor([[0.7, 0.3, 0.5, 0.5], [0.2, 0.9, 0.5, 0.5]]).log()
ADV = torch.tensor([[1.0] * 4, [-1.0] * 4])
DAPO = loss_config(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)


def _loss(mode, config=DAPO, agg="token-mean", new=NEW, weights=None):
    return get_policy_loss_fn(mode)(OLD, new, ADV, MASK, agg, config, weights)


def test_appendix_a_vanilla():
    loss, m = _loss("vanilla")
    assert loss.item() == pytest.approx(-0.056, abs=1e-6)
    assert m == pytest.approx(
        {"actor/pg_clipfrac": 0.4, "actor/ppo_kl": 0.100571, "actor/pg_clipfrac_lower": 0.0}, abs=1e-6
    )
    loss, m = _loss("vanilla", loss_config(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=1.5))
    assert loss.item() == pytest.approx(-0.116, abs=1e-6)
    assert m["actor/pg_clipfrac_lower"] == pytest.approx(0.2, abs=1e-6)


def test_vanilla_hand_derivation_and_config_forms():
    # ratios: row 0 [1.4, .6, 1], row 1 [.4, 1.8]; clip to [.8, 1.28]
    # row 0 (A=+1): max(-r, -clip r) = [-1.28, -.6, -1]; row 1 (A=-1): max(r, clip r) = [.8, 1.8]
    total = -1.28 - 0.6 - 1.0 + 0.8 + 1.8
    assert _loss("vanilla")[0].item() == pytest.approx(total / 5, abs=1e-6)
    assert _loss("vanilla", agg="seq-mean-token-mean")[0].item() == pytest.approx(
        ((-1.28 - 0.6 - 1.0) / 3 + (0.8 + 1.8) / 2) / 2, abs=1e-6
    )
    as_dict = {"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0}
    assert _loss("vanilla", as_dict)[0].item() == pytest.approx(total / 5, abs=1e-6)
    # a null clip_ratio_low / high is filled from clip_ratio by the config (dapo.config.resolve), not here
    with pytest.raises(ValueError, match="clip_ratio_low is null"):
        _loss("vanilla", loss_config(clip_ratio=0.28, clip_ratio_low=None, clip_ratio_high=None))
    # config None: verl defaults (0.2 / 0.2 / 3.0)
    assert _loss("vanilla", None)[0].item() == pytest.approx((-1.2 - 0.6 - 1.0 + 0.8 + 1.8) / 5, abs=1e-6)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        _loss("vanilla", loss_config(clip_ratio_c=1.0))


def test_rollout_is_weights_multiply_the_token_loss():
    base = _loss("vanilla")[0]
    assert _loss("vanilla", weights=torch.full((2, 4), 0.5))[0].item() == pytest.approx(0.5 * base.item())
    w = torch.tensor([[1.0, 0.0, 0.0, 9.0], [0.0, 2.0, 9.0, 9.0]])
    assert _loss("vanilla", weights=w)[0].item() == pytest.approx((-1.28 + 2 * 1.8) / 5, abs=1e-6)


def test_global_batch_info_is_used():
    cfg = loss_config({"dp_size": 1, "batch_num_tokens": 10}, clip_ratio_low=0.2, clip_ratio_high=0.28)
    assert _loss("vanilla", cfg)[0].item() == pytest.approx(-0.28 / 10, abs=1e-6)


def test_gspo_hand_vector():
    s0 = math.exp((math.log(1.4) + math.log(0.6)) / 3)  # sequence ratio, row 0
    s1 = math.exp((math.log(0.4) + math.log(1.8)) / 2)  # row 1
    # both inside [0.8, 1.28]: row 0 loss -s0 per token, row 1 loss +s1 per token
    loss, m = _loss("gspo")
    assert loss.item() == pytest.approx((-3 * s0 + 2 * s1) / 5, abs=1e-6)
    loss, _ = _loss("gspo", agg="seq-mean-token-mean")
    assert loss.item() == pytest.approx((-s0 + s1) / 2, abs=1e-6)
    assert m["actor/pg_clipfrac"] == 0.0 and m["actor/pg_clipfrac_lower"] == 0.0
    assert m["actor/ppo_kl"] == pytest.approx(_loss("vanilla")[1]["actor/ppo_kl"], abs=1e-7)
    # gradient: d loss / d log_prob_t = -A * s_i / 5 (the token's own log-prob carries s_i)
    new = NEW.clone().requires_grad_(True)
    _loss("gspo", new=new)[0].backward()
    assert new.grad[0, :3].tolist() == pytest.approx([-s0 / 5] * 3, abs=1e-6)
    assert new.grad[1, :2].tolist() == pytest.approx([s1 / 5] * 2, abs=1e-6)
    assert torch.all(new.grad[MASK == 0] == 0)


def test_geo_mean_hand_vector():
    cfg = loss_config(clip_ratio_low=0.4, clip_ratio_high=0.4)  # GMPO recipe values
    d0 = [math.log(1.4), math.log(0.6), 0.0]
    # A>0: min(d, clamp(d, -.4, .4)) keeps -0.51 (pessimistic), clamps nothing upward here
    r0 = math.exp(sum(min(x, max(-0.4, min(0.4, x))) for x in d0) / 3)
    # A<0: max(d, clamp(d)) -> log .4 = -0.916 becomes -0.4; log 1.8 = 0.588 stays
    r1 = math.exp((-0.4 + math.log(1.8)) / 2)
    loss, m = _loss("geo_mean", cfg)
    assert loss.item() == pytest.approx((-r0 + r1) / 2, abs=1e-6)
    assert m["actor/pg_clipfrac"] == pytest.approx(1 / 5, abs=1e-6)  # row 0 token 1 (A>0)
    assert m["actor/pg_clipfrac_lower"] == pytest.approx(2 / 5, abs=1e-6)  # both row-1 tokens
    cfg = dataclasses.replace(cfg, global_batch_info={"dp_size": 1, "global_batch_size": 4})
    assert _loss("geo_mean", cfg)[0].item() == pytest.approx((-r0 + r1) / 4, abs=1e-6)


def test_cispo_hand_vector_and_gradient():
    clipped = [[1.28, 0.8, 1.0], [0.8, 1.28]]
    logp = [[math.log(0.7), math.log(0.3), math.log(0.5)], [math.log(0.2), math.log(0.9)]]
    total = sum(-c * lp for c, lp in zip(clipped[0], logp[0])) + sum(
        c * lp for c, lp in zip(clipped[1], logp[1])
    )
    new = NEW.clone().requires_grad_(True)
    loss, m = get_policy_loss_fn("cispo")(OLD, new, ADV, MASK, "token-mean", DAPO)
    assert loss.item() == pytest.approx(total / 5, abs=1e-6)
    assert m["actor/pg_clipfrac"] == pytest.approx(4 / 5, abs=1e-6)  # ratio 1.0 is the only unclipped
    loss.backward()
    # every token keeps a gradient: -sg(clip r) * A / 5, even where PPO would clip
    assert new.grad[0, :3].tolist() == pytest.approx([-1.28 / 5, -0.8 / 5, -1.0 / 5], abs=1e-6)
    assert new.grad[1, :2].tolist() == pytest.approx([0.8 / 5, 1.28 / 5], abs=1e-6)


def test_clip_cov_selection():
    # no candidate in (lb, ub): plain PPO clip loss (no dual clip)
    none = loss_config(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_cov_lb=100.0, clip_cov_ub=101.0)
    loss, m = _loss("clip_cov", none)
    assert loss.item() == pytest.approx(-0.056, abs=1e-6)
    assert m == pytest.approx({"actor/pg_clipfrac": 0.0, "actor/ppo_kl": 0.100571}, abs=1e-6)
    # every unclipped token is a candidate and all are taken (ratio 1): only the two PPO-clipped
    # tokens keep their loss: (-1.28 + 0.8) / 5; clipfrac = 3 zeroed / 5
    nested = {
        "clip_ratio": 0.2,
        "clip_ratio_low": 0.2,
        "clip_ratio_high": 0.28,
        "policy_loss": {"clip_cov_ratio": 1.0, "clip_cov_lb": -10.0, "clip_cov_ub": 10.0},
    }
    loss, m = _loss("clip_cov", nested)
    assert loss.item() == pytest.approx((-1.28 + 0.8) / 5, abs=1e-6)
    assert m["actor/pg_clipfrac"] == pytest.approx(3 / 5, abs=1e-6)


def test_kl_cov_hand_vectors():
    abs_d = [abs(math.log(1.4)), abs(math.log(0.6)), 0.0, abs(math.log(0.4)), abs(math.log(1.8))]
    base = (-1.4 - 0.6 - 1.0) + (0.4 + 1.8)  # unclipped -A r
    cfg = loss_config(kl_cov_ratio=1.0, ppo_kl_coef=0.5)  # every token penalised
    loss, m = _loss("kl_cov", cfg)
    assert loss.item() == pytest.approx((base + 0.5 * sum(abs_d)) / 5, abs=1e-6)
    assert m == pytest.approx({"actor/ppo_kl": sum(abs_d) / 5}, abs=1e-6)
    # default ratio 2e-4 -> one token: the largest (A - mean A)(logp - mean logp) is row 1 token 0
    loss, _ = _loss("kl_cov", loss_config(ppo_kl_coef=0.5))
    assert loss.item() == pytest.approx((base + 0.5 * abs_d[3]) / 5, abs=1e-6)


def test_registry():
    assert {"vanilla", "gspo", "geo_mean", "cispo", "clip_cov", "kl_cov"} <= set(POLICY_LOSS_REGISTRY)
    with pytest.raises(ValueError, match="vanilla"):
        get_policy_loss_fn("ppo")

    @register_policy_loss("test_reinforce")
    def reinforce(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
                  rollout_is_weights=None):  # fmt: skip
        return (-(advantages * log_prob) * response_mask).sum(), {}

    try:
        assert get_policy_loss_fn("test_reinforce") is reinforce
    finally:
        POLICY_LOSS_REGISTRY.pop("test_reinforce")


def test_policy_loss_config_reads_like_verl():
    cfg = loss_config({"dp_size": 1}, clip_cov_ratio=0.5)
    assert cfg.policy_loss.clip_cov_ratio == 0.5 and cfg.clip_ratio_high == 0.2
    assert cfg.get("clip_ratio_c", 9.0) == 3.0 and cfg.get("missing", 7) == 7
    assert cfg.global_batch_info == {"dp_size": 1}


# ------------------------------------------------------------------------------------------
# invariants
# ------------------------------------------------------------------------------------------

EPS_LOW, EPS_HIGH = 0.2, 0.28


@st.composite
def tokens(draw, lo=-1.5, hi=1.5):
    b = draw(st.integers(1, 5))
    t = draw(st.integers(1, 5))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3 - 0.01
    log_ratio = torch.empty(b, t, dtype=torch.float64).uniform_(lo, hi, generator=g)
    adv = torch.randn(b, t, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    mask = (torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)).to(torch.float64)
    return old, old + log_ratio, adv, mask


@settings(max_examples=60, deadline=None)
@given(data=tokens(lo=math.log(1 - EPS_LOW) + 1e-6, hi=math.log(1 + EPS_HIGH) - 1e-6))
def test_clipped_equals_unclipped_inside_trust_region(data):
    old, new, adv, mask = data
    cfg = loss_config(clip_ratio_low=EPS_LOW, clip_ratio_high=EPS_HIGH, clip_ratio_c=3.0)
    x = new.clone().requires_grad_(True)
    loss, m = get_policy_loss_fn("vanilla")(old, x, adv, mask, "token-mean", cfg)
    loss.backward()
    y = new.clone().requires_grad_(True)
    plain = (-adv * torch.exp(y - old) * mask).sum() / mask.sum()
    plain.backward()
    assert torch.allclose(loss, plain, atol=1e-12)
    assert torch.allclose(x.grad, y.grad, atol=1e-12)
    assert m["actor/pg_clipfrac"] == 0.0 and m["actor/pg_clipfrac_lower"] == 0.0


def _per_token_loss(mode, old, new, adv, mask, cfg):
    out = torch.zeros_like(new)
    for i in range(new.shape[0]):
        for j in range(new.shape[1]):
            if mask[i, j] == 0:
                continue
            one = torch.zeros_like(mask)
            one[i, j] = 1
            out[i, j] = get_policy_loss_fn(mode)(old, new, adv, one, "token-sum", cfg)[0]
    return out


@settings(max_examples=40, deadline=None)
@given(data=tokens(lo=-3.0, hi=4.0), c=st.floats(1.05, 5.0))
def test_dual_clip_bounds_negative_advantage_loss(data, c):
    old, new, adv, mask = data
    cfg = loss_config(clip_ratio_low=EPS_LOW, clip_ratio_high=EPS_HIGH, clip_ratio_c=c)
    per_token = _per_token_loss("vanilla", old, new, adv, mask, cfg)
    neg = (adv < 0) & (mask > 0)
    assert torch.all(per_token[neg] <= -adv[neg] * c + 1e-9)
    ratio = torch.exp(new - old)
    beyond = neg & (ratio > c)
    assert torch.allclose(per_token[beyond], -adv[beyond] * c)
    # positive advantages are never dual-clipped: loss = max(-A r, -A clip(r))
    pos = (adv >= 0) & (mask > 0)
    ppo = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - EPS_LOW, 1 + EPS_HIGH))
    assert torch.allclose(per_token[pos], ppo[pos])


@pytest.mark.parametrize("mode", ["vanilla", "gspo", "cispo", "geo_mean", "kl_cov"])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@settings(max_examples=15, deadline=None)
@given(data=tokens(), cut=st.integers(1, 4))
def test_micro_batched_loss_equals_full_batch(mode, agg, data, cut):
    old, new, adv, mask = data
    if old.shape[0] < 2:
        return
    cut = min(cut, old.shape[0] - 1)
    adv = adv[:, :1].expand_as(adv).contiguous()  # sequence-level advantages (GMPO assumes them)
    cfg = loss_config(clip_ratio_low=EPS_LOW, clip_ratio_high=EPS_HIGH, kl_cov_ratio=1.0)
    fn = get_policy_loss_fn(mode)
    x = new.clone().requires_grad_(True)
    full, _ = fn(old, x, adv, mask, agg, cfg)
    full.backward()
    cfg = dataclasses.replace(cfg, global_batch_info=compute_global_batch_info(mask))
    y = new.clone().requires_grad_(True)
    total = sum(fn(old[s], y[s], adv[s], mask[s], agg, cfg)[0] for s in (slice(0, cut), slice(cut, None)))
    total.backward()
    assert torch.allclose(total, full, atol=1e-10)
    assert torch.allclose(y.grad, x.grad, atol=1e-10)
