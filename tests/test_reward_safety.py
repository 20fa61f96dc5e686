"""Safe scoring: hung, crashing and self-killing scorers are counted and never stall a batch;
every built-in scorer survives adversarial text (hypothesis) within its time budget."""

from __future__ import annotations

import time

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dapo.reward.manager import DAPORewardManager
from dapo.reward.pool import DIED, ERROR, OK, TIMEOUT, ScorerRef, ScoringPool
from dapo.reward.scorers import countdown, default_compute_score, gsm8k, math_dapo, math_equiv
from fixtures.reward_helpers import CharTokenizer, make_batch, scorer_from_source

torch.set_num_threads(1)

NASTY = """
    import os, signal, time

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        if solution_str == "hang":
            while True:
                time.sleep(1)
        if solution_str == "exit":
            os._exit(7)
        if solution_str == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if solution_str == "raise":
            raise ValueError("scorer bug")
        if solution_str == "sysexit":
            raise SystemExit(1)
        return {"score": 1.0 if solution_str == ground_truth else 0.0, "acc": solution_str == ground_truth}
"""


@pytest.fixture()
def nasty_ref(tmp_path):
    return scorer_from_source(tmp_path, "nasty", NASTY)


def test_hung_and_dying_scorers_are_counted_and_the_batch_completes(nasty_ref):
    texts = ["ok", "hang", "ok", "exit", "kill", "raise", "nope", "sysexit", "ok", "ok"]
    batch = make_batch(texts, ["ok"] * len(texts), data_source="anything")
    mgr = DAPORewardManager(
        CharTokenizer(),
        nasty_ref,
        scoring={"mode": "process", "timeout_s": 1.0, "num_workers": 2, "failure_score": -3.0},
    )
    try:
        t0 = time.monotonic()
        out = mgr(batch)
        elapsed = time.monotonic() - t0
        scores, info = out
        assert elapsed < 15
        assert info["pred"] == [
            None,
            "[TIMEOUT]",
            None,
            "[ERROR]",
            "[ERROR]",
            "[ERROR]",
            None,
            "[ERROR]",
            None,
            None,
        ]
        assert info["score"] == [1.0, -3.0, 1.0, -3.0, -3.0, -3.0, 0.0, -3.0, 1.0, 1.0]
        assert info["acc"] == [True, False, True, False, False, False, False, False, True, True]
        assert out.metrics["reward/timeouts"] == 1
        assert out.metrics["reward/errors"] == 4  # exit, kill, raise, sysexit
        assert out.metrics["reward/worker_deaths"] == 2
        assert out.metrics["reward/worker_restarts"] >= 3  # the hung worker and the two dead ones
        assert scores.sum(-1).tolist() == info["score"]
        # the pool recovered: a second batch scores normally
        out2 = mgr(make_batch(["ok", "no"], ["ok", "ok"], data_source="anything"))
        assert out2.reward_extra_info["score"] == [1.0, 0.0] and out2.metrics["reward/errors"] == 0
    finally:
        mgr.close()


def test_pool_statuses_in_order(nasty_ref):
    with ScoringPool(num_workers=1, timeout_s=0.5) as pool:
        samples = [
            {"data_source": "x", "solution_str": s, "ground_truth": "a", "extra_info": {}}
            for s in ["a", "kill", "a", "hang", "raise", "a"]
        ]
        statuses = [s for s, _ in pool.map(nasty_ref, samples)]
    assert statuses == [OK, DIED, OK, TIMEOUT, ERROR, OK]


@pytest.mark.parametrize("body", ["import time\ntime.sleep(60)\n", "import os\nos._exit(3)\n"])
def test_scorer_that_cannot_load_raises_instead_of_spinning(tmp_path, body):
    path = tmp_path / "broken.py"
    path.write_text(body + "def compute_score(**kw):\n    return 0.0\n")
    with ScoringPool(num_workers=1, timeout_s=0.3, load_timeout_s=0.3) as pool:
        with pytest.raises(RuntimeError, match="reward worker processes keep dying"):
            pool.map(
                ScorerRef.from_file(str(path)), [{"data_source": "x", "solution_str": "", "ground_truth": ""}]
            )


def test_fast_path_is_cheap():
    batch = make_batch(["Answer: 12"] * 512, ["12"] * 512, data_source="arithmetic", response_len=12)
    mgr = DAPORewardManager(CharTokenizer())
    t0 = time.perf_counter()
    _, info = mgr(batch)
    assert time.perf_counter() - t0 < 2.0 and all(info["acc"])
    assert mgr._pool is None  # built-in safe scorer: no worker processes were started


# ---------------------------------------------------------------- adversarial fuzzing
_unicode = st.text(st.characters(blacklist_categories=("Cs",)), max_size=200)
_braces = st.text(alphabet="{}()[]\\boxed$^_ 0123456789", max_size=300)


