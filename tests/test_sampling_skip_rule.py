"""The skip rule: faded evidence is rolled out, and no prompt is skipped past the horizon."""

from math import inf, log

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo.sampling import posterior
from dapo.sampling.history import PromptHistory, revisit_bound


def test_skip_horizon_hand_values_and_tightness():
    # ln(32 / 4) / ln(1 / 0.5) = 3: the weight is 32, 16, 8, 4 after 0..3 updates, then 2
    assert posterior.skip_horizon(32, 4, 0.5) == 3
    assert posterior.skip_horizon(32, 4, 1.0) == inf and posterior.skip_horizon(32, 0, 0.9) == inf
    assert posterior.skip_horizon(4, 8, 0.9) == 0
    # one group of 8 above half a group, decay 0.998: ln 2 / -ln 0.998 = 346.2
    assert posterior.skip_horizon(8, 4, 0.998) == 346
    a, b = posterior.capped(0.5 + 30, 0.5 + 2, (0.5, 0.5), 32)
    for t, skippable in ((3, True), (4, False)):
        da, db = posterior.decayed(a, b, t, 0.5, (0.5, 0.5))
        assert (posterior.weight(da, db, (0.5, 0.5)) >= 4 - 1e-9) == skippable


@given(st.floats(0.1, 60), st.floats(0.1, 60), st.floats(0.2, 3), st.floats(0.2, 3), st.floats(1, 80))
def test_cap_keeps_the_mean_and_bounds_the_weight(a, b, a0, b0, cap):
    prior = (a0, b0)
    ca, cb = posterior.capped(a0 + a, b0 + b, prior, cap)
    assert posterior.weight(ca, cb, prior) <= cap * (1 + 1e-9)
    assert posterior.weight(ca, cb, prior) == pytest.approx(min(a + b, cap))
    assert ca - a0 == pytest.approx(a * min(1.0, cap / (a + b)))  # both excesses scaled alike
    assert posterior.capped(ca, cb, prior, cap) == (ca, cb)  # capping again changes nothing


def test_the_prior_alone_skips_under_the_old_rule_and_not_under_the_new():
    # Jeffreys, n=8: the prior alone gives P(no spread) 0.39 >= 0.2, so with min_weight=0 a prompt
    # last seen at 4/8 a thousand updates ago is skipped on the prior's say-so; with a minimum
    # weight its faded evidence (8 * 0.85^1000) rolls it out
    assert posterior.zero_spread_prob(0.5, 0.5, 8) == pytest.approx(0.3927, abs=1e-4)
    h = PromptHistory(prior=(0.5, 0.5), decay=0.85)
    h.record(0, filtered=False, mean=0.5, correct=4, n=8, version=0)
    rng = np.random.default_rng(0)
    kw = dict(prob=0.2, max_prob=0.998, max_updates=10**6, version=1000, n=8, rng=rng, explore=False)
    assert h.should_skip_posterior(0, **kw, min_weight=0.0)
    assert not h.should_skip_posterior(0, **kw, min_weight=4.0)


