"""Rollout correction: truncated IS weights (token / sequence, TIS / IcePop) and mismatch metrics."""

import math

import pytest
import torch

from dapo.algo.policy_loss import get_policy_loss_fn
from dapo.algo.rollout_correction import (
    compute_offpolicy_metrics,
    compute_rollout_correction,
    compute_rollout_correction_weights,
    compute_rollout_rejection_mask,
    parse_rollout_is_threshold,
)

torch.set_num_threads(1)

MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
# log(pi_train / pi_rollout) per token; padding holds junk that must not matter
LOG_RATIO = torch.tensor([[math.log(3.0), math.log(0.25), 0.0], [math.log(1.5), 5.0, -7.0]])
OLD = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -3.0, -3.0]])
ROLLOUT = OLD - LOG_RATIO


def test_token_tis_hand_vector():
    w, m = compute_rollout_correction_weights(LOG_RATIO, MASK, "token", 2.0)
    assert torch.allclose(w, torch.tensor([[2.0, 0.25, 1.0], [1.5, 0.0, 0.0]]))
    assert not w.requires_grad
    assert m["rollout_is_mean"] == pytest.approx(4.75 / 4)
    assert m["rollout_is_max"] == pytest.approx(2.0) and m["rollout_is_min"] == pytest.approx(0.25)
    assert m["rollout_is_ratio_fraction_high"] == pytest.approx(0.25)  # raw 3 > 2
    assert m["rollout_is_ratio_fraction_low"] == pytest.approx(0.25)  # raw .25 < 1/2
    mean_sq = (4 + 0.0625 + 1 + 2.25) / 4
    assert m["rollout_is_eff_sample_size"] == pytest.approx(1 / (mean_sq / (4.75 / 4) ** 2), rel=1e-5)
    assert m["rollout_is_std"] == pytest.approx(math.sqrt(mean_sq - (4.75 / 4) ** 2), rel=1e-5)
    assert m["rollout_is_seq_mean"] == pytest.approx((3.25 / 3 + 1.5) / 2, rel=1e-6)


def test_sequence_tis_hand_vector():
    w, m = compute_rollout_correction_weights(LOG_RATIO, MASK, "sequence", 2.0)
    # row 0: 3 * 0.25 * 1 = 0.75 on every valid token; row 1: 1.5
    assert torch.allclose(w, torch.tensor([[0.75, 0.75, 0.75], [1.5, 0.0, 0.0]]))
    assert m["rollout_is_max"] == pytest.approx(1.5) and m["rollout_is_min"] == pytest.approx(0.75)
    w, _ = compute_rollout_correction_weights(LOG_RATIO, MASK, "sequence", 1.0)
    assert torch.allclose(w, torch.tensor([[0.75, 0.75, 0.75], [1.0, 0.0, 0.0]]))


def test_icepop_and_batch_normalize():
    w, m = compute_rollout_correction_weights(LOG_RATIO, MASK, "token", "0.5_2.0")
    assert torch.allclose(w, torch.tensor([[0.0, 0.0, 1.0], [1.5, 0.0, 0.0]]))
    assert m["rollout_is_oob_ratio"] == pytest.approx(0.5)
    w, m = compute_rollout_correction_weights(LOG_RATIO, MASK, "token", 2.0, rollout_is_batch_normalize=True)
    assert m["rollout_is_batch_norm_factor"] == pytest.approx(4.75 / 4)
    assert (w * MASK).sum().item() / 4 == pytest.approx(1.0)


def test_threshold_parsing_and_bad_levels():
    assert parse_rollout_is_threshold(2.0) == (2.0, None)
    assert parse_rollout_is_threshold("0.5_3") == (3.0, 0.5)
    assert parse_rollout_is_threshold(" 4 ") == (4.0, None)
    for bad in ["x", "3_1", "0_2", -1.0]:
        with pytest.raises(ValueError):
            parse_rollout_is_threshold(bad)
    with pytest.raises(TypeError):
        parse_rollout_is_threshold(True)
    with pytest.raises(ValueError, match="rollout_is"):
        compute_rollout_correction_weights(LOG_RATIO, MASK, "geometric", 2.0)


