"""Per-prompt solve-rate posterior (Beta-Bernoulli, decayed as the policy moves), pure functions.

Each group of ``n`` responses with ``k`` correct is ``n`` Bernoulli draws of the prompt's solve
rate ``p``: a ``Beta(alpha, beta)`` posterior takes ``alpha += k, beta += n - k``. The policy
moves between groups, so old evidence counts less: before new evidence the excess over the
prior is multiplied by ``decay ** updates`` (policy updates since the last group), as in
model-predictive prompt selection (MoPPS). The probability that the next group has no spread
(all right or all wrong) under the posterior is ``E[p^n] + E[(1-p)^n]``, in closed form with
Beta functions.

The posterior's *evidence weight* is its excess over the prior, ``(alpha + beta) - (alpha0 +
beta0)``: the responses' worth of evidence it holds. Decay shrinks it geometrically, so a
prompt not seen for long holds little evidence whatever the prior says. The skip rule
(:func:`confident_no_spread`) uses the weight to tell "the evidence says no spread" from "the
evidence has faded": only the first may skip a prompt.
"""

from __future__ import annotations

from math import exp, floor, inf, lgamma, log


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


def weight(alpha: float, beta: float, prior: tuple[float, float]) -> float:
    """The evidence weight: responses' worth of evidence beyond the prior (decayed)."""
    return alpha + beta - prior[0] - prior[1]


def capped(alpha: float, beta: float, prior: tuple[float, float], max_weight: float) -> tuple[float, float]:
    """The posterior with its evidence weight at most ``max_weight``: beyond it, the excess over
    the prior is scaled down as a whole (the evidence's proportions are kept, and no group is
    dropped in favour of another). With the cap applied after every group, each new group of ``n`` at the cap
    multiplies the older evidence by ``1 - n / max_weight``: a forgetting per group rolled out,
    on top of the per-update ``decay``."""
    w = weight(alpha, beta, prior)
    # the tolerance keeps a capped posterior unchanged when capped again (a resume is bit-exact)
    if w <= max_weight * (1.0 + 1e-12) or w <= 0:
        return alpha, beta
    f = max_weight / w
    a0, b0 = prior
    return a0 + f * (alpha - a0), b0 + f * (beta - b0)


def _moment(a: float, b: float, n: int) -> float:
    """E[p^n] for p ~ Beta(a, b)."""
    return exp(lgamma(a + n) + lgamma(a + b) - lgamma(a) - lgamma(a + b + n))


def zero_spread_prob(alpha: float, beta: float, n: int) -> float:
    """P(a group of ``n`` is all right or all wrong) under ``Beta(alpha, beta)``."""
    if n <= 1:
        return 1.0
    return min(1.0, _moment(alpha, beta, n) + _moment(beta, alpha, n))


def point_zero_spread(p: float, n: int) -> float:
    """P(a group of ``n`` is all right or all wrong) for a known solve rate ``p``."""
    if n <= 1:
        return 1.0
    return p**n + (1.0 - p) ** n


def confident_no_spread(
    alpha: float,
    beta: float,
    n: int,
    *,
    prior: tuple[float, float],
    threshold: float,
    min_weight: float,
) -> bool:
    """The skip rule on a (decayed) posterior: skip only when the posterior holds at least
    ``min_weight`` responses' worth of evidence (:func:`weight`) *and* gives the next group of
    ``n`` no spread with probability at least ``threshold`` (:func:`zero_spread_prob`).

    Faded evidence (weight below ``min_weight``) never skips, whatever the prior predicts: under
    a U-shaped prior such as Jeffreys' ``Beta(0.5, 0.5)``, ``zero_spread_prob`` of the prior alone
    is 0.39 for ``n=8``, so without the weight condition a prompt not seen for long would be
    skipped on the prior's say-so, as if it had been found hopeless. ``min_weight=0`` is the rule
    without that condition."""
    if weight(alpha, beta, prior) < min_weight:
        return False
    return zero_spread_prob(alpha, beta, n) >= threshold


def skip_horizon(max_weight: float, min_weight: float, decay: float) -> float:
    """The most policy updates after its last rollout for which :func:`confident_no_spread` can
    still skip a prompt whose evidence weight was at most ``max_weight`` after that rollout:
    ``floor(ln(max_weight / min_weight) / ln(1 / decay))``; ``inf`` without decay or without a
    minimum weight, 0 when ``min_weight > max_weight``.

    Proof: :func:`decayed` multiplies both excesses over the prior by ``f = decay ** t`` after
    ``t`` updates, so the weight is ``w0 * decay ** t <= max_weight * decay ** t``. Skipping needs
    weight ``>= min_weight``, so ``decay ** t >= min_weight / max_weight``, i.e. ``t <=
    ln(max_weight / min_weight) / ln(1 / decay)``; ``t`` is an integer. Every draw more updates
    after the last rollout rolls the prompt out."""
    if min_weight <= 0 or decay >= 1.0 or max_weight == inf:
        return inf
    if min_weight > max_weight:
        return 0
    return float(floor(log(max_weight / min_weight) / log(1.0 / decay) + 1e-9))


def mean(alpha: float, beta: float) -> float:
    return alpha / (alpha + beta)
