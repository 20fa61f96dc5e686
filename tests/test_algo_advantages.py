"""Advantage estimators: hand-computed vectors, verl 0.9.1 vectors (docs/verl_compat.md, Test vectors), registry, invariants."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo.algo.advantages import (
    ADV_ESTIMATOR_REGISTRY,
    AdvantageEstimator,
    compute_advantage,
    get_adv_estimator_fn,
    register_adv_est,
)

torch.set_num_threads(1)

# Six responses, T = 4. Outcome reward sits on the last valid token (docs/verl_compat.md, Rewards).
LENGTHS = [3, 2, 4, 1, 2, 3]
SCORES = [1.0, 0.0, 0.5, 1.0, 1.0, 0.2]
GROUPS = np.array(list("aaabbc"), dtype=object)


def _batch(lengths=LENGTHS, scores=SCORES, t=4):
    mask = torch.zeros(len(lengths), t)
    rewards = torch.zeros(len(lengths), t)
    for i, (n, s) in enumerate(zip(lengths, scores)):
        mask[i, :n] = 1
        rewards[i, n - 1] = s
    return rewards, mask


def _row_values(adv, mask):
    """The per-row constant of an outcome advantage, checking it is constant on the row."""
    out = []
    for a, m in zip(adv, mask):
        vals = a[m.bool()]
        assert torch.all(vals == vals[0])
        assert torch.all(a[~m.bool()] == 0)
        out.append(vals[0].item())
    return out


def test_appendix_a_grpo():
    rewards = torch.tensor([[1.0], [0.0], [0.0], [1.0], [1.0]])
    mask = torch.ones(5, 1)
    adv, ret = get_adv_estimator_fn("grpo")(
        token_level_rewards=rewards, response_mask=mask, index=np.array(list("xxxyy"), dtype=object)
    )
    assert adv[:, 0].tolist() == pytest.approx([1.154698, -0.577349, -0.577349, 0.0, 0.0], abs=1e-6)
    assert torch.equal(adv, ret)
    single, _ = get_adv_estimator_fn("grpo")(
        token_level_rewards=torch.tensor([[0.5]]), response_mask=torch.ones(1, 1), index=["solo"]
    )
    assert single.item() == pytest.approx(0.4999995, abs=1e-7)  # 0.5 / (1 + 1e-6)


def test_grpo_and_dr_grpo_hand_vectors():
    rewards, mask = _batch()
    fn = get_adv_estimator_fn(AdvantageEstimator.GRPO)
    adv, _ = fn(token_level_rewards=rewards, response_mask=mask, index=GROUPS, norm_adv_by_std_in_grpo=True)
    # group a: mean 0.5, unbiased std 0.5 -> +-0.5/(0.5+1e-6); group b: equal -> 0; c alone: 0.2/(1+1e-6)
    expected = [0.5 / 0.500001, -0.5 / 0.500001, 0.0, 0.0, 0.0, 0.2 / 1.000001]
    assert _row_values(adv, mask) == pytest.approx(expected, abs=1e-6)
    adv, _ = fn(token_level_rewards=rewards, response_mask=mask, index=GROUPS, norm_adv_by_std_in_grpo=False)
    assert _row_values(adv, mask) == pytest.approx([0.5, -0.5, 0.0, 0.0, 0.0, 0.2], abs=1e-7)


def test_grpo_accepts_numpy_string_and_int_indices_and_extra_kwargs():
    rewards, mask = _batch()
    a1, _ = compute_advantage(rewards, mask, "grpo", index=GROUPS)
    a2, _ = compute_advantage(rewards, mask, "grpo", index=np.array([0, 0, 0, 1, 1, 2]))
    a3, _ = get_adv_estimator_fn("grpo")(
        token_level_rewards=rewards, response_mask=mask, index=list(GROUPS), config={"gamma": 1.0}, unused=1
    )
    assert torch.equal(a1, a2) and torch.equal(a1, a3)


def test_rloo_hand_vector():
    rewards, mask = _batch()
    adv, ret = get_adv_estimator_fn("rloo")(token_level_rewards=rewards, response_mask=mask, index=GROUPS)
    # a: s_i - mean of the other two: 1-0.25, 0-0.75, 0.5-0.5; b: 0; c alone keeps its score
    assert _row_values(adv, mask) == pytest.approx([0.75, -0.75, 0.0, 0.0, 0.0, 0.2], abs=1e-7)
    assert torch.equal(adv, ret)


def test_opo_hand_vector():
    rewards, mask = _batch()
    adv, _ = get_adv_estimator_fn("opo")(token_level_rewards=rewards, response_mask=mask, index=GROUPS)
    # a: length-weighted baseline (3*1 + 2*0 + 4*0.5)/9 = 5/9; b: (1*1 + 2*1)/3 = 1; c alone: 0
    b = 5 / 9
    assert _row_values(adv, mask) == pytest.approx([1 - b, -b, 0.5 - b, 0.0, 0.0, 0.2], abs=1e-6)


def test_grpo_passk_hand_vector():
    rewards, mask = _batch()
    index = np.array(list("aaabbb"), dtype=object)
    fn = get_adv_estimator_fn("grpo_passk")
    adv, _ = fn(
        token_level_rewards=rewards,
        response_mask=mask,
        index=index,
        config={"norm_adv_by_std_in_grpo": False},
    )
    # a: only the best (row 0) gets r_max - r_2nd = 1 - 0.5; b: 1 - 1 = 0
    assert _row_values(adv, mask) == pytest.approx([0.5, 0, 0, 0, 0, 0], abs=1e-7)
    adv, _ = fn(token_level_rewards=rewards, response_mask=mask, index=index, norm_adv_by_std_in_grpo=True)
    assert _row_values(adv, mask)[0] == pytest.approx(0.5 / 0.500001, abs=1e-6)
    with pytest.raises(ValueError, match="at least 2"):
        fn(token_level_rewards=rewards, response_mask=mask, index=GROUPS)


def test_reinforce_plus_plus_discounting_and_whitening():
    rewards = torch.tensor([[1.0, 0.0, 2.0, 0.0], [0.0, 1.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0], [1.0, 1.0, 0.0, 0.0]])
    adv, ret = get_adv_estimator_fn("reinforce_plus_plus")(
        token_level_rewards=rewards, response_mask=mask, config={"gamma": 0.5}
    )
    # row 0: the reward on a masked token is not collected; G = [1, 0, 0(masked), 0]
    # row 1: G_1 = 1, G_0 = 0 + 0.5 * 1
    assert ret.tolist() == [[1.0, 0.0, 0.0, 0.0], [0.5, 1.0, 0.0, 0.0]]
    # whitened over the 5 masked values [1, 0, 0, .5, 1]: mean .5, unbiased std .5
    expected = torch.tensor([[1.0, -1.0, 0.0, -1.0], [0.0, 1.0, 0.0, 0.0]])
    assert torch.allclose(adv, expected, atol=1e-6)
    # a masked (observation) token carries the return through
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0]])
    _, ret = get_adv_estimator_fn("reinforce_plus_plus")(
        token_level_rewards=rewards, response_mask=mask, gamma=0.5
    )
    assert ret.tolist() == [[0.5, 0.0, 1.0]]


def test_reinforce_plus_plus_baseline_matches_verl():
    rewards, mask = _batch()
    adv, _ = get_adv_estimator_fn("reinforce_plus_plus_baseline")(
        token_level_rewards=rewards, response_mask=mask, index=GROUPS
    )
    # values from verl 0.9.1 on this input (group-centred, then whitened over all 15 tokens)
    expected = [1.4059507846832275, -1.8892462253570557, -0.24164779484272003, -0.24164779484272003,
                -0.24164779484272003, 0.4173916280269623]  # fmt: skip
    assert _row_values(adv, mask) == pytest.approx(expected, abs=1e-6)
    # hand check of the whitening: centred values c = [.5, -.5, 0, 0, 0, .2] over lengths
    c = torch.tensor([0.5] * 3 + [-0.5] * 2 + [0.0] * 4 + [0.0] + [0.0] * 2 + [0.2] * 3)
    assert expected[0] == pytest.approx(((0.5 - c.mean()) / c.std()).item(), abs=1e-5)


def test_remax_hand_vector():
    rewards = torch.tensor([[1.0, 0.0, 2.0, 0.0], [0.0, 1.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0], [1.0, 1.0, 0.0, 0.0]])
    adv, ret = get_adv_estimator_fn("remax")(
        token_level_rewards=rewards, response_mask=mask, reward_baselines=torch.tensor([0.5, 2.0])
    )
    assert ret.tolist() == [[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]]
    assert adv.tolist() == [[0.5, -0.5, 0.0, -0.5], [-1.0, -1.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match="reward_baselines"):
        get_adv_estimator_fn("remax")(token_level_rewards=rewards, response_mask=mask)


def test_registry_unknown_custom_and_duplicate():
    with pytest.raises(ValueError, match="grpo"):
        get_adv_estimator_fn("nope")
    for name in AdvantageEstimator:
        assert get_adv_estimator_fn(name) is ADV_ESTIMATOR_REGISTRY[name.value]

    @register_adv_est("test_constant_one")
    def constant(token_level_rewards, response_mask, **kwargs):
        return response_mask.clone(), response_mask.clone()

    try:
        rewards, mask = _batch()
        adv, _ = compute_advantage(rewards, mask, "test_constant_one", index=GROUPS)
        assert torch.equal(adv, mask)
        register_adv_est("test_constant_one")(constant)  # same function again: fine
        with pytest.raises(ValueError, match="already registered"):
            register_adv_est("test_constant_one")(lambda **kw: None)
    finally:
        ADV_ESTIMATOR_REGISTRY.pop("test_constant_one", None)


def test_missing_index_is_a_clear_error():
    rewards, mask = _batch()
    with pytest.raises(ValueError, match="uid"):
        get_adv_estimator_fn("grpo")(token_level_rewards=rewards, response_mask=mask)


# ------------------------------------------------------------------------------------------
# invariants
# ------------------------------------------------------------------------------------------


@st.composite
def grouped_scores(draw):
    n_groups = draw(st.integers(1, 4))
    sizes = draw(st.lists(st.integers(2, 6), min_size=n_groups, max_size=n_groups))
    scores, index = [], []
    for g, n in enumerate(sizes):
        vals = draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, -1.0, 2.0]), min_size=n, max_size=n))
        scores += vals
        index += [f"g{g}"] * n
    order = draw(st.permutations(range(len(scores))))
    return [scores[i] for i in order], np.array([index[i] for i in order], dtype=object)


@settings(max_examples=80, deadline=None)
@given(data=grouped_scores(), norm=st.booleans(), name=st.sampled_from(["grpo", "rloo", "opo"]))
def test_group_relative_advantages_sum_to_zero_per_group(data, norm, name):
    scores, index = data
    lengths = [1 + (i % 3) for i in range(len(scores))]
    rewards, mask = _batch(lengths, scores, t=3)
    if name == "opo":  # the length-weighted baseline makes the length-weighted sum zero
        lengths_t = mask.sum(-1)
    else:
        lengths_t = torch.ones(len(scores))
    adv, _ = get_adv_estimator_fn(name)(
        token_level_rewards=rewards, response_mask=mask, index=index, norm_adv_by_std_in_grpo=norm
    )
    per_row = torch.tensor(_row_values(adv, mask))
    for g in set(index):
        rows = torch.tensor([i for i, x in enumerate(index) if x == g])
        group_scores = torch.tensor([scores[i] for i in rows])
        total = (per_row[rows] * lengths_t[rows]).sum().item()
        assert total == pytest.approx(0.0, abs=1e-5)
        if name == "grpo" and group_scores.unique().numel() > 1:
            # with spread, some advantage is non-zero; normalised ones have unit unbiased std
            assert per_row[rows].abs().max() > 0
            if norm:
                assert per_row[rows].std().item() == pytest.approx(1.0, rel=1e-4)
        if group_scores.unique().numel() == 1:
            assert torch.all(per_row[rows] == 0)