def test_offpolicy_metrics_hand_vector():
    m = compute_offpolicy_metrics(OLD, ROLLOUT, MASK)
    r = [3.0, 0.25, 1.0, 1.5]
    assert m["kl"] == pytest.approx(-sum(math.log(x) for x in r) / 4, abs=1e-6)
    assert m["k3_kl"] == pytest.approx(sum(x - math.log(x) - 1 for x in r) / 4, abs=1e-6)
    assert m["training_ppl"] == pytest.approx((math.exp(3.5 / 3) + math.exp(1.0)) / 2, rel=1e-6)
    assert m["training_log_ppl"] == pytest.approx((3.5 / 3 + 1.0) / 2, rel=1e-6)
    assert m["chi2_token"] == pytest.approx(sum(x * x for x in r) / 4 - 1, rel=1e-6)
    assert m["chi2_seq"] == pytest.approx((0.75**2 + 1.5**2) / 2 - 1, rel=1e-6)
    # per-row log-ppl difference: mean log pi_rollout - mean log pi_train = -mean log ratio
    d = [-math.log(0.75) / 3, -math.log(1.5)]
    assert m["log_ppl_diff"] == pytest.approx(sum(d) / 2, abs=1e-6)
    assert m["log_ppl_diff_max"] == pytest.approx(max(d), abs=1e-6)
    assert m["ppl_ratio"] == pytest.approx(sum(math.exp(x) for x in d) / 2, rel=1e-6)
    assert set(compute_offpolicy_metrics(OLD, None, MASK)) == {"training_ppl", "training_log_ppl"}


def test_compute_rollout_correction_prefix_and_off_switch():
    weights, new_mask, metrics = compute_rollout_correction(
        OLD, ROLLOUT, MASK, rollout_is="token", rollout_is_threshold=2.0
    )
    assert torch.allclose(weights, torch.tensor([[2.0, 0.25, 1.0], [1.5, 0.0, 0.0]]), atol=1e-6)
    assert all(k.startswith("rollout_corr/") for k in metrics)
    assert {"rollout_corr/rollout_is_mean", "rollout_corr/kl", "rollout_corr/ppl_ratio"} <= set(metrics)
    weights, new_mask, metrics = compute_rollout_correction(OLD, ROLLOUT, MASK)
    assert torch.equal(new_mask, MASK)
    assert weights is None and "rollout_corr/kl" in metrics and "rollout_corr/rollout_is_mean" not in metrics
    with pytest.raises(ValueError, match="shape"):
        compute_rollout_correction(OLD, ROLLOUT[:, :2], MASK)


def test_weights_feed_the_policy_loss():
    weights, _, _ = compute_rollout_correction(
        OLD, ROLLOUT, MASK, rollout_is="token", rollout_is_threshold=2.0
    )
    adv = torch.ones(2, 3)
    loss, _ = get_policy_loss_fn("vanilla")(OLD, OLD, adv, MASK, "token-mean", None, weights)
    # on-policy ratio 1: per-token loss -1, weighted by w
    assert loss.item() == pytest.approx(-(2.0 + 0.25 + 1.0 + 1.5) / 4, abs=1e-6)


def test_rejection_token_and_sequence_hand_vectors():
    # token_k1 keeps log(lower) <= -log_ratio <= log(upper), i.e. pi_rollout/pi_train in [1/2, 2]:
    # ratios pi_train/pi_rollout are [3, .25, 1 | 1.5] -> tokens 0 and 1 of row 0 are rejected
    mask, m = compute_rollout_rejection_mask(LOG_RATIO, MASK, "token_k1", 2.0)
    assert mask.tolist() == [[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]
    assert m["rollout_rs_token_k1_masked_fraction"] == pytest.approx(0.5)
    assert m["rollout_rs_masked_fraction"] == pytest.approx(0.5)
    assert m["rollout_rs_seq_masked_fraction"] == pytest.approx(0.5)
    # seq_max_k2: max of x^2/2 per row: row 0 (ln 4)^2/2 = 0.961, row 1 (ln 1.5)^2/2 = 0.082
    mask, m = compute_rollout_rejection_mask(LOG_RATIO, MASK, "seq_max_k2", 0.5)
    assert mask.tolist() == [[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]]
    assert m["rollout_rs_seq_max_k2_max"] == pytest.approx(math.log(4) ** 2 / 2, rel=1e-6)
    # several options: every one must keep the token; per-option thresholds comma separated
    mask, _ = compute_rollout_rejection_mask(LOG_RATIO, MASK, "token_k3, seq_mean_k1", "10,0.5_2")
    # k3 = r - 1 - ln r <= 10 everywhere; seq_mean_k1: row 0 mean(-x) = -ln(.75)/3 within ln .5..ln 2
    assert torch.equal(mask, MASK)
    with pytest.raises(ValueError, match="token_k1"):
        compute_rollout_rejection_mask(LOG_RATIO, MASK, "token_k4", 2.0)
    with pytest.raises(ValueError, match="rollout_rs_threshold"):
        compute_rollout_rejection_mask(LOG_RATIO, MASK, "token_k2", None)
    with pytest.raises(ValueError, match="single upper bound"):
        compute_rollout_rejection_mask(LOG_RATIO, MASK, "token_k2", "0.1_2")
    _, new_mask, metrics = compute_rollout_correction(
        OLD, ROLLOUT, MASK, rollout_rs="token_k1", rollout_rs_threshold=2.0
    )
    assert new_mask.tolist() == [[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]
    assert "rollout_corr/rollout_rs_masked_fraction" in metrics
