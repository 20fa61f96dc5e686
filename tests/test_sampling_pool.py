"""The pool of carried-over groups on its own, against hand-built groups: staleness drop, the
re-check, taking the step's batch (carried groups first), and its checkpoint state."""

from __future__ import annotations

import json

import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as hs

from dapo.batch import Batch
from dapo.sampling.pool import Group, GroupPool, with_staleness
from dapo.sampling.step_stats import StepStats

N = 2


def group(i: int, version: int = 0) -> Group:
    """Group ``i``: prompt index i, uid gi, generated at ``version``."""
    return Group(
        Batch(
            tensors={"responses": torch.full((N, 3), i, dtype=torch.int64)},
            non_tensors={"uid": [f"g{i}"] * N, "gen_version": [version] * N, "index": [i] * N},
        ),
        version,
        i,
    )


def uids(b: Batch | None) -> list[str]:
    return [] if b is None else list(dict.fromkeys(b.non_tensors["uid"].tolist()))


def ids(pool: GroupPool) -> list[int]:
    return [g.index for g in pool]


def never(g: Group) -> bool:
    return False


def test_drop_stale_keeps_groups_within_max_staleness():
    pool = GroupPool([group(0, 0), group(1, 1), group(2, 2), group(3, 3)])
    st = StepStats(gen_version=3)
    pool.drop_stale(version=3, max_staleness=1, st=st)
    assert ids(pool) == [2, 3] and st.stale_dropped == 2


def test_recheck_drops_solved_groups_in_order():
    pool = GroupPool([group(i) for i in range(5)])
    st = StepStats(gen_version=0)
    pool.recheck(lambda g: g.index in (1, 3), st)
    assert ids(pool) == [0, 2, 4] and st.recheck_dropped == 2


def test_take_rechecks_first_and_counts_only_surviving_carried_groups():
    # carried 0, 1, 2 (1 solved since), fresh 10, 11; a batch of 3: 0, 2, then fresh 10
    pool = GroupPool([group(0), group(1), group(2)])
    st = StepStats(gen_version=1)
    fresh = [group(10, 1), group(11, 1)]
    batch = pool.take(fresh, 3, exhausted=None, carry_over=True, solved=lambda g: g.index == 1, st=st)
    assert uids(batch) == ["g0", "g2", "g10"]
    assert ids(pool) == [11] and st.carried_in == 2 and st.recheck_dropped == 1


@settings(max_examples=60, deadline=None)
@given(
    hs.integers(0, 5),
    hs.integers(0, 5),
    hs.integers(1, 6),
    hs.booleans(),
    hs.sampled_from([None, "train", "skip"]),
)
def test_take_loses_no_group_silently(carried, fresh, size, carry_over, exhausted):
    assume(exhausted is not None or carried + fresh >= size)  # the rounds ran until the batch was full
    pool = GroupPool([group(i) for i in range(carried)])
    new = [group(100 + i, 1) for i in range(fresh)]
    everything = list(range(carried)) + [100 + i for i in range(fresh)]
    st = StepStats(gen_version=1)
    batch = pool.take(new, size, exhausted=exhausted, carry_over=carry_over, solved=never, st=st)
    taken = [int(u[1:]) for u in uids(batch)]
    if exhausted == "skip" or (exhausted == "train" and not everything):
        assert batch is None and st.carried_in == 0
    else:
        assert taken == everything[:size]  # oldest first: carried before fresh
        assert st.carried_in == min(carried, len(taken))
    # every group is trained on, left in the pool (carry_over) or counted as dropped
    if carry_over:
        assert taken + ids(pool) == everything and st.surplus_dropped == 0
    else:
        assert len(pool) == 0 and st.surplus_dropped == len(everything) - len(taken)


def test_with_staleness_counts_updates_since_generation():
    b = Batch(tensors={}, non_tensors={"gen_version": [0, 0, 2, 2]})
    assert with_staleness(b, 3).non_tensors["staleness"].tolist() == [3, 3, 1, 1]


def test_state_dict_round_trip():
    pool = GroupPool([group(4, 1), group(7, 2)])
    d = pool.state_dict()
    # what a checkpoint writes as JSON: everything but the tensors (a binary file)
    plain = [{"version": g["version"], "index": g["index"], "cols": g["batch"]["non_tensors"]} for g in d]
    assert json.loads(json.dumps(plain))[1] == {
        "version": 2,
        "index": 7,
        "cols": {k: [v] * N for k, v in (("uid", "g7"), ("gen_version", 2), ("index", 7))},
    }
    back = GroupPool.from_state_dict(d)
    assert [(g.index, g.version) for g in back] == [(4, 1), (7, 2)]
    for a, b in zip(pool, back, strict=True):
        assert torch.equal(a.batch.tensors["responses"], b.batch.tensors["responses"])
        assert a.batch.non_tensors["uid"].tolist() == b.batch.non_tensors["uid"].tolist()
