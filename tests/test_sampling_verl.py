"""strategy=verl reproduces the recipe's accumulator exactly (docs/verl_compat.md, The loop and dynamic sampling)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as hs

from dapo.batch import Batch
from dapo.config.sampling import FilterGroupsConfig
from dapo.sampling import DynamicBatcher, GenerationBudgetExhausted, SampledStep
from dapo.sampling.fakes import FakeRollout, ListSource, prompt_rows, scripted
from dapo.sampling.filter import classify, has_spread, verl_keep

torch.set_num_threads(1)

VERL_MSG = (
    "num_gen_batches=2 >= max_num_gen_batches=2. Generated too many. Please check if your data are too "
    "difficult. You could also try set max_num_gen_batches=0 to enable endless trials."
)


def verl_cfg(**kw) -> FilterGroupsConfig:
    base = {"enable": True, "metric": "acc", "strategy": "verl", "on_exhausted": "error"}
    base.update(kw)
    return FilterGroupsConfig(**base)


def make(cfg, table, *, B, Bg, n, num_prompts=None, seed=0):
    num_prompts = num_prompts or len(table)
    src = ListSource(prompt_rows(num_prompts), shuffle=False)
    gen = FakeRollout(n, scripted(table), seed=seed)
    return DynamicBatcher(cfg, B, Bg, n, seed), src, gen


def indices(step: SampledStep) -> list[int]:
    return [int(i) for i in step.batch.non_tensors["index"].tolist()]


def test_hand_example_two_rounds_trim_and_counts():
    # B=2 groups, rounds of 3 prompts, n=2
    table = {
        0: [[1, 1]],  # all correct -> filtered
        1: [[0, 1]],  # kept
        2: [[0, 0]],  # all wrong -> filtered
        3: [[1, 0]],  # kept
        4: [[0, 1]],  # kept, surplus -> dropped by the trim
        5: [[1, 1]],  # all correct -> filtered
    }
    b, src, gen = make(verl_cfg(), table, B=2, Bg=3, n=2)
    rounds = []
    step = b.next_batch(src, gen, on_round=rounds.append)
    assert step.action == "train"
    assert indices(step) == [1, 1, 3, 3]
    assert len(step.batch) == 4 and step.num_groups == 2
    m = step.metrics
    assert m["train/num_gen_batches"] == 2
    assert m["dynamic_sampling/kept_groups"] == 3
    assert m["dynamic_sampling/filtered_all_correct"] == 2
    assert m["dynamic_sampling/filtered_all_wrong"] == 1
    assert m["dynamic_sampling/surplus_dropped"] == 1
    assert m["dynamic_sampling/surplus_carried"] == 0
    assert m["dynamic_sampling/generated_groups"] == 6
    assert m["dynamic_sampling/qualified_ratio"] == pytest.approx(0.5)
    assert m["dynamic_sampling/generated_groups_per_trained_group"] == pytest.approx(3.0)
    assert m["dynamic_sampling/staleness_max"] == 0
    # metric accumulate over both rounds: generated tokens over trained tokens
    trained = float(step.batch.tensors["response_mask"].sum())
    assert m["dynamic_sampling/trained_response_tokens"] == trained
    assert m["dynamic_sampling/gen_tokens_per_train_token"] > 1.0
    assert [r["round"] for r in rounds] == [1, 2]
    assert [r["kept"] for r in rounds] == [1, 3]
    # the surplus group (4) is gone: next step starts with prompt 6 (wraps to 0 with 6 prompts)
    assert src.taken == 6


def test_groups_get_fresh_unique_uids_and_stay_contiguous():
    table = {i: [[i % 2, 1 - i % 2, 1]] for i in range(8)}
    b, src, gen = make(verl_cfg(), table, B=4, Bg=4, n=3)
    step = b.next_batch(src, gen)
    uids = step.batch.non_tensors["uid"].tolist()
    assert len(set(uids)) == 4
    for g in range(4):
        assert len(set(uids[g * 3 : (g + 1) * 3])) == 1
    step2 = b.next_batch(src, gen)
    assert not set(uids) & set(step2.batch.non_tensors["uid"].tolist())


def test_exhaustion_raises_verl_message_verbatim():
    table = {i: [[1, 1]] for i in range(4)}
    b, src, gen = make(verl_cfg(max_num_gen_batches=2), table, B=2, Bg=2, n=2)
    with pytest.raises(ValueError) as e:
        b.next_batch(src, gen)
    assert isinstance(e.value, GenerationBudgetExhausted)
    assert str(e.value) == VERL_MSG


def test_exhaustion_checked_only_when_short():
    # round K fills the batch: no error
    table = {0: [[1, 1]], 1: [[0, 1]], 2: [[1, 0]], 3: [[0, 0]]}
    b, src, gen = make(verl_cfg(max_num_gen_batches=2), table, B=2, Bg=2, n=2)
    step = b.next_batch(src, gen)
    assert step.metrics["train/num_gen_batches"] == 2
    assert indices(step) == [1, 1, 2, 2]


def test_zero_budget_means_endless():
    # 9 all-filtered rounds, then a useful one: max_num_gen_batches=0 keeps going
    table = {i: [[1, 1]] for i in range(9)}
    table[9] = [[0, 1]]
    b, src, gen = make(verl_cfg(max_num_gen_batches=0), table, B=1, Bg=1, n=2)
    step = b.next_batch(src, gen)
    assert step.metrics["train/num_gen_batches"] == 10
    assert indices(step) == [9, 9]


@pytest.mark.parametrize("choice", ["train", "skip"])
def test_exhaustion_choices_in_verl_mode(choice):
    table = {0: [[0, 1]], 1: [[1, 1]], 2: [[0, 0]], 3: [[1, 1]]}
    b, src, gen = make(verl_cfg(max_num_gen_batches=2, on_exhausted=choice), table, B=3, Bg=2, n=2)
    step = b.next_batch(src, gen)
    assert step.metrics["train/num_gen_batches"] == 2
    if choice == "train":
        assert step.action == "train" and indices(step) == [0, 0]
        assert step.metrics["dynamic_sampling/partial_step"] == 1
    else:
        assert step.action == "skip" and step.batch is None
        assert step.metrics["dynamic_sampling/skipped_step"] == 1
        assert step.metrics["dynamic_sampling/surplus_dropped"] == 1


def test_single_response_groups_always_kept():
    table = {i: [[1]] for i in range(4)}
    b, src, gen = make(verl_cfg(), table, B=3, Bg=4, n=1)
    step = b.next_batch(src, gen)
    assert indices(step) == [0, 1, 2]
    assert step.metrics["dynamic_sampling/surplus_dropped"] == 1


def test_disabled_is_one_untrimmed_round():
    # verl quirk Q2: gen_batch_size > train_batch_size without filtering trains on B_gen*n
    table = {i: [[1, 1]] for i in range(5)}
    b, src, gen = make(FilterGroupsConfig(enable=False), table, B=2, Bg=5, n=2)
    step = b.next_batch(src, gen)
    assert step.action == "train"
    assert indices(step) == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert step.metrics["train/num_gen_batches"] == 1


def test_std_rule_keeps_float_rounding_noise_but_exact_rule_does_not():
    v = np.empty(3, dtype=object)
    v[:] = [0.1, 0.1, 0.1]
    assert np.std([0.1, 0.1, 0.1]) > 0  # the reason this test exists
    assert verl_keep(v) is True
    assert has_spread(v) is False


def _seq_batch(values_per_traj: list[float], n: int, extras: dict | None = None) -> Batch:
    t = torch.zeros(len(values_per_traj), 3)
    t[:, -1] = torch.tensor(values_per_traj)
    nt = {"uid": [f"u{i // n}" for i in range(len(values_per_traj))]}
    nt.update(extras or {})
    return Batch(tensors={"token_level_scores": t, "token_level_rewards": t * 2}, non_tensors=nt)


def test_seq_reward_metric_sums_token_level_scores():
    b = _seq_batch([1.0, 1.0, -1.0, -0.5], n=2)
    out = classify(b, "seq_reward", verl=True)
    assert [o.kept for o in out] == [False, True]
    out = classify(b, "seq_final_reward", verl=True)
    assert [o.mean for o in out] == [2.0, -1.5]


def test_missing_metric_names_the_key():
    b = _seq_batch([1.0, 1.0], n=2)
    with pytest.raises(KeyError, match=r"algorithm\.filter_groups\.metric"):
        classify(b, "overlong", verl=True)


def _reference_appendix_b(rounds: list[Batch], B: int, n: int, K: int):
    """Appendix B, written independently, over the rounds actually generated."""
    acc_rows: list[tuple[int, int]] = []  # (round, row)
    kept_groups = 0
    for r, T in enumerate(rounds, start=1):
        groups: dict[str, list[int]] = {}
        for i, u in enumerate(T.non_tensors["uid"].tolist()):
            groups.setdefault(u, []).append(i)
        keep = set()
        for u, rows in groups.items():
            vals = [float(T.non_tensors["acc"][i]) for i in rows]
            if len(vals) == 1 or float(np.std(vals)) > 0:
                keep.add(u)
        kept_groups += len(keep)
        acc_rows += [(r, i) for i, u in enumerate(T.non_tensors["uid"].tolist()) if u in keep]
        if kept_groups < B:
            if K > 0 and r >= K:
                return "error", r, None
            continue
        return "train", r, acc_rows[: B * n]
    return "more", len(rounds), None


@settings(max_examples=60, deadline=None)
@given(
    B=hs.integers(1, 5),
    extra=hs.integers(0, 4),
    n=hs.integers(1, 4),
    K=hs.integers(0, 4),
    seed=hs.integers(0, 10_000),
)
def test_matches_appendix_b_on_random_outcomes(B, extra, n, K, seed):
    Bg = B + extra
    rng = np.random.default_rng(seed)
    # mostly no spread, sometimes spread; enough prompts that rounds see varied outcomes
    table = {i: [rng.choice([[1] * n, [0] * n, list(rng.integers(0, 2, n))])] for i in range(13)}
    captured: list[Batch] = []
    b, src, gen = make(verl_cfg(max_num_gen_batches=K), table, B=B, Bg=Bg, n=n)

    def generate(rows):
        out = gen(rows)
        captured.append(out)
        return out

    if K == 0:
        # guarantee termination for endless mode: enough prompts always spread
        table.update({i: [[1] + [0] * (n - 1)] for i in range(0, 13, 2)})
    try:
        step = b.next_batch(src, generate)
        result = ("train", step)
    except GenerationBudgetExhausted as e:
        result = ("error", e)
    # the uids were assigned by the batcher on the captured (same) objects
    kind, r, rows = _reference_appendix_b(captured, B, n, K)
    assert kind == result[0]
    if kind == "error":
        assert str(result[1]) == (
            f"num_gen_batches={r} >= max_num_gen_batches={K}. Generated too many. Please check if your data "
            "are too difficult. You could also try set max_num_gen_batches=0 to enable endless trials."
        )
        return
    step = result[1]
    assert step.metrics["train/num_gen_batches"] == r == len(captured)
    expect_idx = [int(captured[rr - 1].non_tensors["index"][i]) for rr, i in rows]
    expect_uid = [captured[rr - 1].non_tensors["uid"][i] for rr, i in rows]
    assert indices(step) == expect_idx
    assert step.batch.non_tensors["uid"].tolist() == expect_uid
    assert len(step.batch) == B * n
    # tensors travel with their rows
    expect_lp = torch.stack([captured[rr - 1].tensors["rollout_log_probs"][i] for rr, i in rows])
    assert torch.equal(step.batch.tensors["rollout_log_probs"], expect_lp)
