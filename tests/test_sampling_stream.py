"""strategy=stream's bookkeeping on the fake engine clock (sampling/fakes.FakeGroupStream): the refill
rule, the stop at train_batch_size, surplus to the pool, aborted work counted, budget, state."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as hs

from dapo.config.sampling import FilterGroupsConfig, SkipConfig
from dapo.sampling import DynamicBatcher
from dapo.sampling.fakes import FakeGroupStream, FakeRollout, ListSource, bernoulli, prompt_rows, scripted
from dapo.sampling.stream import stream_refill

torch.set_num_threads(1)
P = "dynamic_sampling/"


def cfg(**kw) -> FilterGroupsConfig:
    base = {"enable": True, "metric": "acc", "strategy": "stream"}
    base.update(kw)
    return FilterGroupsConfig(**base)


def test_refill_rule():
    # ceil(need * (1 + margin) / rate) in flight, the rate taken as 1 without an estimate
    assert stream_refill(4, 0, 8, None, 0.1) == 5
    assert stream_refill(4, 3, 8, None, 0.1) == 2
    assert stream_refill(10, 0, 8, None, 0.1) == 8  # capped at capacity
    assert stream_refill(4, 0, 16, 0.5, 0.0) == 8
    assert stream_refill(4, 5, 16, 0.5, 0.0) == 3
    assert stream_refill(4, 0, 16, 0.5, 0.1) == 9  # ceil(8.8)
    assert stream_refill(2, 9, 16, 0.5, 0.0) == 0  # enough in flight: wait
    assert stream_refill(1, 0, 16, 1.0, 0.0) == 1
    assert stream_refill(3, 0, 64, 0.0, 0.0) == 64  # the rate is floored at 0.02 -> 150, capped
    assert stream_refill(0, 0, 8, None, 0.1) == 0


def _run(table, B=3, gen=6, n=2, steps=1, **kw):
    b = DynamicBatcher(cfg(**kw), B, gen, n, 0)
    src = ListSource(prompt_rows(len(table)), shuffle=False)
    stream = FakeGroupStream(FakeRollout(n, scripted(table), response_length=8, seed=1))
    out = [b.next_batch(src, None, stream=stream) for _ in range(steps)]
    return b, stream, out


def test_stops_at_batch_size_aborts_the_rest_and_counts_their_tokens():
    # prompts 1 and 3 are all-wrong, the rest spread
    table = {i: [[0, 0]] if i in (1, 3) else [[0, 1]] for i in range(12)}
    b, stream, (s,) = _run(table, B=3, gen=6, skip=SkipConfig(enable=False))
    m = s.metrics
    assert s.action == "train" and s.num_groups == 3
    finished = m[P + "kept_groups"] + m[P + "filtered_groups"]
    # ceil(3 * 1.1) = 4 at first (no kept-rate estimate yet: taken as 1), refilled as 1 and 3 are
    # filtered and the estimate drops
    launched = len(stream.submitted)
    assert launched >= 6 and m[P + "generated_groups"] == finished + m[P + "aborted_groups"] == launched
    assert m[P + "aborted_groups"] == launched - finished > 0
    # every trained group has spread, and in finish order (the engine clock), not submit order
    acc = np.asarray(s.batch.non_tensors["acc"].tolist(), dtype=float).reshape(3, 2)
    assert (acc.min(1) != acc.max(1)).all()
    # generated tokens = finished groups' response tokens + the aborted groups' partial tokens
    rec_tokens = sum(sum(g["response_lengths"]) for g in s.group_records)
    assert m[P + "generated_response_tokens"] == rec_tokens + stream.aborted_tokens
    assert stream.aborted_tokens > 0
    assert m[P + "gen_tokens_per_train_token"] == pytest.approx(
        m[P + "generated_response_tokens"] / m[P + "trained_response_tokens"]
    )
    assert stream.in_flight == 0
    assert m["train/num_gen_batches"] == -(-launched // 6)  # launched prompts in gen_batch_size units


def test_groups_finishing_together_beyond_the_batch_go_to_the_pool():
    # FakeRollout lengths with seed 1: several groups can finish on the same tick; whatever the
    # tick brings beyond B is carried (staleness 1 next step), never dropped
    table = {i: [[1]] for i in range(40)}  # one sample: always kept
    b, stream, steps = _run(table, B=2, gen=8, n=1, steps=4, skip=SkipConfig(enable=False))
    for s in steps:
        assert s.num_groups == 2
        assert s.metrics[P + "kept_groups"] + s.metrics[P + "carried_in"] >= 2
    assert steps[-1].metrics[P + "surplus_carried"] == len(b.pool)
    carried = sum(s.metrics[P + "carried_in"] for s in steps)
    surplus = sum(s.metrics[P + "surplus_carried"] for s in steps[:-1])
    assert carried == surplus  # max_staleness 1: each carried group is trained on the next step


def test_refill_keeps_engine_busy_while_groups_are_filtered():
    # only every 4th prompt has spread: the stream must refill many times within one step
    table = {i: [[0, 1]] if i % 4 == 0 else [[1, 1]] for i in range(200)}
    b, stream, (s,) = _run(table, B=4, gen=3, skip=SkipConfig(enable=False))
    m = s.metrics
    assert s.num_groups == 4
    assert m[P + "stream_refills"] > 3
    assert m[P + "filtered_all_correct"] >= 9  # prompts 1,2,3,5,6,7,9,10,11 come before 0,4,8,12
    assert len(stream.submitted) == m[P + "generated_groups"]


def test_budget_bounds_launched_prompts_and_on_exhausted_train():
    table = {i: [[0, 1]] if i == 0 else [[0, 0]] for i in range(40)}
    b, stream, (s,) = _run(
        table, B=3, gen=4, max_num_gen_batches=2, on_exhausted="train", skip=SkipConfig(enable=False)
    )
    assert len(stream.submitted) == 8  # 2 x gen_batch_size
    assert s.action == "train" and s.num_groups == 1
    assert s.metrics[P + "partial_step"] == 1.0 and s.metrics["train/num_gen_batches"] == 2
    assert s.metrics[P + "aborted_groups"] == 0


def test_unbounded_step_warns_every_50_rounds_like_default(caplog):
    # max_num_gen_batches=0 and nearly everything filtered: the step keeps going, and says so
    table = {i: [[0, 1]] if i == 120 else [[0, 0]] for i in range(130)}
    with caplog.at_level("WARNING", logger="dapo.sampling"):
        b, stream, (s,) = _run(table, B=1, gen=1, skip=SkipConfig(enable=False))
    assert s.num_groups == 1 and len(stream.submitted) == 121  # 121 rounds of one prompt
    said = [r.getMessage() for r in caplog.records if "generation rounds for one step" in r.getMessage()]
    assert [m.split()[0] for m in said] == ["50", "100"]
    assert "max_num_gen_batches=0" in said[0]


def test_adaptive_rounds_off_keeps_the_engine_full():
    table = {i: [[0, 1]] for i in range(40)}
    b, stream, (s,) = _run(table, B=2, gen=7, adaptive_rounds=False, skip=SkipConfig(enable=False))
    assert stream.max_in_flight == 7 and s.num_groups == 2
    b, stream, (s,) = _run(table, B=2, gen=7, skip=SkipConfig(enable=False))
    assert stream.max_in_flight == 3  # ceil(2 * 1.1)


def test_needs_a_stream():
    b = DynamicBatcher(cfg(), 2, 4, 2, 0)
    with pytest.raises(ValueError, match="strategy=stream needs a group stream"):
        b.next_batch(ListSource(prompt_rows(4)), lambda rows: None)


@settings(max_examples=25, deadline=None)
@given(
    seed=hs.integers(0, 10_000),
    B=hs.integers(1, 5),
    gen=hs.integers(1, 8),
    n=hs.integers(1, 4),
    p=hs.floats(0.05, 0.95),
)
def test_accounting_invariants(seed, B, gen, n, p):
    """Over 3 steps: exactly B groups a step, each with spread (n > 1); generated = kept + filtered
    + aborted; launched prompts = submitted; nothing left in flight."""
    rng = np.random.default_rng(seed)
    probs = {i: float(rng.uniform(0, 1)) * p for i in range(30)}
    b = DynamicBatcher(cfg(skip=SkipConfig(enable=False)), B, gen, n, seed)
    src = ListSource(prompt_rows(30), seed=seed)
    stream = FakeGroupStream(FakeRollout(n, bernoulli(lambda r: max(probs[r["index"]], 0.3)), seed=seed))
    total_generated = 0
    for _ in range(3):
        s = b.next_batch(src, None, stream=stream)
        m = s.metrics
        assert s.num_groups == B and stream.in_flight == 0
        assert (
            m[P + "generated_groups"]
            == m[P + "kept_groups"] + m[P + "filtered_groups"] + m[P + "aborted_groups"]
        )
        assert m[P + "aborted_groups"] <= gen
        total_generated += m[P + "generated_groups"]
        if n > 1:
            acc = np.asarray(s.batch.non_tensors["acc"].tolist(), dtype=float).reshape(B, n)
            assert (acc.min(1) != acc.max(1)).all()
    assert total_generated == len(stream.submitted)


def test_state_round_trip_gives_the_same_next_step():
    probs = {i: (i % 5) / 5 for i in range(30)}
    acc = bernoulli(lambda r: probs[r["index"]])

    def fresh():
        return (
            DynamicBatcher(cfg(), 3, 5, 2, 7),
            ListSource(prompt_rows(30), seed=7),
            FakeRollout(2, acc, seed=3),
        )

    b, src, rollout = fresh()
    for _ in range(2):
        b.next_batch(src, None, stream=FakeGroupStream(rollout))
    saved = (b.state_dict(), src.state_dict(), rollout.rng.bit_generator.state)
    want = b.next_batch(src, None, stream=FakeGroupStream(rollout))

    b2, src2, rollout2 = fresh()
    b2.load_state_dict(saved[0])
    src2.load_state_dict(saved[1])
    rollout2.rng.bit_generator.state = saved[2]
    got = b2.next_batch(src2, None, stream=FakeGroupStream(rollout2))
    assert got.metrics == want.metrics
    assert got.batch.non_tensors["index"].tolist() == want.batch.non_tensors["index"].tolist()
    assert torch.equal(got.batch.tensors["responses"], want.batch.tensors["responses"])


@pytest.mark.parametrize(
    "overrides, says",
    [
        ([], "needs actor_rollout_ref.rollout.name=vllm, got 'hf'"),
        (["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.placement=server"], "placement"),
        (
            ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.multi_turn.enable=true"],
            "multi_turn",
        ),
        (["actor_rollout_ref.rollout.name=vllm", "algorithm.adv_estimator=remax"], "remax"),
        (["actor_rollout_ref.rollout.name=vllm"], None),  # colocated vLLM: valid
    ],
)
def test_validate_refuses_stream_off_the_colocated_engine(overrides, says, tiny_hd32_model_dir, capsys):
    from dapo.cli import main

    base = [
        "validate",
        "algorithm.filter_groups.enable=true",
        "algorithm.filter_groups.strategy=stream",
        f"actor_rollout_ref.model.path={tiny_hd32_model_dir}",  # a head size vLLM's CPU attention takes
    ]
    if says is None:
        assert main(base + overrides) == 0
        return
    assert main(base + overrides) == 2
    err = capsys.readouterr().err
    assert err.startswith("dapo:")
    assert any("algorithm.filter_groups.strategy=stream" in x and says in x for x in err.splitlines()), err
