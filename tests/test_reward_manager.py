"""DAPO / naive reward managers: placement, overlong shaping (verl 0.9.1 vectors, docs/verl_compat.md), extra info,
custom and multi-objective reward functions, config building and validation."""

from __future__ import annotations

import textwrap

import pytest
import torch

from dapo.config.schema import ScoringConfig
from dapo.reward.factory import build_reward_manager
from dapo.reward.manager import DAPORewardManager, NaiveRewardManager, RewardObjective
from dapo.reward.pool import ScorerRef
from dapo.reward.scorers import UnknownDataSourceError
from fixtures.config_helpers import config_problems, run_config
from fixtures.reward_helpers import CharTokenizer, make_batch

torch.set_num_threads(1)

OVERLONG = {"enable": True, "len": 2, "penalty_factor": 1.0, "log": True}


def test_overlong_appendix_a():
    # max_resp_len=5, buffer 2, factor 1.0, wrong answers (score -1)
    batch = make_batch(["abc", "abcd", "abcde"], ["9", "9", "9"], response_len=5)
    mgr = DAPORewardManager(CharTokenizer(), max_resp_len=5, overlong_buffer_cfg=OVERLONG)
    scores, info = mgr(batch)
    expected = torch.zeros(3, 5)
    expected[0, 2] = -1.0  # length 3 <= expected 3: no penalty
    expected[1, 3] = -1.5  # exceed 1: -0.5
    expected[2, 4] = -2.0  # exceed 2: -1.0, written at index 4
    assert torch.equal(scores, expected)
    assert info["overlong_reward"] == [0.0, -0.5, -1.0]
    assert info["overlong"] == [False, True, True]
    assert info["score"] == [-1.0, -1.0, -1.0]  # raw scorer score, not the shaped total
    assert info["acc"] == [False, False, False]


def test_overlong_correct_answer_and_no_log():
    batch = make_batch(["Answer: 7", "Answer: 7"], ["7", "8"], response_len=10)
    cfg = dict(OVERLONG, log=False, penalty_factor=0.5)
    scores, info = DAPORewardManager(CharTokenizer(), max_resp_len=10, overlong_buffer_cfg=cfg)(batch)
    # length 9, expected 8: exceed 1 -> -1/2*0.5 = -0.25
    assert scores[0, 8].item() == pytest.approx(0.75)
    assert scores[1, 8].item() == pytest.approx(-1.25)
    assert scores.sum().item() == pytest.approx(-0.5)
    assert set(info) == {"score", "acc", "pred"}
    assert info["pred"] == ["7", "7"] and info["acc"] == [True, False]


def test_eos_string_stripped_and_padding_ignored():
    # eos decoded as text (not special): the manager strips it; padding after it is masked out
    batch = make_batch(["Answer: 7"], ["7"], response_len=16, eos=True)
    mgr = DAPORewardManager(CharTokenizer(eos_is_special=False), max_resp_len=16)
    scores, info = mgr(batch)
    assert info["acc"] == [True]
    assert scores[0, 9].item() == 1.0  # 9 chars + eos -> last valid index 9


def test_response_mask_only_batch():
    batch = make_batch(["Answer: 7", "x"], ["7", "7"], response_len=12)
    del batch.tensors["attention_mask"]
    scores, _ = NaiveRewardManager(CharTokenizer())(batch)
    assert scores[0, 8].item() == 1.0 and scores[1, 0].item() == -1.0


def test_naive_has_no_overlong():
    batch = make_batch(["abcde"], ["9"], response_len=5)
    mgr = NaiveRewardManager(CharTokenizer(), max_resp_len=5, overlong_buffer_cfg=OVERLONG)
    scores, info = mgr(batch)
    assert scores[0, 4].item() == -1.0 and "overlong" not in info


