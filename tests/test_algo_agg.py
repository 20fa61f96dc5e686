"""agg_loss: verl 0.9.1 vectors (docs/verl_compat.md), and exactness under micro-batching and padding."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo.algo.agg import LOSS_AGG_MODES, agg_loss, check_loss_agg_mode, compute_global_batch_info

torch.set_num_threads(1)

MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
LOSS = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 5.0, 100.0, 100.0]])


@pytest.mark.parametrize(
    "mode,expected",
    [
        ("token-mean", 3.0),  # 15 / 5
        ("token-sum", 15.0),
        ("seq-mean-token-sum", 7.5),  # (6 + 9) / 2
        ("seq-mean-token-mean", 3.25),  # (2 + 4.5) / 2
        ("seq-mean-token-sum-norm", 1.875),  # 7.5 / 4 (0.9.1; Jan-2026 main gives 3.75)
    ],
)
def test_appendix_a_vectors(mode, expected):
    assert agg_loss(LOSS, MASK, mode).item() == pytest.approx(expected, abs=1e-6)


def test_appendix_a_global_counts():
    assert agg_loss(LOSS, MASK, "token-mean", dp_size=2, batch_num_tokens=10).item() == pytest.approx(3.0)
    assert agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", loss_scale_factor=8).item() == pytest.approx(
        0.9375
    )
    # seq modes with a global row count: (6 + 9) / 5 * 2
    assert agg_loss(LOSS, MASK, "seq-mean-token-sum", dp_size=2, global_batch_size=5).item() == pytest.approx(
        6.0
    )


def test_nan_outside_mask_does_not_leak():
    loss = LOSS.clone()
    loss[0, 3] = float("nan")
    loss[1, 2] = float("inf")
    for mode in LOSS_AGG_MODES:
        assert torch.isfinite(agg_loss(loss, MASK, mode))


def test_unknown_mode_names_valid_ones():
    with pytest.raises(ValueError) as err:
        agg_loss(LOSS, MASK, "token_mean")
    for mode in LOSS_AGG_MODES:
        assert mode in str(err.value)
    with pytest.raises(ValueError):
        check_loss_agg_mode("seq-mean")


def test_dp_size_requires_global_counts():
    with pytest.raises(ValueError, match="batch_num_tokens"):
        agg_loss(LOSS, MASK, "token-mean", dp_size=2)
    with pytest.raises(ValueError, match="global_batch_size"):
        agg_loss(LOSS, MASK, "seq-mean-token-mean", dp_size=2)
    assert agg_loss(LOSS, MASK, "token-sum", dp_size=2).item() == pytest.approx(30.0)


def test_fully_masked_rows_do_not_count_and_empty_batch_gives_zero():
    mask = torch.cat([MASK, torch.zeros(1, 4, dtype=MASK.dtype)])
    loss = torch.cat([LOSS, torch.full((1, 4), 7.0)])
    for mode in LOSS_AGG_MODES:
        assert agg_loss(loss, mask, mode).item() == pytest.approx(agg_loss(LOSS, MASK, mode).item())
    empty = torch.zeros_like(MASK)
    for mode in LOSS_AGG_MODES:
        value = agg_loss(LOSS, empty, mode)
        assert value.item() == 0.0  # verl gives NaN here; 0 is the only sensible value


def test_compute_global_batch_info():
    mask = torch.cat([MASK, torch.zeros(1, 4, dtype=MASK.dtype)])
    info = compute_global_batch_info(mask, dp_size=1, loss_scale_factor=4)
    assert info == {"dp_size": 1, "batch_num_tokens": 5, "global_batch_size": 2, "loss_scale_factor": 4}


# ------------------------------------------------------------------------------------------
# hypothesis: micro-batch splits and padding width
# ------------------------------------------------------------------------------------------


@st.composite
def minibatch(draw):
    b = draw(st.integers(1, 7))
    t = draw(st.integers(1, 6))
    lengths = draw(st.lists(st.integers(0, t), min_size=b, max_size=b))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    mask = (torch.arange(t).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).float()
    weights = torch.randn(b, t, generator=gen, dtype=torch.float64)
    # split points: sorted unique cut positions in (0, b)
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, b - 1)), max_size=4)))) if b > 1 else []
    return mask, weights, cuts


def _loss_and_grad(weights, mask, mode, **info):
    w = weights.clone().requires_grad_(True)
    loss_mat = w**2 + torch.sin(w)  # a non-linear per-token loss
    value = agg_loss(loss_mat, mask, mode, **info)
    value.backward()
    return value.detach(), w.grad


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@settings(max_examples=60, deadline=None)
@given(data=minibatch())
def test_micro_batches_sum_to_full_batch_value_and_gradient(mode, data):
    mask, weights, cuts = data
    full_value, full_grad = _loss_and_grad(weights, mask, mode)
    info = compute_global_batch_info(mask)
    bounds = [0, *cuts, mask.shape[0]]
    total = torch.zeros((), dtype=torch.float64)
    grad = torch.zeros_like(weights)
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        value, g = _loss_and_grad(weights[lo:hi], mask[lo:hi], mode, **info)
        total += value
        grad[lo:hi] = g
    assert torch.allclose(total, full_value, atol=1e-12, rtol=1e-10)
    assert torch.allclose(grad, full_grad, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@settings(max_examples=30, deadline=None)
@given(data=minibatch(), dp=st.integers(2, 3))
def test_data_parallel_ranks_average_to_full_batch(mode, data, dp):
    """Each rank scales by dp_size; averaging rank gradients (what DDP/FSDP do) is exact."""
    mask, weights, _ = data
    full_value, full_grad = _loss_and_grad(weights, mask, mode)
    info = compute_global_batch_info(mask, dp_size=dp)
    chunks = torch.arange(mask.shape[0]).tensor_split(dp)
    total = torch.zeros((), dtype=torch.float64)
    grad = torch.zeros_like(weights)
    for rows in chunks:
        if len(rows) == 0:
            continue
        value, g = _loss_and_grad(weights[rows], mask[rows], mode, **info)
        total += value / dp
        grad[rows] = g / dp
    assert torch.allclose(total, full_value, atol=1e-12, rtol=1e-10)
    assert torch.allclose(grad, full_grad, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("mode", [m for m in LOSS_AGG_MODES if m != "seq-mean-token-sum-norm"])
@settings(max_examples=40, deadline=None)
@given(data=minibatch(), extra=st.integers(1, 5))
def test_padding_width_does_not_change_the_loss(mode, data, extra):
    mask, weights, _ = data
    pad_mask = torch.cat([mask, torch.zeros(mask.shape[0], extra)], dim=1)
    pad_w = torch.cat([weights, torch.randn(weights.shape[0], extra, dtype=weights.dtype)], dim=1)
    value, grad = _loss_and_grad(weights, mask, mode)
    pad_value, pad_grad = _loss_and_grad(pad_w, pad_mask, mode)
    assert torch.allclose(value, pad_value, atol=1e-12)
    assert torch.allclose(grad, pad_grad[:, : mask.shape[1]], atol=1e-12)
    assert torch.all(pad_grad[:, mask.shape[1] :] == 0)


@settings(max_examples=30, deadline=None)
@given(data=minibatch(), extra=st.integers(1, 5))
def test_seq_mean_token_sum_norm_is_padding_free_with_a_fixed_scale_factor(data, extra):
    mask, weights, _ = data
    pad_mask = torch.cat([mask, torch.zeros(mask.shape[0], extra)], dim=1)
    pad_w = torch.cat([weights, torch.zeros(weights.shape[0], extra, dtype=weights.dtype)], dim=1)
    mode = "seq-mean-token-sum-norm"
    value, _ = _loss_and_grad(weights, mask, mode, loss_scale_factor=16)
    pad_value, _ = _loss_and_grad(pad_w, pad_mask, mode, loss_scale_factor=16)
    assert torch.allclose(value, pad_value, atol=1e-12)
