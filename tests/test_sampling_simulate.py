"""The simulator: a population that moves with training, figures counted against the truth, and
a skipper that forgets its data caught failing."""

from __future__ import annotations

import argparse
import json
import math

import numpy as np
import pytest
import torch

from dapo.config.load import ConfigError
from dapo.config.sampling import FilterGroupsConfig
from dapo.sampling.simulate import (
    FIRST_RULE,
    Population,
    default_strategies,
    format_table,
    register,
    run_all,
    simulate,
)
from dapo.sampling.skip import SkipPolicy

torch.set_num_threads(1)

# the skip rule's defaults before faded evidence meant "roll it out": decay toward Jeffreys'
# prior, whose P(no spread in 8) of 0.39 is above the threshold
OLD_RULE = FIRST_RULE


def test_population_moves_with_training_and_drift():
    pop = Population(np.array([0.0, -2.0]), np.array([0.01, 0.0]), np.array([0.5, 0.25]))
    pop.train(np.array([0, 0, 1]))
    assert pop.trained.tolist() == [2, 1]
    assert pop.logit(10).tolist() == pytest.approx([0.1 + 1.0, -2.0 + 0.25])
    assert pop.prob(0, 10) == pytest.approx(1 / (1 + math.exp(-1.1)))
    p = 1 / (1 + math.exp(1.75))
    assert pop.spread_prob(4, 10)[1] == pytest.approx(1 - p**4 - (1 - p) ** 4)
    fresh = pop.fresh()  # each strategy starts untrained; the copy is its own
    assert fresh.trained.tolist() == [0, 0] and pop.trained.tolist() == [2, 1]
    assert fresh.logits is pop.logits


def test_a_saturating_training_effect_shrinks_per_trained_group():
    # gain 0.6, saturation 2: T = 1, 2, 6 trained groups move the logit by 0.6 * T * 2 / (2 + T)
    pop = Population(np.zeros(1), np.zeros(1), np.array([0.6]), saturation=2.0)
    moved = []
    for t in (1, 1, 4):
        pop.train(np.zeros(t, dtype=np.int64))
        moved.append(float(pop.logit(0)[0]))
    assert moved == pytest.approx([0.6 * 2 / 3, 0.6 * 4 / 4, 0.6 * 12 / 8])
    assert pop.fresh().saturation == 2.0 and pop.prob(0, 0) == pytest.approx(1 / (1 + math.exp(-0.9)))


def test_learnable_coverage_is_counted_against_the_truth():
    # prompts 0 and 3 always have spread (p = 0.5), 1 and 2 never (p ~ 0 and ~ 1), nothing moves.
    # One group is trained per step and one step follows the warm-up: 2 learnable prompts, one of
    # them trained after the warm-up
    pop = Population(np.array([0.0, -30.0, 30.0, 0.0]), np.zeros(4), np.zeros(4))
    cfg = default_strategies()["verl"]
    f = simulate(cfg, pop, steps=4, train_batch_size=1, gen_batch_size=4, n=4, warmup_steps=3)
    assert f["learnable_prompts"] == 2
    assert f["learnable_coverage"] == 0.5 and f["trained_prompts"] == 1
    assert f["coverage"]["rolled_out_prompts"] == 4 and f["coverage"]["never_rolled_out"] == 0
    assert f["coverage"]["trained_prompts"] in (1, 2)
    assert pop.trained.tolist() == [0, 0, 0, 0]  # the population handed in is not trained


def test_a_skipper_that_forgets_fails_on_the_simulator():
    # the old skip rule: a prompt not rolled out for ~20 updates is predicted hopeless by the prior
    # alone, so once its first learnable prompts are solved it skips whole passes over the pool
    # and fills its rounds with the few it still rates likely to spread (0.72 of the learnable
    # prompts trained here, where the default rule trains over 0.85 and verl mode all); before
    # rounds were filled from a skipped pass, it stalled instead
    s = default_strategies(OLD_RULE)
    r = run_all(steps=120, num_prompts=1024, strategies={"verl": s["verl"], "default": s["default"]})
    verl, old = r["strategies"]["verl"], r["strategies"]["default"]
    assert verl["stalled_at_step"] is None and verl["learnable_coverage"] >= 0.95
    assert old["stalled_at_step"] is not None or old["learnable_coverage"] < 0.8
    assert old["coverage"]["skipped_with_spread"] > 100  # skips against the prompt's own evidence
    if old["stalled_at_step"] is not None:
        assert f"default at step {old['stalled_at_step']}" in format_table(r)


