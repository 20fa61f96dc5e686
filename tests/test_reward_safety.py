"""Safe scoring: hung, crashing and self-killing scorers are counted and never stall a batch;
every built-in scorer survives adversarial text (hypothesis), the in-process ones by reading a
bounded tail of it, the symbolic one under the pool's timeout. Outcomes and mechanisms only, never
wall time: the hang guards below fire only far beyond any slowness of a loaded machine."""

from __future__ import annotations

import os
import signal
from contextlib import contextmanager

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dapo.reward.manager import DAPORewardManager
from dapo.reward.pool import DIED, ERROR, OK, TIMEOUT, ScorerRef, ScoringPool
from dapo.reward.scorers import (
    countdown,
    default_compute_score,
    gsm8k,
    is_inline_safe,
    math_dapo,
    math_equiv,
)
from fixtures.reward_helpers import CharTokenizer, make_batch, scorer_from_source

torch.set_num_threads(1)

# "hang" leaves its process id in hung.pid beside the scorer file, so a test can check that the
# process was stopped
NASTY = """
    import os, signal, time

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        if solution_str == "hang":
            with open(os.path.join(os.path.dirname(__file__), "hung.pid"), "w") as f:
                f.write(str(os.getpid()))
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


@contextmanager
def hang_guard(seconds: float, what: str):
    """Fail, rather than hang, when the block is still running after ``seconds``: a bound on
    code that must end by itself, set far beyond any slowness (SIGALRM; main thread only)."""

    def fire(signum, frame):
        pytest.fail(f"{what} still running after {seconds:g} s: it hangs", pytrace=False)

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_hung_and_dying_scorers_are_counted_and_the_batch_completes(nasty_ref, tmp_path):
    texts = ["ok", "hang", "ok", "exit", "kill", "raise", "nope", "sysexit", "ok", "ok"]
    batch = make_batch(texts, ["ok"] * len(texts), data_source="anything")
    mgr = DAPORewardManager(
        CharTokenizer(),
        nasty_ref,
        scoring={"mode": "process", "timeout_s": 1.0, "num_workers": 2, "failure_score": -3.0},
    )
    try:
        with hang_guard(300, "a batch with one hung scorer (timeout_s=1)"):
            out = mgr(batch)
        scores, info = out
        # the hung scorer was stopped: its worker process was killed and is gone
        hung_pid = int((tmp_path / "hung.pid").read_text())
        assert _process_gone(hung_pid), f"the hung scorer's process {hung_pid} is still alive"
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


def test_fast_path_scores_in_the_trainer_process():
    batch = make_batch(["Answer: 12"] * 512, ["12"] * 512, data_source="arithmetic", response_len=12)
    mgr = DAPORewardManager(CharTokenizer())
    out = mgr(batch)
    assert out.reward_extra_info["score"] == [1.0] * 512 and all(out.reward_extra_info["acc"])
    assert out.metrics["reward/errors"] == 0 and out.metrics["reward/timeouts"] == 0
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


# math_dapo grades the last 300 characters of a response (its module docstring); gsm8k and
# countdown name their tails _TAIL_CHARS
MATH_DAPO_TAIL = 300


@FUZZ
@given(text=nasty_text(), gt=_gt)
def test_fuzz_inline_scorers(text, gt):
    """Every in-process scorer gives a result on its scale, and the same result for the response's
    tail alone: its work is bounded by the tail's length, however long the response."""
    dapo_tail, gsm8k_tail, countdown_tail = (
        text[-MATH_DAPO_TAIL:],
        text[-gsm8k._TAIL_CHARS :],
        text[-countdown._TAIL_CHARS :],
    )
    with hang_guard(60, "an in-process scorer"):
        out = math_dapo.compute_score(text, gt)
        assert out["score"] in (1.0, -1.0) and isinstance(out["pred"], str)
        assert out == math_dapo.compute_score(dapo_tail, gt)
        out = math_dapo.compute_score(text, gt, strict_box_verify=True)
        assert out["score"] in (1.0, -1.0)
        assert out == math_dapo.compute_score(dapo_tail, gt, strict_box_verify=True)
        for method in ("strict", "flexible"):
            out = gsm8k.compute_score(text, gt, method=method)
            assert out in (0, 0.0, 1.0) and out == gsm8k.compute_score(gsm8k_tail, gt, method=method)
        target = {"target": 3, "numbers": [1, 2]}
        out = countdown.compute_score(text, target)
        assert out["score"] in (0.0, 0.1, 1.0) and out == countdown.compute_score(countdown_tail, target)
        for source, tail in (
            ("arithmetic", dapo_tail),
            ("aime2024", dapo_tail),
            ("openai/gsm8k", gsm8k_tail),
            ("math_dapo", dapo_tail),
        ):
            assert is_inline_safe(source)
            assert default_compute_score(source, text, gt) == default_compute_score(source, tail, gt)


@pytest.fixture(scope="module")
def fuzz_pool():
    with ScoringPool(num_workers=1, timeout_s=3.0) as pool:
        yield pool


@FUZZ
@given(text=nasty_text(), gt=_gt)
def test_fuzz_symbolic_verifier_in_pool(fuzz_pool, text, gt):
    ref = ScorerRef(module="dapo.reward.scorers.math_equiv", attr="compute_score", preload=("sympy",))
    restarts = fuzz_pool.restarts
    with hang_guard(300, "the pool on one sample (timeout_s=3)"):
        [(status, value)] = fuzz_pool.map(ref, [{"solution_str": text, "ground_truth": gt}])
    assert status in (OK, TIMEOUT), value  # an "error" would be an exception escaping the scorer
    if status == OK:
        assert value["score"] in (0.0, 1.0) and isinstance(value["acc"], bool)
        assert fuzz_pool.restarts == restarts  # no worker was lost on a sample that was scored
    else:
        # the per-sample timeout fired: the worker on it was killed and replaced
        assert value == f"no result within {fuzz_pool.timeout_s:g}s"
        assert fuzz_pool.restarts == restarts + 1


@settings(max_examples=40, deadline=None)
@given(
    numbers=st.lists(st.integers(-(10**30), 10**30), max_size=6),
    target=st.integers(-(10**30), 10**30),
    expr=st.text(alphabet="0123456789+-*/() .", max_size=300),
)
def test_fuzz_countdown_expressions(numbers, target, expr):
    """Evaluation is bounded: powers and expressions past the length cap are refused unevaluated."""
    with hang_guard(60, "the countdown scorer"):
        out = countdown.compute_score(f"<answer>{expr}</answer>", {"target": target, "numbers": numbers})
    assert out["score"] in (0.0, 0.1, 1.0)
    if "**" in expr or len(expr.strip()) > countdown._MAX_EXPR_CHARS:
        assert countdown.evaluate_expression(expr.strip()) is None
        assert out == {"score": 0.1, "acc": False, "pred": expr.strip()}


def test_math_equiv_bounded_in_process_on_known_bombs():
    """Never handed to sympy: the exponent guard refuses the powers, and the 301-character answer
    is longer than MAX_ANSWER_CHARS, so each is compared as a string."""
    bombs = {
        "9^{9^{9^{9}}}": 0.0,
        "10^{100000}": 0.0,
        "(" * 150 + "1" + ")" * 150: 1.0,
    }
    for answer, expected in bombs.items():
        assert math_equiv._to_sympy(answer) is None, answer
        with hang_guard(60, f"math_equiv on {answer[:20]}"):
            out = math_equiv.compute_score("\\boxed{" + answer + "}", "1")
        assert out["score"] == expected, answer


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
