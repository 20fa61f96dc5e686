"""Dynamic sampling inside async training (``dapo.sampling.async_loop``) on the sampling layer's
fakes: the staleness bound (drop and wait), batches in launch order (no length bias), the round
budget when every group is filtered, the kept groups across a checkpoint, and the per-batch
version figures."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dapo.batch import Batch
from dapo.config.sampling import FilterGroupsConfig
from dapo.sampling import DynamicBatcher, GenerationBudgetExhausted
from dapo.sampling.async_loop import LAUNCH_SEQ as LAUNCH
from dapo.sampling.async_loop import AsyncSampler, launch_seq, version_metrics
from dapo.sampling.fakes import FakeGroupEngine, FakeRollout, ListSource, bernoulli, fake_finish

N, B = 4, 4


def rows(num: int) -> list[dict]:
    return [
        {"index": i, "prompt_ids": [i], "data_source": "fake", "reward_model": {"ground_truth": "x"}}
        for i in range(num)
    ]


def build(
    cfg: FilterGroupsConfig, acc, delay=lambda p: 0, k=1, action="drop", state=None, num=32, slots=None
):
    batcher = DynamicBatcher(cfg, B, 8, N, seed=0)
    source = ListSource(rows(num), seed=0)
    if state is not None:
        batcher.load_state_dict(state["batcher"])
        source.load_state_dict(state["source"])
    engine = FakeGroupEngine(delay, slots=slots)
    engine.version = batcher.version
    a = AsyncSampler(
        batcher,
        source,
        engine,
        fake_finish(FakeRollout(N, acc, seed=1)),
        max_off_policy_threshold=k,
        max_off_policy_strategy=action,
    )
    return batcher, source, engine, a


def close(a: AsyncSampler, engine: FakeGroupEngine) -> None:
    a.close()
    engine.close()


def train(a: AsyncSampler, engine: FakeGroupEngine, steps: int) -> list:
    out = []
    for _ in range(steps):
        step = a.next_batch()
        out.append(step)
        if step.action == "train":
            engine.publish(a.advance())  # the update, then its weights to the engine
    return out


HALF = bernoulli(lambda r: 0.5)


@pytest.mark.parametrize("action", ["drop", "wait"])
def test_async_staleness_bound_is_honoured(action):
    # prompt 0 decodes for 40 engine ticks while the trainer's updates take no time at all: the
    # trainer outruns generation, yet no batch holds a group older than the bound
    cfg = FilterGroupsConfig(enable=True, max_staleness=1)
    batcher, _, engine, a = build(cfg, HALF, delay=lambda p: 40 if p[0] == 0 else 0, k=1, action=action)
    try:
        steps = train(a, engine, 12)  # >= 48 prompts: prompt 0 is launched by step 8
    finally:
        close(a, engine)
    trained = [s for s in steps if s.action == "train"]
    assert len(trained) == 12
    for s in trained:
        assert len(s.batch) == B * N
        stale = [int(x) for x in s.batch["staleness"]]
        assert max(stale) <= 1 and s.metrics["async/staleness_max"] <= 1
        # a group's staleness is counted from its oldest token
        versions = s.batch.tensors["token_versions"]
        live = versions >= 0
        for row in range(len(s.batch)):
            oldest = int(versions[row][live[row]].min())
            assert int(s.batch["gen_version"][row]) == oldest
            assert int(s.batch["staleness"][row]) == s.metrics["async/policy_version"] - oldest
    assert batcher.version == 12
    if action == "wait":
        assert engine.ever_held  # the pool reached its lead and decoding paused


def test_async_batches_follow_launch_order_not_finishing_order():
    # the length-bias check: odd prompts decode for 30 ticks, even ones finish at once. Taking
    # whatever finished first would fill every batch with even prompts while the odd ones age
    # past the bound; in launch order the trainer waits for them, so they are trained as often
    cfg = FilterGroupsConfig(enable=True, max_staleness=2)
    batcher, _, engine, a = build(cfg, HALF, delay=lambda p: 30 if p[0] % 2 else 0, k=2, action="drop")
    try:
        steps = train(a, engine, 10)
        with a.cv:
            left = [launch_seq(g) for g in batcher.pool]
    finally:
        close(a, engine)
    seqs = [int(x) for s in steps for x in s.batch[LAUNCH][::N]]
    assert len(seqs) == 10 * B
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)  # batch after batch, in launch order
    # no kept group launched before the last trained one was passed over (it was trained, or
    # filtered, or expired: never left in the pool behind a later one)
    assert all(q > seqs[-1] for q in left)
    slow = [int(x) % 2 for s in steps for x in s.batch["index"][::N]]
    assert sum(slow) >= 10  # ~half of the 40 trained groups are slow ones, not none
    assert max(s.metrics["async/staleness_max"] for s in steps) <= 2


def test_async_wait_holds_the_pool_to_its_lead():
    cfg = FilterGroupsConfig(enable=True, max_staleness=2)
    batcher, _, engine, a = build(cfg, HALF, k=2, action="wait")
    try:
        for _ in range(2):
            a.next_batch()
            seen = []
            with a.cv:  # the pool fills to k batches, then generation holds
                while not (engine.held and len(batcher.pool) >= 2 * B):
                    a.cv.wait(0.1)
                    seen.append(len(batcher.pool))
                for _ in range(5):  # held: nothing more comes in
                    a.cv.wait(0.1)
                    seen.append(len(batcher.pool))
            # what was in flight when decoding paused can only add the groups launched for it
            assert max(seen) <= 2 * B + batcher.gen_batch_size
    finally:
        close(a, engine)


def test_async_drop_bounds_the_groups_in_flight_when_the_engine_falls_behind():
    # an engine that decodes 2 groups at a time and is paused: what the trainer's updates leave
    # queued has no token, so it never expires; new prompts must not pile up behind it version
    # after version (each version's refill would otherwise launch gen_batch_size more)
    cfg = FilterGroupsConfig(enable=True, max_staleness=1)
    batcher, _, engine, a = build(cfg, HALF, k=1, action="drop", slots=2)
    cap = batcher.gen_batch_size * (1 + 1)  # what k=1 can still train: this version's and the last's
    engine.hold(True)
    seen = []
    try:
        for _ in range(8):
            with a.cv:
                v = a.advance()
            engine.publish(v)
            with a.cv:
                for _ in range(20):  # let the scoring thread refill at this version (if it may)
                    a.cv.wait(0.05)
                seen.append(len(a._rows))
                assert len(a._rows) == len(engine._flight)  # every group the sampler tracks is in the engine
        assert max(seen) <= cap and engine.queued() <= cap
        assert a.totals["dropped_in_flight"] > 0  # the running ones went stale and were dropped
        engine.hold(False)  # decoding resumes: the trainer gets full batches again
        steps = train(a, engine, 3)
    finally:
        close(a, engine)
    assert [s.action for s in steps] == ["train"] * 3 and all(len(s.batch) == B * N for s in steps)


def test_async_every_prompt_filtered_round_budget_answers():
    never = bernoulli(lambda r: 0.0)  # every group all wrong: nothing is ever kept
    cfg = FilterGroupsConfig(enable=True, max_num_gen_batches=2, on_exhausted="train")
    batcher, source, engine, a = build(cfg, never)
    try:
        steps = train(a, engine, 3)
    finally:
        close(a, engine)
    for s in steps:
        assert s.action == "skip" and s.batch is None
        assert s.metrics["dynamic_sampling/filtered_all_wrong"] == 2 * 8  # the budget: 2 x gen_batch_size
        assert s.metrics["train/num_gen_batches"] == 2
    assert batcher.version == 0 and len(engine.submitted) == 3 * 16

    cfg = FilterGroupsConfig(enable=True, max_num_gen_batches=1, on_exhausted="error")
    _, _, engine, a = build(cfg, never)
    try:
        with pytest.raises(GenerationBudgetExhausted, match="max_num_gen_batches=1"):
            a.next_batch()
    finally:
        close(a, engine)


def test_async_kept_groups_survive_a_checkpoint_resume():
    cfg = FilterGroupsConfig(enable=True, max_staleness=2)
    batcher, source, engine, a = build(cfg, HALF, k=2, action="wait")
    try:
        train(a, engine, 2)
        with a.cv:  # the pool fills ahead of the trainer, then a checkpoint is taken
            while len(batcher.pool) < 2 * B:
                a.cv.wait(0.2)
            state = {"batcher": batcher.state_dict(), "source": source.state_dict()}
            # the trainer takes the groups in the order they were launched
            saved = [(g.version, str(g.batch["uid"][0])) for g in sorted(batcher.pool, key=launch_seq)]
            version = batcher.version
    finally:
        close(a, engine)
    assert len(saved) >= 2 * B
    # a new process: the batcher and the prompt source from the checkpoint
    batcher2, _, engine2, a2 = build(cfg, HALF, k=2, action="wait", state=state)
    try:
        first, second = train(a2, engine2, 2)
    finally:
        close(a2, engine2)
    assert [str(u) for u in first.batch["uid"][::N]] == [u for _, u in saved[:B]]
    # one update later the saved groups still within the bound come next: none is lost
    within = [u for v, u in saved[B:] if version + 1 - v <= 2]
    head = within[:B]
    assert [str(u) for u in second.batch["uid"][::N]][: len(head)] == head
    assert first.metrics["async/staleness_max"] <= 2


def test_async_version_metrics_by_hand():
    # two groups of two rows: group 0 crossed a sync (versions 3 then 4), group 1 is all version 4
    v = torch.tensor([[3, 3, 4, -1], [3, 4, -1, -1], [4, 4, 4, 4], [4, -1, -1, -1]])
    b = Batch(
        tensors={"token_versions": v},
        non_tensors={"staleness": np.asarray([2, 2, 1, 1], dtype=object)},
    )
    m = version_metrics(b, 2)
    assert m == {
        "async/staleness_mean": 1.5,
        "async/staleness_max": 2.0,
        "async/min_token_version": 3.0,
        "async/max_token_version": 4.0,
        "async/partial_groups": 1.0,
        "async/version_span_max": 1.0,
    }


def test_async_resumes_a_checkpoint_whose_pool_has_no_launch_positions():
    # a checkpoint written before groups kept their launch position: its pooled groups go first,
    # and batches that mix them with new groups still concatenate
    cfg = FilterGroupsConfig(enable=True, max_staleness=2)
    batcher, source, engine, a = build(cfg, HALF, k=2, action="wait")
    try:
        train(a, engine, 2)
        with a.cv:
            while len(batcher.pool) < 2 * B:
                a.cv.wait(0.2)
            for g in batcher.pool:
                del g.batch.non_tensors[LAUNCH]
            old = [str(g.batch["uid"][0]) for g in batcher.pool]
            state = {"batcher": batcher.state_dict(), "source": source.state_dict()}
    finally:
        close(a, engine)
    batcher2, _, engine2, a2 = build(cfg, HALF, k=2, action="wait", state=state)
    try:
        steps = train(a2, engine2, 4)
    finally:
        close(a2, engine2)
    assert [s.action for s in steps] == ["train"] * 4 and all(len(s.batch) == B * N for s in steps)
    first = [str(u) for u in steps[0].batch["uid"][::N]]
    assert first == old[:B]  # the old pool's groups first, in their pool order
