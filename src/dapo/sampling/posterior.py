"""Per-prompt solve-rate posterior (Beta-Bernoulli, decayed as the policy moves), pure functions.

Each group of ``n`` responses with ``k`` correct is ``n`` Bernoulli draws of the prompt's solve
rate ``p``: a ``Beta(alpha, beta)`` posterior takes ``alpha += k, beta += n - k``. The policy
moves between groups, so old evidence counts less: before new evidence the excess over the
prior is multiplied by ``decay ** updates`` (policy updates since the last group), as in
model-predictive prompt selection (MoPPS). The probability that the next group has no spread
(all right or all wrong) under the posterior is ``E[p^n] + E[(1-p)^n]``, in closed form with
Beta functions.
"""

from __future__ import annotations

from math import exp, lgamma


def decayed(
    alpha: float, beta: float, updates: int, decay: float, prior: tuple[float, float]
) -> tuple[float, float]:
    """The posterior after ``updates`` policy updates without evidence: the excess over the prior
    shrinks by ``decay`` per update (``decay=1``: no forgetting)."""
    f = decay ** max(int(updates), 0)
    if f == 1.0:
        return alpha, beta
    a0, b0 = prior
    return a0 + f * (alpha - a0), b0 + f * (beta - b0)


def observe(alpha: float, beta: float, correct: float, n: int) -> tuple[float, float]:
    """The posterior after a group of ``n`` responses, ``correct`` of them right."""
    return alpha + correct, beta + (n - correct)


def _moment(a: float, b: float, n: int) -> float:
    """E[p^n] for p ~ Beta(a, b)."""
    return exp(lgamma(a + n) + lgamma(a + b) - lgamma(a) - lgamma(a + b + n))


def zero_spread_prob(alpha: float, beta: float, n: int) -> float:
    """P(a group of ``n`` is all right or all wrong) under ``Beta(alpha, beta)``."""
    if n <= 1:
        return 1.0
    return min(1.0, _moment(alpha, beta, n) + _moment(beta, alpha, n))


def mean(alpha: float, beta: float) -> float:
    return alpha / (alpha + beta)
