"""strategy=default: carry-over, staleness, adaptive rounds, skipping, filter rules, exhaustion, state."""

from __future__ import annotations

import copy
import dataclasses
import json
import logging

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as hs

from dapo.checkpoint import store as checkpoint
from dapo.config.sampling import AdaptiveThresholdConfig, FilterGroupsConfig, SkipConfig
from dapo.sampling import DynamicBatcher, GenerationBudgetExhausted
from dapo.sampling.fakes import FakeRollout, ListSource, bernoulli, prompt_rows, scripted
from dapo.sampling.simulate import Population

torch.set_num_threads(1)


def cfg(**kw) -> FilterGroupsConfig:
    base = {"enable": True, "metric": "acc"}
    base.update(kw)
    return FilterGroupsConfig(**base)


def idx(step) -> list[int]:
    return [int(i) for i in step.batch.non_tensors["index"].tolist()]


def assert_well_formed(step, n: int, groups: int) -> None:
    b = step.batch
    assert len(b) == groups * n
    uids = b.non_tensors["uid"].tolist()
    for g in range(groups):
        block = uids[g * n : (g + 1) * n]
        assert len(set(block)) == 1
    assert len(set(uids)) == groups  # contiguous: no uid appears in two blocks


def test_surplus_is_carried_and_trained_next_step():
    # all prompts spread: round 1 (gen_batch_size=6) keeps 6 > B=4 -> 2 carried
    table = {i: [[0, 1]] for i in range(12)}
    b = DynamicBatcher(cfg(skip=SkipConfig(enable=False)), 4, 6, 2, 0)
    src, gen = ListSource(prompt_rows(12), shuffle=False), FakeRollout(2, scripted(table))
    s1 = b.next_batch(src, gen)
    assert idx(s1) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert s1.metrics["dynamic_sampling/surplus_carried"] == 2
    assert s1.metrics["dynamic_sampling/surplus_dropped"] == 0
    s2 = b.next_batch(src, gen)
    # carried groups first (oldest first), then fresh ones; adaptive round asked for ~2 prompts
    assert idx(s2)[:4] == [4, 4, 5, 5]
    assert s2.batch.non_tensors["staleness"].tolist()[:4] == [1, 1, 1, 1]
    assert s2.metrics["dynamic_sampling/carried_in"] == 2
    assert s2.metrics["dynamic_sampling/round_prompts_mean"] < 6
    assert_well_formed(s2, 2, 4)
    # sampler log-probs travel with the carried group
    assert "rollout_log_probs" in s2.batch.tensors


def test_carry_over_off_drops_surplus():
    table = {i: [[0, 1]] for i in range(12)}
    b = DynamicBatcher(cfg(carry_over=False, skip=SkipConfig(enable=False)), 4, 6, 2, 0)
    src, gen = ListSource(prompt_rows(12), shuffle=False), FakeRollout(2, scripted(table))
    s1 = b.next_batch(src, gen)
    assert s1.metrics["dynamic_sampling/surplus_dropped"] == 2
    assert s1.metrics["dynamic_sampling/surplus_carried"] == 0


def _surplus_heavy(max_staleness: int):
    """A big first round and tiny batches keep the pool full, so expiry must kick in."""
    rng = np.random.default_rng(1)
    pop = {i: float(rng.uniform(0.2, 0.8)) for i in range(64)}
    c = cfg(max_staleness=max_staleness, adaptive_rounds=False, skip=SkipConfig(enable=False))
    b = DynamicBatcher(c, 2, 16, 4, 0)
    src = ListSource(prompt_rows(64), seed=3)
    gen = FakeRollout(4, bernoulli(lambda r: pop[r["index"]]), seed=2)
    return b, src, gen


@pytest.mark.parametrize("max_staleness", [0, 1, 2])
def test_never_trains_on_staler_groups_than_allowed(max_staleness):
    b, src, gen = _surplus_heavy(max_staleness)
    dropped = 0
    for _ in range(12):
        s = b.next_batch(src, gen)
        assert max(s.batch.non_tensors["staleness"].tolist()) <= max_staleness
        ver = b.version - 1  # version the step trained at
        assert all(ver - int(v) <= max_staleness for v in s.batch.non_tensors["gen_version"].tolist())
        dropped += s.metrics["dynamic_sampling/stale_dropped"]
    assert dropped > 0