def test_the_skipper_keeps_covering_what_can_be_learned():
    # the default rule on the run the old one fails: never stalled, at most half of verl mode's
    # generated groups, at least 3x its qualified ratio, and it trains at least 0.85 of the
    # prompts that were learnable after the warm-up (verl mode: ~1.0). On this small pool (256
    # learnable prompts, ~10 trained groups each) prompts are solved fast, so the qualified ratio
    # stays below the 4096-prompt run's (docs/sampling.md)
    s = default_strategies()
    r = run_all(steps=120, num_prompts=1024, strategies={"verl": s["verl"], "default": s["default"]})
    verl, ours = r["strategies"]["verl"], r["strategies"]["default"]
    assert ours["stalled_at_step"] is None and ours["steps"] == 120
    assert ours["generated_groups_per_trained_group"] <= 0.5 * verl["generated_groups_per_trained_group"]
    assert ours["qualified_ratio"] >= 3 * verl["qualified_ratio"]
    assert ours["learnable_coverage"] >= max(0.85, 0.85 * verl["learnable_coverage"])
    assert ours["trained_reward_variance"] >= verl["trained_reward_variance"] > 0
    assert ours["coverage"]["never_rolled_out"] == 0 and ours["staleness_max"] <= 1


class _SkipByIndex(SkipPolicy):
    """Skips the given prompts once they have a history, whatever their groups said."""

    def __init__(self, batcher, skipped: set[int]):
        super().__init__(batcher.cfg, batcher.train_batch_size, batcher.n, batcher.rng, batcher.seed)
        self.skipped = skipped

    def _should_skip(self, idx, prob, max_updates, explore, version):
        return idx in self.skipped and self.history.get(idx) is not None


def test_a_replacement_skip_policy_decides_and_sees_the_runs_population():
    # prompts 0 and 3 always have spread, 1 and 2 never; a policy that skips 1 and 2 after their
    # first group rolls out only 0 and 3 after the first pass (every group kept), one that skips
    # nothing rolls all four out (half kept)
    pop = Population(np.array([0.0, -30.0, 30.0, 0.0]), np.zeros(4), np.zeros(4))
    seen = []

    def make(skipped):
        def factory(batcher, population):
            seen.append(population)
            return _SkipByIndex(batcher, skipped)

        return factory

    cfg = default_strategies({"rule": "posterior"})["default"]  # no confirmation rollouts
    kw = dict(steps=6, train_batch_size=2, gen_batch_size=4, n=4, warmup_steps=2)
    picky = simulate(cfg, pop, skip_policy=make({1, 2}), **kw)
    none = simulate(cfg, pop, skip_policy=make(set()), **kw)
    assert picky["qualified_ratio"] == 1.0 and picky["skipped_prompts"] > 0
    assert none["qualified_ratio"] == 0.5 and none["skipped_prompts"] == 0
    # the factory gets the copy the run trains, not the population handed in
    assert seen[0] is not pop and seen[0].trained.sum() == picky["trained_groups"]
    assert pop.trained.sum() == 0


def test_a_stalled_strategy_is_stopped_and_said_so():
    # every prompt solved from the start and skipping kept on: a pass limit of 2 stops it
    pop = Population(np.full(40, 30.0), np.zeros(40), np.zeros(40))
    f = simulate(
        FilterGroupsConfig(enable=True), pop, steps=5, train_batch_size=2, gen_batch_size=4, max_passes=2
    )
    assert f["stalled_at_step"] is not None and f["steps"] == f["stalled_at_step"] - 1


def test_register_adds_bench_sampling_json(capsys):
    parser = argparse.ArgumentParser(prog="dapo bench")
    register(parser.add_subparsers(dest="bench"))
    args = parser.parse_args(["sampling", "--json", "--steps", "4", "--num-prompts", "64"])
    assert args.func(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"verl", "default", "stream"} <= set(out["strategies"])
    assert out["config"]["gain"] == [0.05, 0.2] and out["config"]["max_drift"] == 0.005
    for figures in out["strategies"].values():
        for key in ("generated_groups_per_trained_group", "qualified_ratio", "trained_prompts"):
            assert key in figures
        assert 0.0 <= figures["learnable_coverage"] <= 1.0
        assert figures["coverage"]["rolled_out_prompts"] + figures["coverage"]["never_rolled_out"] == 64


def test_bench_sampling_skip_overrides(capsys):
    parser = argparse.ArgumentParser(prog="dapo bench")
    register(parser.add_subparsers(dest="bench"))
    small = ["sampling", "--json", "--steps", "4", "--num-prompts", "64"]
    args = parser.parse_args(
        [*small, "--skip", "threshold=0.1", "--skip", "prior=[1, 1]", "--skip", "rule=streak"]
    )
    assert args.func(args) == 0
    skip = json.loads(capsys.readouterr().out)["config"]["skip"]
    assert (skip["threshold"], skip["prior"], skip["rule"]) == (0.1, [1, 1], "streak")
    with pytest.raises(SystemExit):
        parser.parse_args([*small, "--skip", "thresh=0.1"])
    assert "skip.{enable,rule," in capsys.readouterr().err
    args = parser.parse_args([*small, "--skip", "threshold=2"])
    with pytest.raises(ConfigError, match=r"skip\.threshold: must be in \(0, 1\], got 2"):
        args.func(args)
