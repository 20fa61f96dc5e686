"""The trend skip rule: its solve-rate model (hand-computed values, a fit that recovers known
effects), its bounds (decayed evidence is rolled out; never skipped past the stated horizon), the
two thresholds, confirmation of an unlucky first group, and an exact resume."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo.config.sampling import FilterGroupsConfig, SkipConfig, TrendConfig, validate
from dapo.sampling import DynamicBatcher
from dapo.sampling import solve_model as sm
from dapo.sampling.fakes import FakeRollout, ListSource, bernoulli, prompt_rows
from dapo.sampling.trend import TrendModel


def test_flat_prior_is_uniform_in_the_solve_rate():
    lp = sm.flat_log_prior()
    w = np.exp(lp)
    assert w.sum() == pytest.approx(1.0)
    assert lp == pytest.approx(lp[::-1])  # symmetric in theta
    # mass with p < 0.25 is 1/4 under Beta(1, 1), up to the grid's resolution
    assert w[sm.GRID < math.log(0.25 / 0.75)].sum() == pytest.approx(0.25, abs=0.02)


def test_group_loglik_and_evidence_by_hand():
    ll = sm.group_loglik(3, 8, 0.5)
    i = int(np.argmin(abs(sm.GRID - 1.0)))  # theta = 1.0: logit 1.5 with the shift
    p = 1 / (1 + math.exp(-1.5))
    assert ll[i] == pytest.approx(3 * math.log(p) + 5 * math.log(1 - p))
    groups = np.array([[0, 0, 8, 8], [2, 10, 4, 8]])
    assert sm.evidence(groups, 0.9, 10) == pytest.approx(8 * 0.9**10 + 8)
    # prompt_loglik sums each group's log-likelihood at the shift from its time to the newest
    # group's: the older group saw the prompt 0.3 * 2 + 0.01 * 10 logits lower
    both = sm.prompt_loglik(groups, 0.3, 0.01)
    assert both == pytest.approx(sm.group_loglik(8, 8, -(0.3 * 2 + 0.01 * 10)) + sm.group_loglik(4, 8, 0.0))


def test_prediction_of_a_known_rate_is_the_point_formula():
    # a posterior all at one theta: q is p^n + (1-p)^n at theta + shift
    i = int(np.argmin(abs(sm.GRID - (-0.7))))
    ll = np.full(sm.GRID.size, -1e9)
    ll[i] = 0.0
    for shift, n in ((0.0, 8), (1.2, 8), (-0.4, 16)):
        p = 1 / (1 + math.exp(-(sm.GRID[i] + shift)))
        assert sm.predict_zero_spread(ll, sm.flat_log_prior(), shift, n) == pytest.approx(p**n + (1 - p) ** n)
    assert sm.predict_zero_spread(ll, sm.flat_log_prior(), 0.0, 1) == 1.0


def test_no_spread_is_predicted_more_often_after_a_group_without_spread():
    flat = sm.flat_log_prior()
    nothing = np.zeros(sm.GRID.size)
    q0 = sm.predict_zero_spread(nothing, flat, 0.0, 8)
    # under Beta(1, 1): E[p^8] + E[(1-p)^8] = 2/9; after 0 of 8 right, Beta(1, 9): 9/17 + tiny
    assert q0 == pytest.approx(2 / 9, abs=0.01)
    q1 = sm.predict_zero_spread(sm.group_loglik(0, 8, 0.0), flat, 0.0, 8)
    assert q1 == pytest.approx(9 / 17, abs=0.01)


def test_fit_recovers_the_gain_and_drift_it_is_given():
    # 400 prompts from a U-shaped pool, each rolled out at 6 versions, trained between some of
    # them; true gain 0.3 per trained group, drift 0.01 per update
    rng = np.random.default_rng(0)
    kind = rng.random(400)
    theta = np.where(
        kind < 0.4,
        rng.uniform(3, 5, 400),
        np.where(kind < 0.7, rng.uniform(-5, -3, 400), rng.normal(0, 1, 400)),
    )
    groups = []
    for th in theta:
        t, rows = 0, []
        for v in sorted(rng.choice(200, 6, replace=False)):
            p = 1 / (1 + math.exp(-(th + 0.3 * t + 0.01 * v)))
            rows.append([t, v, rng.binomial(8, p), 8])
            t += int(rng.integers(0, 3))
        groups.append(np.array(rows, dtype=float))
    f = sm.Fit(0.0, 0.0, sm.flat_log_prior())
    for _ in range(6):
        f = sm.fit(groups, f, gain_sd=1.0, drift_sd=0.05)
    assert f.gamma == pytest.approx(0.3, abs=0.08)
    assert f.delta == pytest.approx(0.01, abs=0.004)
    # the learnt prior puts most of its mass at the extremes, as the pool does
    w = np.exp(f.log_prior)
    assert w[abs(sm.GRID) > 2.5].sum() > 0.5


def test_fit_without_revisits_keeps_the_effects_at_zero():
    groups = [
        np.array([[0, v, k, 8]], dtype=float)
        for v, k in zip(range(0, 300, 3), [0, 8, 3, 5] * 25, strict=True)
    ]
    f = sm.fit(groups, sm.Fit(0.0, 0.0, sm.flat_log_prior()), gain_sd=0.2, drift_sd=0.005)
    assert f.gamma == pytest.approx(0.0, abs=1e-6)  # nothing was ever trained: no evidence on the gain
    assert f.delta < 0.005


def _model(**kw) -> TrendModel:
    return TrendModel(dataclasses.replace(TrendConfig(), **kw), n=8)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 8), st.integers(0, 30)), min_size=1, max_size=16),
    st.floats(0.9, 0.9999),
    st.floats(0.25, 4.0),
    st.integers(1, 16),
    st.floats(0.01, 1.0),
    st.floats(0.01, 1.0),
)
def test_a_prompt_is_never_skipped_past_its_horizon(outcomes, decay, min_evidence, max_groups, th, rth):
    # whatever its groups said: once its evidence has decayed under min_evidence groups (at the
    # latest horizon() updates after the last rollout) the rule rolls it out
    m = _model(
        decay=decay, min_evidence=min_evidence, max_groups=max_groups, threshold=th, revisit_threshold=rth
    )
    v = 0
    for k, gap in outcomes:
        v += gap
        m.record(3, correct=k, n=8, version=v, trained=0)
    h = m.horizon()
    assert h < math.inf
    if min_evidence > max_groups:
        return
    late = v + int(h) + 1
    assert m.evidence_groups(3, late) < min_evidence
    assert m.skips(3, version=late, last_rollout=v, trained=0)[0] is False
    # and within the horizon a prompt is skipped only on at least min_evidence groups
    for at in (v, v + int(h) // 2):
        if m.skips(3, version=at, last_rollout=v, trained=0)[0]:
            assert m.evidence_groups(3, at) >= min_evidence


def test_a_long_run_keeps_the_prompt_inside_the_grid():
    # a drift of 0.005 per update over 3000 updates is 15 logits, more than the grid's half-width:
    # a prompt seen half right twice at that point is still predicted to spread, and a prompt
    # seen all wrong twice is still predicted hopeless, as at the start of a run
    m = _model()
    m.fitted = sm.Fit(0.0, 0.005, sm.flat_log_prior())
    for v0 in (0, 3000):
        for i, k in ((1, 4), (2, 0)):
            m.record(i + v0, correct=k, n=8, version=v0, trained=0)
            m.record(i + v0, correct=k, n=8, version=v0 + 1, trained=0)
        assert m.zero_spread_prob(1 + v0, v0 + 2, 0) < 0.1
        assert m.skips(1 + v0, version=v0 + 2, last_rollout=v0 + 1, trained=0)[0] is False
        assert m.zero_spread_prob(2 + v0, v0 + 2, 0) > 0.65
    assert m.zero_spread_prob(3001, 3002, 0) == pytest.approx(m.zero_spread_prob(1, 2, 0))


def test_the_revisit_threshold_applies_after_revisit_after_updates():
    m = _model(threshold=0.1, revisit_threshold=0.65, revisit_after=60, min_evidence=1.0)
    for v in (0, 1):  # 7 of 8 twice: q about 0.3 under the flat prior
        m.record(5, correct=7, n=8, version=v, trained=0)
    q = m.zero_spread_prob(5, 30, 0)
    assert 0.1 <= q < 0.65
    assert m.skips(5, version=30, last_rollout=1, trained=0)[:2] == (True, q)
    skip, q_away, threshold = m.skips(5, version=61, last_rollout=1, trained=0)
    assert (skip, threshold) == (False, 0.65) and q_away == pytest.approx(q)


def test_evidence_under_min_evidence_is_rolled_out_whatever_it_says():
    m = _model(min_evidence=1.25)
    m.record(2, correct=0, n=8, version=0, trained=0)  # one group: q = 9/17 > threshold
    assert m.zero_spread_prob(2, 0, 0) > 0.5
    assert m.skips(2, version=0, last_rollout=0, trained=0)[0] is False
    m.record(2, correct=0, n=8, version=1, trained=0)
    assert m.skips(2, version=1, last_rollout=1, trained=0)[0] is True


def test_state_round_trips_exactly_through_json():
    m = _model(refit_every=1)
    rng = np.random.default_rng(1)
    for v in range(12):
        for i in range(20):
            m.record(i, correct=int(rng.integers(0, 9)), n=8, version=v, trained=v // 3)
        m.maybe_refit(v + 1)
    m.confirm_later(7, {"index": 7, "prompt": "x"}, 11)
    back = _model(refit_every=1)
    back.load_state_dict(json.loads(json.dumps(m.state_dict())))
    assert [back.zero_spread_prob(i, 13, 4) for i in range(21)] == [
        m.zero_spread_prob(i, 13, 4) for i in range(21)
    ]
    assert (back.fitted.gamma, back.fitted.delta) == (m.fitted.gamma, m.fitted.delta)
    assert back.due_confirmations(12, 5) == [{"index": 7, "prompt": "x"}]


def test_a_prompt_whose_first_group_had_no_spread_is_rolled_out_again_next_step():
    # prompts 0-3 never solved, 4-15 half the time, 8 drawn per round in order: after the first
    # step's rollouts (0-7), the next step rolls every prompt whose first group was all wrong out
    # once more before anything else; without confirmation it walks on (8-15)
    probs = [0.0] * 4 + [0.5] * 12

    def run(confirm: bool) -> list[list[int]]:
        skip = SkipConfig(trend=TrendConfig(confirm=confirm))
        b = DynamicBatcher(FilterGroupsConfig(enable=True, adaptive_rounds=False, skip=skip), 4, 8, 8, 0)
        src = ListSource(prompt_rows(16), shuffle=False)
        gen = FakeRollout(8, bernoulli(lambda r: probs[r["index"]]), seed=2)
        out = []
        for _ in range(3):
            s = b.next_batch(src, gen)
            out.append([g["index"] for g in s.group_records])
        return out

    with_confirm, without = run(True), run(False)
    assert with_confirm[0] == without[0] == list(range(8))
    assert with_confirm[1][:4] == [0, 1, 2, 3]  # confirmations first, in the order they were queued
    assert not {0, 1, 2, 3} & set(with_confirm[2])  # two groups all wrong: skipped from now on
    assert not {0, 1, 2, 3} & set(without[1])


def test_trend_keys_are_validated_by_name():
    bad = FilterGroupsConfig(
        skip=SkipConfig(trend=TrendConfig(threshold=0.0, refit_every=0, min_evidence=20.0))
    )
    problems = validate(bad)
    assert any("skip.trend.threshold" in p for p in problems)
    assert any("skip.trend.refit_every" in p for p in problems)
    assert any("skip.trend.min_evidence" in p and "max_groups" in p for p in problems)


def test_keys_the_rule_in_force_does_not_read_are_named():
    from dapo.config.sampling import skip_rule_warnings

    assert skip_rule_warnings(FilterGroupsConfig()) == []
    (line,) = skip_rule_warnings(FilterGroupsConfig(enable=True, skip=SkipConfig(threshold=0.5, decay=0.9)))
    assert "skip.decay, algorithm.filter_groups.skip.threshold: not read" in line and "rule=trend" in line
    (line,) = skip_rule_warnings(
        FilterGroupsConfig(enable=True, skip=SkipConfig(rule="posterior", trend=TrendConfig(threshold=0.2)))
    )
    assert "skip.trend.threshold" in line and "rule=posterior" in line
    assert (
        skip_rule_warnings(FilterGroupsConfig(enable=True, strategy="verl", skip=SkipConfig(threshold=0.5)))
        == []
    )


def test_a_checkpoint_of_another_rule_resumes_under_trend_with_a_warning(caplog):
    probs = [0.0, 0.5, 1.0, 0.5] * 4
    old = DynamicBatcher(FilterGroupsConfig(enable=True, skip=SkipConfig(rule="posterior")), 2, 4, 8, 0)
    src = ListSource(prompt_rows(16), shuffle=False)
    gen = FakeRollout(8, bernoulli(lambda r: probs[r["index"]]), seed=2)
    old.next_batch(src, gen)
    state = json.loads(json.dumps({k: v for k, v in old.state_dict().items() if k != "pool"}))
    state["pool"] = old.state_dict()["pool"]
    new = DynamicBatcher(FilterGroupsConfig(enable=True), 2, 4, 8, 0)
    with caplog.at_level("WARNING"):
        new.load_state_dict(state)
    assert any("saved under another skip rule" in r.getMessage() for r in caplog.records)
    assert new.skip.trend is not None and not new.skip.trend.groups