def test_skipping_never_starves_a_prompt():
    # prompt 0 always spreads, prompts 1..7 never do: they become skip candidates, yet each is
    # rolled out whenever it is drawn at least revisit_epochs * 8 prompts / 1 = 4 policy updates
    # after its last rollout.
    table = {0: [[0, 1]]}
    table.update({i: [[1, 1]] for i in range(1, 8)})
    bound = 4
    c = cfg(skip=SkipConfig(rule="streak", revisit_epochs=0.5, init_prob=0.9, max_prob=0.99, min_streak=1))
    b = DynamicBatcher(c, 1, 1, 2, 0)
    src, gen = ListSource(prompt_rows(8), seed=0), FakeRollout(2, scripted(table))
    last: dict[int, int] = {}
    due_draws: list[int] = []
    seen_rollout: list[int] = []
    orig_take = src.take

    def take(k):
        rows = orig_take(k)
        due_draws.extend(
            r["index"] for r in rows if r["index"] in last and b.version - last[r["index"]] >= bound
        )
        return rows

    src.take = take

    def generate(rows):
        for r in rows:
            seen_rollout.append(r["index"])
            last[r["index"]] = b.version
            if r["index"] in due_draws:
                due_draws.remove(r["index"])
        return gen(rows)

    skipped = 0
    for _ in range(60):
        s = b.next_batch(src, generate)
        skipped += s.metrics["dynamic_sampling/skipped_prompts"]
        assert not due_draws  # every draw of a due prompt was rolled out
        assert len(last) < 8 or b.version - min(last.values()) <= bound + 8  # none waits much longer
    assert skipped > 0
    assert set(seen_rollout) == set(range(8))
    # the history makes skipped prompts rare among rollouts: far fewer than 7/8 of the rollouts
    assert seen_rollout.count(0) > len(seen_rollout) / 4


def _run(c, steps, *, B=4, Bg=12, n=4, seed=0, state=None):
    pop = Population.synthetic(48, seed=seed)
    b = DynamicBatcher(c, B, Bg, n, seed)
    src = ListSource(prompt_rows(48), seed=seed)
    gen = FakeRollout(n, bernoulli(lambda r: pop.prob(r["index"], b.version)), seed=seed + 1)
    return b, src, gen


def test_state_dict_round_trip_gives_identical_continuation():
    c = cfg(max_num_gen_batches=0)
    b, src, gen = _run(c, 0)
    for _ in range(4):  # the pool holds carried groups after step 4
        b.next_batch(src, gen)
    # what a checkpoint does with it: tensors to a binary file, the rest through JSON
    tensors: dict = {}
    plain = checkpoint._extract(b.state_dict(), {}, tensors, "")
    assert tensors  # the pool's batches
    state = checkpoint._insert(json.loads(json.dumps(plain)), {}, tensors)
    src_state = src.state_dict()
    gen_rng = copy.deepcopy(gen.rng)
    assert state["pool"] or state["history"]
    ref = [b.next_batch(src, gen) for _ in range(4)]

    b2, src2, gen2 = _run(c, 0)
    b2.load_state_dict(state)
    src2.load_state_dict(src_state)
    gen2.rng = gen_rng
    for r in ref:
        s = b2.next_batch(src2, gen2)
        assert s.action == r.action
        assert s.batch.non_tensors["uid"].tolist() == r.batch.non_tensors["uid"].tolist()
        assert idx(s) == idx(r)
        for k in r.batch.tensors:
            assert torch.equal(s.batch.tensors[k], r.batch.tensors[k]), k
        assert s.metrics == r.metrics


