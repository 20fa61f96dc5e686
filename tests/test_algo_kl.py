"""KL estimators (verl 0.9.1 vectors, docs/verl_compat.md), straight-through forms, in-reward KL, controllers."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo.algo.kl import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    get_kl_controller,
    kl_penalty,
)

torch.set_num_threads(1)

LOGP = torch.tensor([-1.0, -2.0])
REF = torch.tensor([-1.5, -1.0])


@pytest.mark.parametrize(
    "names,expected",
    [
        (("kl", "k1"), [0.5, -1.0]),
        (("abs",), [0.5, 1.0]),
        (("mse", "k2"), [0.125, 0.5]),
        (("low_var_kl", "k3"), [0.106531, 0.718282]),  # e^-0.5 - 0.5 ... ; e - 2
    ],
)
def test_appendix_a_vectors(names, expected):
    for name in names:
        assert kl_penalty(LOGP, REF, name).tolist() == pytest.approx(expected, abs=1e-6)
    # and by hand: k3 with x = ref - logp
    assert math.exp(-0.5) + 0.5 - 1 == pytest.approx(0.106531, abs=1e-6)


def test_k3_is_clamped():
    big = kl_penalty(torch.tensor([-30.0]), torch.tensor([0.0]), "k3")
    assert big.item() == 10.0  # e^20 - 21 clamped to 10


@pytest.mark.parametrize("base", ["kl", "k1", "abs", "low_var_kl", "k3", "mse", "k2"])
def test_straight_through_keeps_value_and_takes_k2_gradient(base):
    logp = torch.tensor([-1.0, -2.0, -0.3], requires_grad=True)
    ref = torch.tensor([-1.5, -1.0, -0.3])
    value = kl_penalty(logp, ref, base + "+")
    assert torch.allclose(value, kl_penalty(logp.detach(), ref, base))
    value.sum().backward()
    assert torch.allclose(logp.grad, (logp - ref).detach())  # d/dlogp of (logp - ref)^2 / 2


def test_unknown_and_full():
    with pytest.raises(ValueError, match="low_var_kl"):
        kl_penalty(LOGP, REF, "k4")
    with pytest.raises(NotImplementedError):
        kl_penalty(LOGP, REF, "full")


def test_apply_kl_penalty_hand_vector():
    scores = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    old = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, -2.0, -2.0]])
    ref = torch.tensor([[-1.5, -0.5, -1.0], [-1.0, -1.0, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    rewards, current = apply_kl_penalty(scores, old, ref, mask, beta=0.1, estimator="kl")
    kld = torch.tensor([[0.5, -0.5, 0.0], [-1.0, -1.0, 0.0]])  # masked token gives 0
    assert torch.allclose(rewards, scores - 0.1 * kld)
    assert current == pytest.approx((0.0 + -1.0) / 2, abs=1e-6)  # mean of per-row masked means


def test_controllers():
    fixed = get_kl_controller("fixed", kl_coef=0.05)
    assert isinstance(fixed, FixedKLController)
    fixed.update(10.0, 100)
    assert fixed.value == 0.05
    ada = get_kl_controller("adaptive", kl_coef=0.1, target_kl=0.1, horizon=1000)
    assert isinstance(ada, AdaptiveKLController)
    ada.update(current_kl=0.3, n_steps=100)  # error clipped to +0.2
    assert ada.value == pytest.approx(0.1 * (1 + 0.2 * 100 / 1000))
    ada.update(current_kl=0.09, n_steps=100)  # error -0.1
    assert ada.value == pytest.approx(0.1 * 1.02 * (1 - 0.1 * 100 / 1000))
    with pytest.raises(ValueError, match="horizon"):
        get_kl_controller("adaptive", horizon=0)
    with pytest.raises(ValueError, match="kl_ctrl.type"):
        get_kl_controller("pid")


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-8, 0), min_size=1, max_size=8), st.floats(-3, 3))
def test_estimator_properties(logps, shift):
    logp = torch.tensor(logps, dtype=torch.float64)
    ref = logp + shift
    assert torch.all(kl_penalty(logp, ref, "k3") >= 0)  # k3 is non-negative
    assert torch.all(kl_penalty(logp, ref, "k2") >= 0)
    same = kl_penalty(logp, logp, "k3")
    assert torch.all(same == 0)