@pytest.mark.parametrize(
    ("cfg", "max_len", "key"),
    [
        ({"enable": True, "len": 0, "penalty_factor": 1.0}, 5, "reward_model.overlong_buffer.len"),
        ({"enable": True, "len": 8, "penalty_factor": 1.0}, 5, "reward_model.reward_kwargs.max_resp_len"),
        ({"enable": True, "len": 2, "penalty_factor": 1.0}, None, "max_resp_len"),
    ],
)
def test_overlong_config_validation(cfg, max_len, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        DAPORewardManager(CharTokenizer(), max_resp_len=max_len, overlong_buffer_cfg=cfg)


def test_disabled_overlong_needs_nothing():
    cfg = {"enable": False, "len": 0}
    mgr = DAPORewardManager(CharTokenizer(), max_resp_len=None, overlong_buffer_cfg=cfg)
    scores, info = mgr(make_batch(["abcde"], ["9"], response_len=5))
    assert scores[0, 4].item() == -1.0 and "overlong" not in info  # the raw score, unshaped


def test_float_scorer_sets_acc_to_score():
    batch = make_batch(["#### 5", "#### 6"], ["5", "5"], data_source="openai/gsm8k")
    _, info = DAPORewardManager(CharTokenizer())(batch)
    assert info == {"score": [1.0, 0.0], "acc": [1.0, 0.0]}


def test_unknown_data_source_raises():
    batch = make_batch(["x"], ["1"], data_source="my/unknown")
    with pytest.raises(UnknownDataSourceError, match="my/unknown"):
        DAPORewardManager(CharTokenizer())(batch)
    mgr = DAPORewardManager(CharTokenizer(), scoring=ScoringConfig(mode="process", num_workers=1))
    try:
        with pytest.raises(UnknownDataSourceError, match="my/unknown"):
            mgr(batch)
    finally:
        mgr.close()


def test_missing_ground_truth_names_row():
    batch = make_batch(["x", "y"], ["1", "2"])
    batch.non_tensors["reward_model"][1] = {"style": "rule"}
    with pytest.raises(KeyError, match="row 1"):
        DAPORewardManager(CharTokenizer())(batch)


def test_metrics_present_on_fast_path():
    out = DAPORewardManager(CharTokenizer())(make_batch(["Answer: 1"], ["1"], data_source="arithmetic"))
    assert out.metrics["reward/timeouts"] == 0 and out.metrics["reward/errors"] == 0
    assert out.reward_extra_info["acc"] == [True]


def _write(tmp_path, body: str):
    path = tmp_path / "my_reward.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


CUSTOM = """
    import asyncio

    def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
        return {"score": float(solution_str.strip() == ground_truth) + bonus, "acc": solution_str.strip() == ground_truth,
                "idx": extra_info["index"]}

    async def async_score(data_source, solution_str, ground_truth, extra_info=None, **kw):
        await asyncio.sleep(0)
        return 2.0 if solution_str == ground_truth else 0.0

    def brevity(data_source, solution_str, ground_truth, extra_info=None):
        return -0.1 * len(solution_str)
"""


@pytest.mark.parametrize("mode", ["auto", "inline"])
def test_custom_reward_function_from_config(tmp_path, mode):
    path = _write(tmp_path, CUSTOM)
    cfg = run_config(
        "data.max_response_length=8",
        "reward_model.reward_manager=dapo",
        f"reward_model.scoring.mode={mode}",
        "reward_model.scoring.num_workers=1",
        f"custom_reward_function.path={path}",
        "custom_reward_function.name=compute_score",
        "+custom_reward_function.reward_kwargs.bonus=0.5",
        "reward_model.overlong_buffer.enable=false",
    )
    with build_reward_manager(cfg, CharTokenizer()) as mgr:
        scores, info = mgr(make_batch(["42", "41"], ["42", "42"], data_source="anything"))
    assert info["score"] == [1.5, 0.5] and info["acc"] == [True, False] and info["idx"] == [0, 1]
    assert scores[0, 1].item() == 1.5


def test_scorer_ref_name_alias_pickles(tmp_path):
    import pickle

    ref = ScorerRef(path=_write(tmp_path, CUSTOM), name="brevity")
    assert ref.attr == "brevity" and pickle.loads(pickle.dumps(ref)) == ref
    _, info = DAPORewardManager(CharTokenizer(), ref)(make_batch(["ab"], ["x"]))
    assert info["score"] == [pytest.approx(-0.2)]


def test_async_custom_function(tmp_path):
    ref = ScorerRef.from_file(_write(tmp_path, CUSTOM), "async_score")
    for mode in ("process", "inline"):
        with DAPORewardManager(CharTokenizer(), ref, scoring={"mode": mode, "num_workers": 1}) as mgr:
            _, info = mgr(make_batch(["a", "b"], ["a", "a"]))
        assert info["score"] == [2.0, 0.0]


def test_missing_custom_file_or_function_named(tmp_path):
    (p,) = config_problems(f"custom_reward_function.path={tmp_path / 'nope.py'}")
    assert p.startswith(f"custom_reward_function.path={tmp_path / 'nope.py'}: no such file")
    cfg = run_config(
        f"custom_reward_function.path={_write(tmp_path, CUSTOM)}", "custom_reward_function.name=nope"
    )
    with pytest.raises(AttributeError, match="custom_reward_function.name"):
        build_reward_manager(cfg, CharTokenizer())


def test_multi_objective(tmp_path):
    path = _write(tmp_path, CUSTOM)
    cfg = run_config(
        "reward_model.reward_manager=naive",
        "reward_model.scoring.num_workers=1",
        # the built-in router, and a function in a file
        "reward_model.objectives=[{name: correct, weight: 1.0},"
        f"{{name: brevity, weight: 0.5, path: '{path}', function: brevity}}]",
    )
    with build_reward_manager(cfg, CharTokenizer()) as mgr:
        out = mgr(make_batch(["Answer: 7", "Answer: 8"], ["7", "7"], data_source="arithmetic"))
    scores, info = out
    assert info["correct"] == [1.0, -1.0]
    assert info["brevity"] == pytest.approx([-0.9, -0.9])
    assert info["score"] == pytest.approx([1.0 - 0.45, -1.0 - 0.45])
    assert info["acc"] == [True, False] and info["pred"] == ["7", "8"]
    assert info["correct/acc"] == [True, False]
    assert scores.sum(-1).tolist() == pytest.approx(info["score"])
    assert out.metrics["reward/correct/mean"] == 0.0
    assert out.metrics["reward/brevity/mean"] == pytest.approx(-0.9)


def test_multi_objective_bad_names():
    with pytest.raises(ValueError, match="objectives"):
        DAPORewardManager(CharTokenizer(), objectives=[RewardObjective("acc"), RewardObjective("b")])
    with pytest.raises(ValueError, match="objectives"):
        DAPORewardManager(CharTokenizer(), objectives=[RewardObjective("a"), RewardObjective("a")])
    # the same rule refuses the config before any work
    (p,) = config_problems("reward_model.objectives=[{name: acc}, {name: b}]")
    assert p.startswith("reward_model.objectives: names must be unique") and "'acc'" in p


def test_overlong_alias_is_read_into_the_one_key_and_a_conflict_is_refused():
    cfg = run_config(
        "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=true",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.len=2",
        "+reward_model.reward_kwargs.max_resp_len=5",
        "reward_model.reward_manager=dapo",
    )
    assert "overlong_buffer_cfg" not in cfg.reward_model.reward_kwargs  # merged, then gone
    mgr = build_reward_manager(cfg, CharTokenizer())
    assert mgr.overlong_buffer_cfg.enable and mgr.overlong_buffer_cfg.len == 2 and mgr.max_resp_len == 5
    assert mgr.overlong_buffer_cfg.penalty_factor == 1.0  # the key the alias leaves out keeps the preset's
    (p,) = config_problems(
        "+reward_model.reward_kwargs.overlong_buffer_cfg.len=2", "reward_model.overlong_buffer.len=3"
    )
    assert p.startswith(
        "reward_model.reward_kwargs.overlong_buffer_cfg.len=2 and reward_model.overlong_buffer.len=3"
    )


def test_bad_scoring_mode_and_manager_name():
    (p,) = config_problems("reward_model.scoring.mode=yolo")
    assert p.startswith("reward_model.scoring.mode: must be auto, process or inline")
    (p,) = config_problems("reward_model.reward_manager=prime")
    assert p.startswith("reward_model.reward_manager: unknown manager 'prime'; known: dapo, naive")


def test_lambda_scorer_runs_inline_in_auto_and_is_refused_in_process_mode():
    batch = make_batch(["a"], ["a"])
    _, info = DAPORewardManager(CharTokenizer(), lambda **kw: 3.0)(batch)
    assert info["score"] == [3.0]
    with pytest.raises(ValueError, match="reward_model.scoring.mode=process"):
        DAPORewardManager(CharTokenizer(), lambda **kw: 3.0, scoring={"mode": "process"})


def test_int_ground_truth_through_the_config_key():
    """verl's default: an int ground truth fails math_dapo's default path (counted, scored as a
    failure); custom_reward_function.reward_kwargs.ground_truth_as_str=true compares it as a string."""
    batch = make_batch(["Answer: 5", "Answer: 6"], [5, 5], data_source="math_dapo")
    with build_reward_manager(run_config("reward_model.reward_manager=naive"), CharTokenizer()) as mgr:
        out = mgr(batch)
        assert out.reward_extra_info["score"] == [-1.0, -1.0]
        assert out.reward_extra_info["pred"] == ["[ERROR]", "[ERROR]"]
        assert out.metrics["reward/errors"] == 2
    cfg = run_config(
        "reward_model.reward_manager=naive", "+custom_reward_function.reward_kwargs.ground_truth_as_str=true"
    )
    with build_reward_manager(cfg, CharTokenizer()) as mgr:
        out = mgr(batch)
        assert out.reward_extra_info["score"] == [1.0, -1.0]
        assert out.reward_extra_info["pred"] == ["5", "6"]
        assert out.metrics["reward/errors"] == 0