@settings(max_examples=200, deadline=None)
@given(
    decay=st.floats(0.5, 0.999),
    prior=st.tuples(st.floats(0.2, 4.0), st.floats(0.2, 4.0)),
    threshold=st.floats(0.01, 1.0),
    n=st.integers(2, 32),
    min_groups=st.floats(0.05, 2.0),
    extra=st.floats(0.0, 6.0),
    groups=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=12),
    late=st.integers(1, 500),
)
def test_decayed_evidence_is_rolled_out(decay, prior, threshold, n, min_groups, extra, groups, late):
    # whatever the prior predicts (a U-shaped one predicts no spread), the threshold and n: once
    # the evidence has decayed past the horizon, the prompt is rolled out on every draw
    min_w, max_w = min_groups * n, (min_groups + extra) * n
    h = PromptHistory(prior=prior, decay=decay, max_weight=max_w)
    for v, frac in enumerate(groups):
        k = round(frac * n)
        h.record(7, filtered=k in (0, n), mean=k / n, correct=k, n=n, version=v)
    last = len(groups) - 1
    horizon = h.horizon(min_w)
    assert horizon == posterior.skip_horizon(max_w, min_w, decay) < inf
    version = last + int(horizon) + late
    a, b = h.posterior(7, version)
    assert posterior.weight(a, b, prior) < min_w
    assert not posterior.confident_no_spread(a, b, n, prior=prior, threshold=threshold, min_weight=min_w)
    rng = np.random.default_rng(0)
    kw = dict(prob=threshold, max_prob=0.999, max_updates=10**9, version=version, n=n, rng=rng)
    assert not any(h.should_skip_posterior(7, **kw, min_weight=min_w) for _ in range(20))


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 8), st.integers(0, 100), st.integers(1, 4)), min_size=1, max_size=12),
    st.floats(0.8, 0.98),
    st.floats(0.3, 1.5),
    st.floats(0.0, 3.0),
    st.floats(0.05, 0.9),
    st.integers(0, 300),
    st.integers(0, 2**31 - 1),
)
def test_no_prompt_is_skipped_past_the_bound(groups, decay, min_groups, extra, threshold, max_updates, seed):
    # a prompt solved k of 8 times, then drawn `draws` times per update until it is rolled out
    # again: every skip comes at most min(horizon, its own revisit bound - 1) updates after its
    # last rollout, so a learnable prompt whose evidence said otherwise is back within the bound
    n = 8
    min_w, max_w = min_groups * n, (min_groups + extra) * n
    h = PromptHistory(prior=(0.5, 0.5), decay=decay, max_weight=max_w)
    rng = np.random.default_rng(seed)
    bound = min(h.horizon(min_w), revisit_bound(3, max_updates) - 1 if max_updates else inf)
    version = 0
    for k, wait, draws in groups:
        h.record(3, filtered=k in (0, n), mean=k / n, correct=k, n=n, version=version)
        rolled = version
        for version in range(rolled, rolled + wait + int(min(bound, 10**4)) + 2):
            kw = dict(prob=threshold, max_prob=0.998, max_updates=max_updates, version=version, n=n, rng=rng)
            if any(not h.should_skip_posterior(3, **kw, min_weight=min_w) for _ in range(draws)):
                break  # rolled out: a new group follows
            assert version - rolled <= bound
        else:
            pytest.fail("never rolled out")


def test_skip_horizon_matches_the_decay_it_is_derived_from():
    # the horizon is the largest t with max_w * decay^t >= min_w
    for max_w, min_w, d in ((24, 4, 0.998), (16, 4, 0.9), (80, 1, 0.97)):
        t = posterior.skip_horizon(max_w, min_w, d)
        assert max_w * d**t >= min_w * (1 - 1e-9) and max_w * d ** (t + 1) < min_w
        assert t == int(log(max_w / min_w) / -log(d))


def test_thompson_draw_is_fixed_per_prompt_and_version():
    h = PromptHistory(prior=(1.0, 1.0), decay=1.0)
    for _ in range(10):
        h.record(0, filtered=True, mean=0.0, correct=0, n=8)  # Beta(1, 81): p < 0.05 nearly surely
    h.record(1, filtered=False, mean=0.5, correct=4, n=8)
    kw = dict(prob=0.5, max_updates=10**6, n=8, seed=3)
    assert all(h.should_skip_thompson(0, version=v, **kw) for v in range(50))
    # Beta(5, 5): P(p^8 + (1-p)^8 >= 0.5) = P(p < 0.083 or p > 0.917) = 0.0004
    assert sum(h.should_skip_thompson(1, version=v, **kw) for v in range(200)) <= 2
    first = [h.should_skip_thompson(1, version=v, **kw) for v in range(200)]
    assert first == [h.should_skip_thompson(1, version=v, **kw) for v in range(200)]
    assert not h.should_skip_thompson(2, version=0, **kw)  # never a prompt without history


def test_history_round_trip_keeps_capped_records_exact():
    h = PromptHistory(prior=(1.0, 1.0), decay=0.99, max_weight=24)
    for v, k in enumerate((3, 5, 8, 8, 7)):
        h.record(4, filtered=k == 8, mean=k / 8, correct=k, n=8, version=v)
    assert posterior.weight(h.records[4].alpha, h.records[4].beta, (1.0, 1.0)) == pytest.approx(24)
    back = PromptHistory.from_state_dict(h.state_dict(), (1.0, 1.0), 0.99, 24)
    assert back.records == h.records
    # a record saved without a cap is capped on loading, so the horizon holds for it too
    wide = PromptHistory.from_state_dict(h.state_dict(), (1.0, 1.0), 0.99, 8)
    r = wide.records[4]
    assert posterior.weight(r.alpha, r.beta, (1.0, 1.0)) == pytest.approx(8)
    # the evidence's own proportions are kept (the prior's share of the mean grows)
    ra, rb = h.records[4].alpha - 1.0, h.records[4].beta - 1.0
    assert (r.alpha - 1.0) / (r.beta - 1.0) == pytest.approx(ra / rb)
