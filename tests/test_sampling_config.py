"""algorithm.filter_groups.* defaults, validation messages and shaped-metric warnings."""

from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf

from dapo.config.sampling import FilterGroupsConfig, SkipConfig, metric_warnings, validate
from dapo.sampling import DynamicBatcher


def test_defaults_are_valid_and_verl_keys_keep_verl_defaults():
    cfg = FilterGroupsConfig()
    assert validate(cfg) == []
    assert cfg.enable is False and cfg.max_num_gen_batches == 0
    assert cfg.metric == "acc" and cfg.strategy == "default"


def test_structured_config_round_trip_with_overrides():
    base = OmegaConf.structured(FilterGroupsConfig)
    merged = OmegaConf.merge(
        base, OmegaConf.from_dotlist(["skip.target=0.2", "band=[0.2,0.8]", "enable=true"])
    )
    cfg = OmegaConf.to_object(merged)
    assert isinstance(cfg, FilterGroupsConfig) and cfg.skip.target == 0.2 and cfg.band == [0.2, 0.8]
    assert validate(cfg) == []


@pytest.mark.parametrize(
    "change, key",
    [
        ({"strategy": "fast"}, "algorithm.filter_groups.strategy"),
        ({"on_exhausted": "crash"}, "algorithm.filter_groups.on_exhausted"),
        ({"max_staleness": -1}, "algorithm.filter_groups.max_staleness"),
        ({"max_num_gen_batches": 1.5}, "algorithm.filter_groups.max_num_gen_batches"),
        ({"enable": True, "metric": None}, "algorithm.filter_groups.metric"),
        ({"filter_rule": "std"}, "algorithm.filter_groups.filter_rule"),
        ({"band": [0.9, 0.1]}, "algorithm.filter_groups.band"),
        ({"band": [0.1]}, "algorithm.filter_groups.band"),
        ({"kept_rate_ema": 0}, "algorithm.filter_groups.kept_rate_ema"),
        ({"min_round_size": 0}, "algorithm.filter_groups.min_round_size"),
        ({"skip": SkipConfig(max_prob=1.0)}, "algorithm.filter_groups.skip.max_prob"),
        ({"skip": SkipConfig(target=1.0)}, "algorithm.filter_groups.skip.target"),
        ({"skip": SkipConfig(init_prob=0.999)}, "algorithm.filter_groups.skip.init_prob"),
        ({"skip": SkipConfig(revisit_epochs=-1)}, "algorithm.filter_groups.skip.revisit_epochs"),
        ({"skip": SkipConfig(max_explore=1.5)}, "algorithm.filter_groups.skip.max_explore"),
        ({"skip": SkipConfig(min_streak=0)}, "algorithm.filter_groups.skip.min_streak"),
        ({"skip": SkipConfig(min_evidence=-0.5)}, "algorithm.filter_groups.skip.min_evidence"),
        (
            {"skip": SkipConfig(min_evidence=3.0, max_evidence=2.0)},
            "algorithm.filter_groups.skip.min_evidence",
        ),
        ({"skip": SkipConfig(max_evidence=0)}, "algorithm.filter_groups.skip.max_evidence"),
        ({"skip": SkipConfig(rule="ucb")}, "algorithm.filter_groups.skip.rule"),
    ],
)
def test_each_problem_names_the_full_key(change, key):
    cfg = dataclasses.replace(FilterGroupsConfig(), **change)
    problems = validate(cfg)
    assert problems and all(p.startswith("algorithm.filter_groups.") for p in problems)
    assert any(p.startswith(key + ":") for p in problems), problems


def test_adaptive_threshold_needs_band_rule():
    cfg = FilterGroupsConfig()
    cfg.adaptive_threshold.enable = True
    assert any("adaptive_threshold.enable" in p and "filter_rule=band" in p for p in validate(cfg))
    cfg.filter_rule = "band"
    assert validate(cfg) == []


def test_batcher_refuses_invalid_config_and_sizes():
    with pytest.raises(ValueError, match="algorithm.filter_groups.strategy"):
        DynamicBatcher(FilterGroupsConfig(strategy="x"), 2, 2, 2, 0)
    with pytest.raises(ValueError, match="data.train_batch_size"):
        DynamicBatcher(FilterGroupsConfig(), 0, 2, 2, 0)


def test_shaped_metric_warnings():
    assert metric_warnings(FilterGroupsConfig(enable=True, metric="acc"), overlong_buffer_enable=True) == []
    w = metric_warnings(FilterGroupsConfig(enable=True, metric="seq_reward"), overlong_buffer_enable=True)
    assert len(w) == 1 and "shaped" in w[0] and "metric=acc" in w[0]
    w = metric_warnings(FilterGroupsConfig(enable=True, metric="seq_final_reward"), use_kl_in_reward=True)
    assert "KL" in w[0]
    assert metric_warnings(FilterGroupsConfig(enable=True, metric="score"))
    assert metric_warnings(FilterGroupsConfig(enable=False, metric="seq_reward")) == []
