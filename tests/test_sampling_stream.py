"""strategy=stream's bookkeeping on the fake engine clock (sampling/fakes.FakeGroupStream): the refill
rule, the stop at train_batch_size, the drain, draw order, surplus to the pool, budget, state, and the
trained length against the finished length when finishing order follows length."""

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


def test_stops_at_batch_size_drains_the_rest_and_trains_in_draw_order():
    # prompts 1 and 3 are all-wrong, the rest spread
    table = {i: [[0, 0]] if i in (1, 3) else [[0, 1]] for i in range(12)}
    b, stream, (s,) = _run(table, B=3, gen=6, skip=SkipConfig(enable=False))
    m = s.metrics
    assert s.action == "train" and s.num_groups == 3
    finished = m[P + "kept_groups"] + m[P + "filtered_groups"]
    # ceil(3 * 1.1) = 4 at first (no kept-rate estimate yet: taken as 1), refilled as 1 and 3 are
    # filtered and the estimate drops; what is in flight at the close is finished, not aborted
    launched = [r["index"] for r in stream.submitted]
    assert len(launched) >= 6 and m[P + "generated_groups"] == finished == len(launched)
    assert m[P + "aborted_groups"] == 0 and stream.aborted_tokens == 0 and m[P + "drained_groups"] > 0
    # the batch is the first three kept prompts in draw order (0, 2, 4), whatever finished first;
    # the other kept ones wait in the pool in draw order
    kept = [i for i in launched if i not in (1, 3)]
    assert s.batch.non_tensors["index"].tolist()[::2] == kept[:3]
    assert [g.index for g in b.pool] == kept[3:] and m[P + "surplus_carried"] == len(kept) - 3
    acc = np.asarray(s.batch.non_tensors["acc"].tolist(), dtype=float).reshape(3, 2)
    assert (acc.min(1) != acc.max(1)).all()
    rec_tokens = sum(sum(g["response_lengths"]) for g in s.group_records)
    assert m[P + "generated_response_tokens"] == rec_tokens
    assert m[P + "gen_tokens_per_train_token"] == pytest.approx(
        m[P + "generated_response_tokens"] / m[P + "trained_response_tokens"]
    )
    assert stream.in_flight == 0
    assert m["train/num_gen_batches"] == -(-len(launched) // 6)  # launched prompts in gen_batch_size units


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


def _length_run(lengths, acc, B, gen, n, steps, seed=0):
    """A stream run whose finishing order follows length: per step, the lengths of the trained
    groups (draw order) and the two length metrics."""
    b = DynamicBatcher(cfg(skip=SkipConfig(enable=False)), B, gen, n, seed)
    src = ListSource(prompt_rows(len(lengths)), shuffle=False)
    rollout = FakeRollout(
        n, acc, response_length=max(lengths), seed=seed, length_fn=lambda r, n, rng: [lengths[r["index"]]] * n
    )
    stream = FakeGroupStream(rollout)
    return b, stream, [b.next_batch(src, None, stream=stream) for _ in range(steps)]


def test_stream_length_bias_hand_built_trains_the_draw_order_not_the_short_ones():
    # even prompts take 8 ticks, odd ones 1; every group has spread, so all are kept. Finishing
    # order puts the short ones first (a batch taken in that order would be mostly 1-token
    # responses); the batch is a window of the draw order: two long and two short groups
    lengths = [8, 1] * 40
    acc = scripted({i: [[0, 1]] for i in range(80)})
    b, stream, steps = _length_run(lengths, acc, B=4, gen=8, n=2, steps=6)
    for s in steps:
        assert sorted(lengths[i] for i in s.batch.non_tensors["index"].tolist()[::2]) == [1, 1, 8, 8]
        assert s.metrics[P + "trained_response_length_mean"] == 4.5
        assert s.metrics[P + "aborted_groups"] == 0
    # step 1 launches 0..4 (ceil(4 * 1.1)); 1 and 3 come back first, and the three in flight are
    # expected to fill the batch, so nothing more is launched; 0, 2, 4 finish at tick 8 and 4,
    # fifth in draw order, is carried: (1 + 1 + 8 + 8 + 8) / 5 finished against 4.5 trained
    first = steps[0]
    assert [g["index"] for g in first.group_records] == [1, 3, 0, 2, 4]
    assert first.metrics[P + "finished_response_length_mean"] == 26 / 5
    # over the run: the trained groups are the first 24 drawn, in draw order, and the 25th waits
    # in the pool; the trained mean is the finished mean of everything but that carried group
    drawn = [r["index"] for r in stream.submitted]
    assert [i for s in steps for i in s.batch.non_tensors["index"].tolist()[::2]] == drawn[:24]
    assert [g.index for g in b.pool] == drawn[24:] == [24]
    trained = [x for s in steps for x in s.batch.tensors["response_mask"].sum(-1).tolist()]
    finished = [x for s in steps for g in s.group_records for x in g["response_lengths"]]
    assert sum(trained) / len(trained) == (sum(finished) - 2 * 8) / (len(finished) - 2) == 4.5


@settings(max_examples=20, deadline=None)
@given(seed=hs.integers(0, 10_000), B=hs.integers(4, 8), gen=hs.integers(4, 12), p=hs.floats(0.2, 0.8))
def test_stream_length_bias_trained_mean_follows_the_finished_mean(seed, B, gen, p):
    """Lengths 1..16 per prompt, correctness independent of length, finishing order by length:
    over 40 steps the trained responses' mean length is within 4% of the kept finished ones' (they
    differ by the last step's pool only) and within 12% of all finished ones' (kept or filtered
    is a coin flip; about 4 standard errors). Taking the batch in finishing order and aborting the
    rest fails both."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 17, size=300).tolist()
    b, stream, steps = _length_run(lengths, bernoulli(lambda r: p), B=B, gen=gen, n=2, steps=40, seed=seed)
    trained = [x for s in steps for x in s.batch.tensors["response_mask"].sum(-1).tolist()]
    records = [g for s in steps for g in s.group_records]
    kept = [x for g in records if g["fate"] == "kept" for x in g["response_lengths"]]
    finished = [x for g in records for x in g["response_lengths"]]
    t, k, f = float(np.mean(trained)), float(np.mean(kept)), float(np.mean(finished))
    assert abs(t - k) <= 0.04 * k, (t, k)
    assert abs(t - f) <= 0.12 * f, (t, f)
    assert sum(s.metrics[P + "aborted_groups"] for s in steps) == 0
