"""The solve-rate model of skip rule ``trend``, pure functions on a grid of solve logits.

Prompt ``i``'s chance that a response is right, at policy version ``v`` after ``T`` of its own
groups were trained, is ``sigmoid(theta_i + gamma * (T - T_i) + delta * (v - v_i))``: ``theta_i``
the prompt's solve logit when its newest group was generated (at version ``v_i``, ``T_i`` trained),
and two effects shared by all prompts, the gain from training on the prompt itself (``gamma``, per
trained group) and the drift from training on anything (``delta``, per policy update). All of a
prompt's groups so inform ``theta_i``, each seen through the shift between its time and the
newest group's, and its next group is predicted at the shift from the newest group to now.
Measuring from the prompt's own newest group keeps ``theta_i`` near what was observed, inside the
grid, however long the run; the Beta rule
(:mod:`dapo.sampling.posterior`) can only discount old groups, so it keeps a few groups'
worth and mistakes a prompt that is being learnt for one that is not.

``theta_i`` lives on a fixed grid (:data:`GRID`). Its prior is *learnt from the pool*
(empirical Bayes, the grid's weights re-estimated as the average posterior of every prompt
seen): on a pool where most prompts are nearly always or nearly never solved, one group of ``n``
without spread is then strong evidence, and a prompt whose groups look middling is pulled
toward where the pool's middling prompts are. ``gamma`` and ``delta`` are fit by maximum a
posteriori over every prompt's groups (Newton steps on the marginal likelihood, ``theta_i``
integrated out on the grid) under zero-mean normal priors, so a run without revisits yet keeps
them near zero. Old groups are not discounted here: the shift says how the prompt has moved
since. How much evidence a prompt holds for a skip, and for how long, is
:func:`evidence`'s business (decayed per update, which bounds how long a prompt can be skipped).

A group is stored as ``(trained, version, correct, n)``: the prompt's trained groups and the
policy version when it was generated, its right responses and its size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GRID = np.linspace(-12.0, 12.0, 241)  # solve logits theta; 0.1 apart


def log_sigmoid(z: np.ndarray) -> np.ndarray:
    return -np.logaddexp(0.0, -z)


def flat_log_prior() -> np.ndarray:
    """The prior before the pool has said anything: uniform in the solve rate (``Beta(1, 1)``),
    i.e. ``p (1 - p)`` in the logit, normalised on the grid."""
    lp = log_sigmoid(GRID) + log_sigmoid(-GRID)
    return lp - np.logaddexp.reduce(lp)


def _binomial_loglik(correct: np.ndarray, n: np.ndarray, z: np.ndarray) -> np.ndarray:
    """``correct log sigmoid(z) + (n - correct) log sigmoid(-z)``, with ``log sigmoid(-z) =
    log sigmoid(z) - z`` (one log-sigmoid, the costly part of a fit)."""
    return n * log_sigmoid(z) - (n - correct) * z


def group_loglik(correct: float, n: float, shift: float) -> np.ndarray:
    """Log-likelihood over :data:`GRID` of ``correct`` right of ``n`` at logit ``theta + shift``
    (the binomial coefficient dropped: it does not depend on theta)."""
    return _binomial_loglik(np.float64(correct), np.float64(n), GRID + shift)


def relative(groups: np.ndarray) -> np.ndarray:
    """The groups with their trained count and version taken from the newest group's (last row)."""
    g = np.asarray(groups, dtype=np.float64).reshape(-1, 4).copy()
    g[:, :2] -= g[-1, :2]
    return g


def prompt_loglik(groups: np.ndarray, gamma: float, delta: float) -> np.ndarray:
    """A prompt's log-likelihood over :data:`GRID` from its ``groups`` (rows ``(trained, version,
    correct, n)``, oldest first), each at the shift ``gamma * dT + delta * dv`` from its
    generation to the newest group's."""
    g = relative(groups)
    z = GRID[None, :] + (gamma * g[:, 0] + delta * g[:, 1])[:, None]
    return _binomial_loglik(g[:, 2, None], g[:, 3, None], z).sum(0)


def evidence(groups: np.ndarray, decay: float, version: int) -> float:
    """Responses' worth of evidence the groups hold at ``version`` after decay."""
    g = np.asarray(groups, dtype=np.float64).reshape(-1, 4)
    return float((decay ** (version - g[:, 1]) * g[:, 3]).sum())


def predict_zero_spread(loglik: np.ndarray, log_prior: np.ndarray, shift: float, n: int) -> float:
    """P(the next group of ``n`` has no spread): the posterior ``log_prior + loglik`` over theta,
    each theta's chance ``p^n + (1-p)^n`` at ``p = sigmoid(theta + shift)``."""
    if n <= 1:
        return 1.0
    lw = log_prior + loglik
    w = np.exp(lw - lw.max())
    p = 1.0 / (1.0 + np.exp(-(GRID + shift)))
    return float(min(1.0, (w * (p**n + (1.0 - p) ** n)).sum() / w.sum()))


@dataclass(frozen=True)
class Fit:
    gamma: float
    delta: float
    log_prior: np.ndarray


# prompts per block of the fit: its arrays hold about BLOCK x groups per prompt x grid floats, so a
# pool of any size is fit in bounded memory
BLOCK = 256