def test_epoch_rollover_keeps_the_pool():
    table = {i: [[0, 1]] for i in range(5)}
    b = DynamicBatcher(cfg(skip=SkipConfig(enable=False), adaptive_rounds=False), 3, 5, 2, 0)
    src, gen = ListSource(prompt_rows(5), shuffle=False), FakeRollout(2, scripted(table))
    s1 = b.next_batch(src, gen)  # takes all 5 prompts: epoch 0 ends, 2 groups carried
    assert s1.metrics["dynamic_sampling/surplus_carried"] == 2
    s2 = b.next_batch(src, gen)  # crosses into epoch 1; carried groups are used first
    assert src.epoch == 1
    assert idx(s2)[:4] == [3, 3, 4, 4]
    assert s2.metrics["dynamic_sampling/carried_in"] == 2
    assert s2.metrics["dynamic_sampling/epoch"] == 1


def _all_filtered_setup(**kw):
    table = {0: [[0, 1]]}
    table.update({i: [[1, 1]] for i in range(1, 6)})
    c = cfg(max_num_gen_batches=2, skip=SkipConfig(enable=False), adaptive_rounds=False, **kw)
    b = DynamicBatcher(c, 3, 3, 2, 0)
    return b, ListSource(prompt_rows(6), shuffle=False), FakeRollout(2, scripted(table))


def test_exhausted_error_names_the_knobs():
    b, src, gen = _all_filtered_setup(on_exhausted="error")
    with pytest.raises(GenerationBudgetExhausted) as e:
        b.next_batch(src, gen)
    msg = str(e.value)
    assert msg.startswith("num_gen_batches=2 >= max_num_gen_batches=2. Generated too many.")
    for knob in ("algorithm.filter_groups.max_num_gen_batches", "data.gen_batch_size", "on_exhausted"):
        assert knob in msg
    assert "Collected 1 of 3 groups" in msg


def test_exhausted_train_on_collected():
    b, src, gen = _all_filtered_setup(on_exhausted="train")
    s = b.next_batch(src, gen)
    assert s.action == "train" and idx(s) == [0, 0]
    assert s.metrics["train/num_gen_batches"] == 2
    assert s.metrics["dynamic_sampling/partial_step"] == 1
    assert b.version == 1


def test_exhausted_skip_keeps_groups_in_pool():
    b, src, gen = _all_filtered_setup(on_exhausted="skip")
    s = b.next_batch(src, gen)
    assert s.action == "skip" and s.batch is None
    assert s.metrics["dynamic_sampling/skipped_step"] == 1
    assert s.metrics["dynamic_sampling/surplus_carried"] == 1
    assert b.version == 0  # no update happened: carried groups are not staler


def test_exact_equality_filter_and_band_rule():
    # mean acc of group 0 = 0.25, group 1 = 0.75; band [0.5, 1] keeps only group 1
    table = {0: [[1, 0, 0, 0]], 1: [[1, 1, 1, 0]], 2: [[1, 1, 1, 1]], 3: [[0, 1, 1, 0]]}
    b = DynamicBatcher(cfg(filter_rule="band", band=[0.5, 1.0], skip=SkipConfig(enable=False)), 2, 4, 4, 0)
    s = b.next_batch(ListSource(prompt_rows(4), shuffle=False), FakeRollout(4, scripted(table)))
    assert idx(s) == [1] * 4 + [3] * 4
    assert s.metrics["dynamic_sampling/filtered_out_of_band"] == 1
    assert s.metrics["dynamic_sampling/filtered_all_correct"] == 1


def test_adaptive_threshold_narrows_when_too_much_is_kept():
    c = cfg(
        filter_rule="band",
        band=[0.0, 1.0],
        adaptive_threshold=AdaptiveThresholdConfig(enable=True, target=0.3, rate=0.2, min_width=0.2),
        skip=SkipConfig(enable=False),
    )
    b = DynamicBatcher(c, 4, 8, 4, 0)
    src = ListSource(prompt_rows(16))
    gen = FakeRollout(4, bernoulli(lambda r: 0.5), seed=0)
    widths = []
    for _ in range(6):
        s = b.next_batch(src, gen)
        widths.append(s.metrics["dynamic_sampling/band_high"] - s.metrics["dynamic_sampling/band_low"])
    assert widths[-1] < widths[0] <= 1.0
    assert widths[-1] >= 0.2 - 1e-12


