"""Scorers against verl 0.9.1 vectors (docs/verl_compat.md, Test vectors) and their own rules."""

from __future__ import annotations

import pytest

from dapo.reward.scorers import (
    UnknownDataSourceError,
    countdown,
    default_compute_score,
    gsm8k,
    is_inline_safe,
    math_dapo,
    math_equiv,
    scorer_for,
)


@pytest.mark.parametrize(
    ("solution", "gt", "score", "pred"),
    [
        ("Answer: 1,000", "1000", 1.0, "1000"),
        ("Answer: \\boxed{\\frac12}", "\\frac{1}{2}", 1.0, "\\frac{1}{2}"),
        ("x=3\nAnswer: $x = 3$", "3", 1.0, "3"),
        ("Answer: 5 degrees", "5", 1.0, "5"),
        ("ANSWER :  7", "7", 1.0, "7"),
        ("Answer: 12.0", "12", -1.0, "12.0"),
        ("no marker 42", "42", -1.0, "[INVALID]"),
        ("\\boxed{42}", "42", 1.0, "42"),  # 0.9.1 boxed fallback
    ],
)
def test_math_dapo_appendix_a(solution, gt, score, pred):
    out = math_dapo.compute_score(solution, gt)
    assert out == {"score": score, "acc": score > 0, "pred": pred}


def test_math_dapo_last_marker_and_tail_only():
    assert math_dapo.compute_score("Answer: 3\nwait\nAnswer: 4", "4")["acc"]
    assert not math_dapo.compute_score("Answer: 3\nwait\nAnswer: 4", "3")["acc"]
    # the marker is more than 300 characters from the end: invisible
    assert math_dapo.compute_score("Answer: 4\n" + "x" * 300, "4")["pred"] == "[INVALID]"


def test_math_dapo_strict_box_mode():
    assert math_dapo.compute_score("so \\boxed{42}", "42", strict_box_verify=True)["score"] == 1.0
    # strict mode compares to the raw gt, no normalisation
    assert math_dapo.compute_score("so \\boxed{ 42}", "42", strict_box_verify=True)["score"] == -1.0
    # boxed fallback: a wrong boxed answer is still wrong; an unclosed box is invalid
    assert math_dapo.compute_score("\\boxed{41}", "42") == {"score": -1.0, "acc": False, "pred": "41"}
    assert math_dapo.compute_score("\\boxed{42", "42")["pred"] == "[INVALID]"


# verl 0.9.1's quirks, kept by default, and the keys that fix two of them. Each vector is
# worked out by hand from verl's math_dapo source.
def test_math_dapo_strict_box_without_a_box_gives_pred_none():
    for text in ("the answer is 42", "so \\boxed{42"):
        assert math_dapo.compute_score(text, "42", strict_box_verify=True) == {
            "score": -1.0,
            "acc": False,
            "pred": None,
        }


def test_math_dapo_int_ground_truth_verl_default():
    # strict: "5" == 5 is False in verl, so a right box scores -1 with pred "5"
    assert math_dapo.compute_score("so \\boxed{5}", 5, strict_box_verify=True) == {
        "score": -1.0,
        "acc": False,
        "pred": "5",
    }
    # default path: verl calls 5.split and fails; here a TypeError that names the fix
    with pytest.raises(TypeError, match="ground_truth_as_str"):
        math_dapo.compute_score("Answer: 5", 5)
    with pytest.raises(TypeError, match="ground_truth_as_str"):
        default_compute_score("math_dapo", "\\boxed{5}", 5)


def test_math_dapo_int_ground_truth_as_str():
    on = {"ground_truth_as_str": True}
    assert math_dapo.compute_score("so \\boxed{5}", 5, strict_box_verify=True, **on)["score"] == 1.0
    assert math_dapo.compute_score("Answer: 5", 5, **on) == {"score": 1.0, "acc": True, "pred": "5"}
    assert math_dapo.compute_score("\\boxed{5}", 5, **on) == {"score": 1.0, "acc": True, "pred": "5"}
    assert math_dapo.compute_score("Answer: 6", 5, **on)["score"] == -1.0
    # the key reaches the scorer through default_compute_score (reward_kwargs)
    assert default_compute_score("math_dapo", "Answer: 5", 5, **on)["score"] == 1.0
    # a string ground truth is unaffected
    assert math_dapo.compute_score("Answer: 5", "5", **on) == math_dapo.compute_score("Answer: 5", "5")


def test_math_dapo_pause_index_below_100():
    text = "\\boxed{7} " + "y" * 60  # 70 characters, the box in the first 9
    pause = [0, 0, 0, 40]  # verl: text[40 - 100:] = text[-60:] = the 60 y's, no box
    assert math_dapo.compute_score(text, "7", strict_box_verify=True, pause_tokens_index=pause) == {
        "score": -1.0,
        "acc": False,
        "pred": None,
    }
    # the default path has no "Answer:" and its boxed fallback searches the same window
    assert math_dapo.compute_score(text, "7", pause_tokens_index=pause) == {
        "score": -1.0,
        "acc": False,
        "pred": "[INVALID]",
    }
    clamp = {"clamp_pause_window": True}  # text[0:]: the box is found
    assert math_dapo.compute_score(text, "7", strict_box_verify=True, pause_tokens_index=pause, **clamp) == {
        "score": 1.0,
        "acc": True,
        "pred": "7",
    }
    assert math_dapo.compute_score(text, "7", pause_tokens_index=pause, **clamp)["pred"] == "7"
    assert math_dapo.pause_window_start(40) == -60 and math_dapo.pause_window_start(40, clamp=True) == 0