@st.composite
def nasty_text(draw):
    kind = draw(st.integers(0, 7))
    n = draw(st.integers(1, 4000))
    if kind == 0:
        return draw(_unicode)
    if kind == 1:
        return "Answer: " + "9" * n
    if kind == 2:
        return "Answer: \\boxed{" * (n // 10 + 1) + "1" + "}" * draw(st.integers(0, 50))
    if kind == 3:
        return "(" * n + "1" + ")" * draw(st.integers(0, n))
    if kind == 4:
        return draw(_braces) + "\\boxed{" + draw(_braces)
    if kind == 5:
        return "x" * 1_000_000 + draw(
            st.sampled_from(["Answer: 3", "#### 3", "\\boxed{3}", "<answer>1+2</answer>"])
        )
    if kind == 6:
        return "\\boxed{" + "9^{" * 30 + "9" + "}" * 30 + "}" + draw(_unicode)
    return (
        "<answer>"
        + draw(st.sampled_from(["1e999999", "9" * 5000, "((" * 200, "1/0", "2**99999"]))
        + "</answer>"
    )


_gt = st.one_of(st.sampled_from(["3", "1000", "\\frac{1}{2}", "x+1", "(1,2)"]), _unicode)
FUZZ = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


def _timed(fn, *args, **kwargs):
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t0


@FUZZ
@given(text=nasty_text(), gt=_gt)
def test_fuzz_inline_scorers(text, gt):
    out, dt = _timed(math_dapo.compute_score, text, gt)
    assert out["score"] in (1.0, -1.0) and isinstance(out["pred"], str) and dt < 1.0
    out, dt = _timed(math_dapo.compute_score, text, gt, strict_box_verify=True)
    assert out["score"] in (1.0, -1.0) and dt < 1.0
    for method in ("strict", "flexible"):
        out, dt = _timed(gsm8k.compute_score, text, gt, method=method)
        assert out in (0, 0.0, 1.0) and dt < 1.0
    out, dt = _timed(countdown.compute_score, text, {"target": 3, "numbers": [1, 2]})
    assert out["score"] in (0.0, 0.1, 1.0) and dt < 1.0
    for source in ("arithmetic", "aime2024", "openai/gsm8k", "math_dapo"):
        _, dt = _timed(default_compute_score, source, text, gt)
        assert dt < 1.0


@pytest.fixture(scope="module")
def fuzz_pool():
    with ScoringPool(num_workers=1, timeout_s=3.0) as pool:
        yield pool


@FUZZ
@given(text=nasty_text(), gt=_gt)
def test_fuzz_symbolic_verifier_in_pool(fuzz_pool, text, gt):
    ref = ScorerRef(module="dapo.reward.scorers.math_equiv", attr="compute_score", preload=("sympy",))
    t0 = time.monotonic()
    [(status, value)] = fuzz_pool.map(ref, [{"solution_str": text, "ground_truth": gt}])
    assert time.monotonic() - t0 < fuzz_pool.timeout_s + 5.0
    assert status in (OK, TIMEOUT), value  # an "error" would be an exception escaping the scorer
    if status == OK:
        assert value["score"] in (0.0, 1.0) and isinstance(value["acc"], bool)


@settings(max_examples=40, deadline=None)
@given(
    numbers=st.lists(st.integers(-(10**30), 10**30), max_size=6),
    target=st.integers(-(10**30), 10**30),
    expr=st.text(alphabet="0123456789+-*/() .", max_size=120),
)
def test_fuzz_countdown_expressions(numbers, target, expr):
    out, dt = _timed(
        countdown.compute_score, f"<answer>{expr}</answer>", {"target": target, "numbers": numbers}
    )
    assert out["score"] in (0.0, 0.1, 1.0) and dt < 1.0


def test_math_equiv_bounded_in_process_on_known_bombs():
    bombs = {
        "\\boxed{9^{9^{9^{9}}}}": 0.0,  # refused, never evaluated
        "\\boxed{10^{100000}}": 0.0,
        "\\boxed{" + "(" * 150 + "1" + ")" * 150 + "}": 1.0,
    }
    for text, expected in bombs.items():
        out, dt = _timed(math_equiv.compute_score, text, "1")
        assert out["score"] == expected and dt < 2.0


@pytest.mark.parametrize(
    "answer",
    [
        "10^{999\\cdot999\\cdot999}",  # the exponent is an expression, not its first number
        "2^{2^{2^{2^{2}}}}",
        "(10^9)^(10^9)",
        "2^{10^{400}+10^{385}-10^{400}}",  # float rounding would call this 2^0; intervals do not
        "((10^{300}+1)^{1000}+1)^{1000}",  # every exponent small, the powers are not
        "2^{x\\cdot 10^{9}}",  # sympy pulls 10^9 out of a symbolic exponent
        "(10^{300}x)^{1000}",  # and distributes a power over a product
        "(10^{-300})^{-1000}",
        "1e99999999",  # a literal: sympy's Float alone takes minutes
        "2^{1/(1-1)}",  # an exponent without a finite bound
    ],
)
def test_exponent_guard_bounds_the_whole_exponent_expression(answer):
    """Refused before sympy evaluates anything: the answer is compared as a string and is unequal."""
    assert math_equiv._to_sympy(answer) is None
    assert math_equiv.compute_score("\\boxed{" + answer + "}", "1") == {
        "score": 0.0,
        "acc": False,
        "pred": math_equiv.normalize(answer),
    }


@pytest.mark.parametrize(
    ("answer", "gt"),
    [
        ("10^{1000}", "10^{1000}"),
        ("2^{10}", "1024"),
        ("2^{-3}", "0.125"),
        ("(3-2)^{5}", "1"),
        ("\\sqrt{2}^{2}", "2"),
        ("3.5\\times 10^{3}", "3500"),
        ("x^{n+1}", "x\\cdot x^{n}"),
        ("\\frac{1}{x^{2}}", "x^{-2}"),
        ("2^{x+1}", "2\\cdot 2^{x}"),
    ],
)
def test_exponent_guard_keeps_ordinary_powers(answer, gt):
    assert math_equiv._to_sympy(answer) is not None
    assert math_equiv.compute_score("\\boxed{" + answer + "}", gt)["score"] == 1.0