def test_shaped_metric_slip_is_counted_and_warned(caplog):
    # all-wrong groups whose overlong penalties differ pass a seq_reward filter
    table = {i: [[0, 0, 0, 0]] for i in range(8)}
    b = DynamicBatcher(cfg(metric="seq_reward", skip=SkipConfig(enable=False)), 2, 8, 4, 0)
    gen = FakeRollout(4, scripted(table), overlong_penalty=0.5, seed=0)
    with caplog.at_level(logging.WARNING):
        s = b.next_batch(ListSource(prompt_rows(8), shuffle=False), gen)
    assert s.metrics["dynamic_sampling/shaped_metric_slip"] > 0
    assert "metric=acc" in caplog.text


@settings(max_examples=40, deadline=None)
@given(
    B=hs.integers(1, 6),
    extra=hs.integers(0, 6),
    n=hs.integers(1, 4),
    carry=hs.booleans(),
    adaptive=hs.booleans(),
    skip=hs.booleans(),
    stale=hs.integers(0, 2),
    seed=hs.integers(0, 1000),
)
def test_invariants_batch_is_exactly_B_groups_of_n(B, extra, n, carry, adaptive, skip, stale, seed):
    c = cfg(
        carry_over=carry,
        adaptive_rounds=adaptive,
        max_staleness=stale,
        skip=dataclasses.replace(SkipConfig(), enable=skip),
    )
    pop = Population.synthetic(40, seed=seed)
    b = DynamicBatcher(c, B, B + extra, n, seed)
    src = ListSource(prompt_rows(40), seed=seed)
    gen = FakeRollout(n, bernoulli(lambda r: pop.prob(r["index"], b.version)), seed=seed)
    kept = 0
    trained = 0
    dropped = 0
    for _ in range(5):
        s = b.next_batch(src, gen)
        assert s.action == "train"
        assert_well_formed(s, n, B)
        assert max(s.batch.non_tensors["staleness"].tolist()) <= (stale if carry else 0)
        m = s.metrics
        kept += m["dynamic_sampling/kept_groups"]
        trained += m["dynamic_sampling/trained_groups"]
        dropped += m["dynamic_sampling/surplus_dropped"]
        assert (
            m["dynamic_sampling/generated_groups"]
            == m["dynamic_sampling/kept_groups"] + m["dynamic_sampling/filtered_groups"]
        )
    # nothing is silently lost: every kept group was trained, dropped (and counted) or is in the pool
    assert kept == trained + dropped + len(b.pool)


@pytest.mark.parametrize("max_staleness", [1, 2, 3])
def test_prefetch_lag_counts_the_update_in_flight(max_staleness):
    # lag=1 (the trainer's prefetch): every group was generated one update before the step that
    # trains it, so fresh groups are 1 stale and carried ones expire one step earlier
    b, src, gen = _surplus_heavy(max_staleness)
    b.next_batch(src, gen)  # the first step is generated before any update (lag 0)
    seen = set()
    dropped = 0
    for _ in range(12):
        weights_version = b.version - 1  # the update in flight has not landed on the generator
        s = b.next_batch(src, gen, lag=1)
        trained_at = b.version - 1  # updates done when this batch is trained
        gen_versions = [int(v) for v in s.batch.non_tensors["gen_version"].tolist()]
        stale = s.batch.non_tensors["staleness"].tolist()
        assert all(g <= weights_version for g in gen_versions)
        assert stale == [trained_at - g for g in gen_versions]
        assert 1 <= min(stale) and max(stale) <= max_staleness
        seen.update(stale)
        dropped += s.metrics["dynamic_sampling/stale_dropped"]
    assert seen == set(range(1, max_staleness + 1))  # carried groups do get used
    if max_staleness == 1:
        assert dropped > 0  # a surplus group would be 2 stale by the next step


def test_pool_batches_saved_as_json_lists_by_earlier_checkpoints_still_load():
    from dapo.sampling.batch_state import batch_from_state

    old = {
        "tensors": {"responses": {"dtype": "int64", "shape": [2, 3], "data": [1, 2, 3, 4, 5, 6]}},
        "non_tensors": {"uid": ["g0", "g0"]},
    }
    b = batch_from_state(old)
    assert torch.equal(b.tensors["responses"], torch.tensor([[1, 2, 3], [4, 5, 6]]))
    assert b.non_tensors["uid"].tolist() == ["g0", "g0"]