def test_math_dapo_pause_index_from_100_is_the_same_in_both_modes():
    text = "a" * 120 + "\\boxed{7}" + "b" * 10  # the box at 120..128
    for idx, expected in ((150, 1.0), (100, 1.0), (230, -1.0)):  # 230: text[130:] holds no box
        for clamp in (False, True):
            out = math_dapo.compute_score(
                text, "7", strict_box_verify=True, pause_tokens_index=[0, 0, 0, idx], clamp_pause_window=clamp
            )
            assert out["score"] == expected
    with pytest.raises(ValueError, match="4 indices"):
        math_dapo.compute_score(text, "7", strict_box_verify=True, pause_tokens_index=[150])


@pytest.mark.parametrize(
    ("solution", "method", "expected"),
    [
        ("#### 1,000", "strict", 1.0),
        ("#### 1000.", "strict", 0.0),
        ("answer 1000", "strict", 0),
        ("#### $1000", "strict", 0),
        ("answer 1000", "flexible", 1.0),
        ("1000 or maybe 999", "flexible", 0.0),
    ],
)
def test_gsm8k_appendix_a(solution, method, expected):
    out = gsm8k.compute_score(solution, "1000", method=method)
    assert out == expected and type(out) is type(expected)


def test_gsm8k_int_ground_truth():
    # verl compares the extracted string with the ground truth as given: "72" != 72
    assert gsm8k.compute_score("#### 72", 72) == 0.0
    assert gsm8k.compute_score("#### 72", 72, ground_truth_as_str=True) == 1.0
    assert default_compute_score("openai/gsm8k", "#### 72", 72, ground_truth_as_str=True) == 1.0
    assert gsm8k.compute_score("#### 71", 72, ground_truth_as_str=True) == 0.0


def test_gsm8k_bad_method():
    with pytest.raises(ValueError, match="flexible"):
        gsm8k.compute_score("#### 1", "1", method="loose")


@pytest.mark.parametrize(
    ("solution", "gt", "ok"),
    [
        ("\\boxed{\\dfrac{1}{2}}", "0.5", True),
        ("\\boxed{\\sqrt{8}}", "2\\sqrt{2}", True),
        ("\\boxed{(1, 2)}", "(1,2)", True),
        ("\\boxed{[1, 2]}", "(1,2)", False),
        ("\\boxed{x^2+2x+1}", "(x+1)^2", True),
        ("\\boxed{\\sqrt[3]{8}}", "2", True),
        ("\\boxed{\\pi/2}", "\\frac{\\pi}{2}", True),
        ("\\boxed{10\\%}", "10", True),
        ("The answer is \\boxed{3}.", "\\boxed{3}", True),
        ("\\boxed{3}", "4", False),
        ("\\boxed{9^{9^{9}}}", "1", False),  # refused, not evaluated
        ("Answer: 7", "7", True),
        ("nothing", "7", False),
    ],
)
def test_math_equiv(solution, gt, ok):
    out = math_equiv.compute_score(solution, gt)
    assert out["acc"] is ok and out["score"] == (1.0 if ok else 0.0)


def test_math_equiv_rejects_code():
    assert math_equiv.latex_to_sympy_text("__import__('os').system('x')") is None
    assert math_equiv.latex_to_sympy_text("x.evalf") is None


@pytest.mark.parametrize(
    ("solution", "score", "acc"),
    [
        ("<answer>(25-5)*3</answer>", 1.0, True),
        ("<answer>25*3-5*3</answer>", 0.1, False),  # 3 used twice
        ("<answer>25+5+3</answer>", 0.1, False),  # wrong value
        ("<answer>(25-5)*3 = 60</answer>", 1.0, True),
        ("<answer>2**5</answer>", 0.1, False),
        ("<answer>__import__('os')</answer>", 0.1, False),
        ("<answer>3/(5-5)*25</answer>", 0.1, False),
        ("no tags", 0.0, False),
    ],
)
def test_countdown(solution, score, acc):
    out = countdown.compute_score(solution, {"target": 60, "numbers": [25, 5, 3]})
    assert out["score"] == score and out["acc"] is acc


def test_countdown_json_ground_truth():
    assert countdown.compute_score("<answer>6/3</answer>", '{"target": 2, "numbers": [3, 6]}')["acc"]


def test_routing():
    assert scorer_for("openai/gsm8k") is gsm8k.compute_score
    assert scorer_for("math_dapo") is math_dapo.compute_score
    assert scorer_for("aime_2024") is math_dapo.compute_score
    assert scorer_for("arithmetic") is math_dapo.compute_score
    assert scorer_for("lighteval/MATH") is math_equiv.compute_score
    assert scorer_for("numina_olympiads") is math_equiv.compute_score
    assert scorer_for("countdown") is countdown.compute_score
    assert is_inline_safe("aime2024") and is_inline_safe("arithmetic")
    assert not is_inline_safe("lighteval/MATH")


def test_default_compute_score_conversion_and_kwargs():
    assert default_compute_score("openai/gsm8k", "#### 5", "5") == 1.0
    assert isinstance(default_compute_score("openai/gsm8k", "none", "5"), float)
    assert default_compute_score("openai/gsm8k", "it is 5", "5", method="flexible") == 1.0
    # kwargs a scorer does not take are ignored (verl passes sandbox urls and the like)
    out = default_compute_score("arithmetic", "Answer: 5", "5", extra_info={}, sandbox_fusion_url=None)
    assert out == {"score": 1.0, "acc": True, "pred": "5"}


def test_unknown_source_names_source_and_known_ones():
    with pytest.raises(UnknownDataSourceError) as err:
        default_compute_score("codecontests", "x", "y")
    msg = str(err.value)
    assert "'codecontests'" in msg and "openai/gsm8k" in msg and "custom_reward_function.path" in msg
    assert isinstance(err.value, NotImplementedError)