def _blocks(groups: list[np.ndarray]) -> list[tuple[np.ndarray, ...]]:
    """``(trained, version, correct, n, owner)`` columns per block of prompts, trained count and
    version relative to the prompt's newest group (``owner``: the prompt's row in its block)."""
    out = []
    for start in range(0, len(groups), BLOCK):
        part = [relative(x) for x in groups[start : start + BLOCK]]
        g = np.concatenate(part)
        owner = np.repeat(np.arange(len(part)), [len(x) for x in part])
        out.append((g[:, 0], g[:, 1], g[:, 2], g[:, 3], owner))
    return out


def _logits(block: tuple[np.ndarray, ...], ga: float, de: float) -> np.ndarray:
    """Each group's logit over the grid at the block's shifts."""
    t, v = block[0], block[1]
    return GRID[None, :] + (ga * t + de * v)[:, None]


def _loglik(block: tuple[np.ndarray, ...], ga: float, de: float) -> np.ndarray:
    """Per prompt of the block, the log-likelihood over the grid."""
    _, _, k, n, owner = block
    ll = _binomial_loglik(k[:, None], n[:, None], _logits(block, ga, de))
    out = np.zeros((int(owner[-1]) + 1, GRID.size))
    np.add.at(out, owner, ll)
    return out


def _marginal(loglik: list[np.ndarray], lp: np.ndarray) -> float:
    """Sum over the prompts of log sum over the grid of prior times likelihood."""
    marginal = 0.0
    for part in loglik:
        L = part + lp
        m = L.max(1)
        marginal += float((m + np.log(np.exp(L - m[:, None]).sum(1))).sum())
    return marginal


def _posterior(L: np.ndarray) -> np.ndarray:
    post = np.exp(L - L.max(1, keepdims=True))
    return post / post.sum(1, keepdims=True)


def fit(
    groups: list[np.ndarray],
    prev: Fit,
    *,
    gain_sd: float,
    drift_sd: float,
    steps: int = 2,
) -> Fit:
    """Refit the prior and the shared effects to every prompt's ``groups`` (one array per
    prompt), starting from ``prev``: per step one empirical-Bayes update of the prior (the mean
    posterior over the prompts) and one Newton step on ``(gamma, delta)`` with backtracking
    (the marginal log-likelihood, theta integrated out on the grid, plus the normal priors'
    log density; ``gamma, delta >= 0``: training does not make prompts harder on average)."""
    if not groups:
        return prev
    blocks = _blocks(groups)
    gamma, delta, log_prior = prev.gamma, prev.delta, prev.log_prior

    def objective(loglik: list[np.ndarray], ga: float, de: float, lp: np.ndarray) -> float:
        return _marginal(loglik, lp) - 0.5 * ((ga / gain_sd) ** 2 + (de / drift_sd) ** 2)

    for _ in range(steps):
        # the likelihood at this step's (gamma, delta), read by the prior's update, the Newton
        # step and the line search's baseline
        loglik = [_loglik(b, gamma, delta) for b in blocks]
        mass = np.zeros(GRID.size)
        for L in loglik:
            mass += _posterior(L + log_prior).sum(0)
        prior = mass / len(groups) + 1e-12
        log_prior = np.log(prior / prior.sum())
        # the score and curvature of each group's log-likelihood in (gamma, delta), per theta;
        # the marginal's Hessian is E[curvature] - Var[score] under each prompt's posterior
        grad = np.array([-gamma / gain_sd**2, -delta / drift_sd**2])
        hess = np.diag([1 / gain_sd**2, 1 / drift_sd**2])
        for b, L in zip(blocks, loglik, strict=True):
            t, v, k, n, owner = b
            post = _posterior(L + log_prior)
            s = 1.0 / (1.0 + np.exp(-_logits(b, gamma, delta)))
            resid = k[:, None] - n[:, None] * s
            curv = n[:, None] * s * (1.0 - s)
            acc = np.zeros((5, post.shape[0], GRID.size))
            for j, term in enumerate(
                (
                    t[:, None] * resid,
                    v[:, None] * resid,
                    t[:, None] ** 2 * curv,
                    (t * v)[:, None] * curv,
                    v[:, None] ** 2 * curv,
                )
            ):
                np.add.at(acc[j], owner, term)
            s1, s2 = (post * acc[0]).sum(1), (post * acc[1]).sum(1)
            grad += [s1.sum(), s2.sum()]
            h11 = (post * acc[2]).sum() - ((post * acc[0] ** 2).sum(1) - s1**2).sum()
            h12 = (post * acc[3]).sum() - ((post * acc[0] * acc[1]).sum(1) - s1 * s2).sum()
            h22 = (post * acc[4]).sum() - ((post * acc[1] ** 2).sum(1) - s2**2).sum()
            hess += [[h11, h12], [h12, h22]]
        low = np.linalg.eigvalsh(hess).min()
        if low <= 0:  # far from the optimum the marginal need not be concave: damp the step
            hess = hess + (abs(low) + 1e-3 * abs(hess).max()) * np.eye(2)
        step = np.linalg.solve(hess, grad)
        base = objective(loglik, gamma, delta, log_prior)
        size = 1.0
        while size > 1e-3:
            ga, de = max(0.0, gamma + size * step[0]), max(0.0, delta + size * step[1])
            if objective([_loglik(b, ga, de) for b in blocks], ga, de, log_prior) > base:
                gamma, delta = ga, de
                break
            size /= 2
    return Fit(float(gamma), float(delta), log_prior)
