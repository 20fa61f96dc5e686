"""``algorithm.filter_groups.*``: DAPO dynamic sampling (group filter + dynamic batcher).

verl's keys (``enable``, ``metric``, ``max_num_gen_batches``) keep verl's names and meaning.
The rest are ours; each field's docstring-comment says what it does. The defaults live here.

Strategies:

* ``"verl"``: the DAPO recipe's accumulator exactly (verl's recipe/dapo/dapo_ray_trainer.py): rounds of
  ``data.gen_batch_size`` prompts, keep groups with ``np.std(metric) > 0`` (or a single
  trajectory), trim to the first ``train_batch_size`` groups, drop the surplus.
  ``carry_over``, ``adaptive_rounds``, ``skip``, ``filter_rule``, ``band`` and
  ``adaptive_threshold`` are ignored in this mode; ``on_exhausted`` is honoured
  (``"error"`` reproduces verl's ``ValueError``).
* ``"default"``: ours. Surplus kept groups stay in a pool for later steps (bounded staleness),
  rounds are sized from the observed kept rate, prompts whose recent groups were filtered are
  skipped before rollout (with exploration), and the filter compares raw values exactly.
* ``"stream"``: ours, on the vLLM engine in the trainer's process. Like ``"default"`` (the same
  filter, pool, staleness bound and skipping), but prompts go to the engine group by group: each
  group is scored and filtered the moment its ``n`` samples are done, new prompts are submitted
  while the groups in flight are not expected to fill the batch (at most ``data.gen_batch_size``
  in flight), and nothing new is submitted once ``train_batch_size`` groups are kept: the groups
  in flight are finished, the batch is the first kept groups in draw order (not finishing order,
  which favours short responses) and the surplus goes to the pool.
  ``max_num_gen_batches`` bounds the prompts launched per step to that many times
  ``data.gen_batch_size``.

With ``enable=False`` the batcher does one round of ``data.gen_batch_size`` prompts and hands
back the whole generated batch, untrimmed (verl quirk Q2: with ``gen_batch_size >
train_batch_size`` the step trains on ``gen_batch_size * n`` trajectories).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

KEY = "algorithm.filter_groups"

STRATEGIES = ("default", "verl", "stream")
ON_EXHAUSTED = ("error", "train", "skip")
FILTER_RULES = ("zero_spread", "band")
BUILTIN_METRICS = ("acc", "score", "seq_reward", "seq_final_reward")
SHAPED_METRICS = ("seq_reward", "seq_final_reward")
SKIP_RULES = ("trend", "posterior", "thompson", "streak")


@dataclass
class TrendConfig:
    """``algorithm.filter_groups.skip.trend.*``: the ``trend`` skip rule (the default).

    A prompt's solve logit is its own difficulty plus a gain per trained group of it plus a
    drift per policy update, both shared by all prompts and fit every ``refit_every`` updates,
    with the pool's prior over difficulty (``dapo.sampling.solve_model``). A prompt is skipped
    when the chance ``q`` that its next group has no spread is at least ``threshold``, or, when
    it was not rolled out for ``revisit_after`` updates, at least ``revisit_threshold``; never
    on less than ``min_evidence`` groups' worth of (decayed) evidence. ``confirm`` rolls a
    prompt whose first group had no spread out once more at the next policy version.
    """

    # skip a prompt rolled out within revisit_after updates whose P(no spread) is at least this
    threshold: float = 0.1
    # policy updates after its last rollout from which a prompt is judged by revisit_threshold
    revisit_after: int = 60
    # skip a prompt not rolled out for revisit_after updates only from this P(no spread) up
    revisit_threshold: float = 0.65
    # skip only on at least this many groups' worth of evidence (after decay)
    min_evidence: float = 1.25
    # per policy update, the factor on a group's worth as evidence for min_evidence (1: never
    # fades); bounds how long after its last rollout a prompt can be skipped
    decay: float = 0.998
    # a prompt whose first group had no spread gets a second group at the next policy version
    confirm: bool = True
    # prior standard deviation of the logit gain per trained group of a prompt
    gain_sd: float = 0.2
    # prior standard deviation of the logit drift per policy update
    drift_sd: float = 0.005
    # refit the prior over difficulty, the gain and the drift every this many policy updates
    refit_every: int = 10
    # newest groups kept per prompt
    max_groups: int = 16


@dataclass
class SkipConfig:
    """``algorithm.filter_groups.skip.*``: skip prompts before rollout from their history.

    ``rule: trend`` (the default) has its keys under ``trend`` (:class:`TrendConfig`); of the keys
    here it uses ``recheck``, ``revisit_epochs`` and ``enable``.

    ``rule: posterior``: every prompt keeps a Beta posterior of its solve rate over
    all its groups (prior ``prior``; the evidence decays by ``decay`` per policy update, so old
    groups count less as the policy moves). A prompt whose posterior holds at least
    ``min_evidence`` groups' worth of evidence and puts the probability ``q`` that its next group
    has no spread at ``threshold`` or more is skipped, except for an
    exploring rollout with probability ``(1 - max_prob) * (1 - q) / (1 - threshold)``, at most
    ``max_explore`` of each round's rolled-out prompts (so exploration costs a fixed share of the
    generated groups however many prompts are drawn per update); so a prompt the policy has since
    solved is skipped even when its last group had spread. ``target``, ``init_prob``, ``prob_step`` and
    ``min_streak`` belong to the streak rule. ``recheck`` drops a
    carried group before training when its prompt's posterior, updated by newer groups, says
    the next group would have no spread with at least that probability (``1``: never).

    Evidence (posterior and thompson rules): a posterior keeps at most ``max_evidence`` groups'
    worth of evidence (beyond it the older evidence is scaled down as a new group comes in), and
    the posterior rule skips a prompt only while its posterior holds at least ``min_evidence``
    groups' worth after decay: evidence that has faded means "roll it out", whatever the prior
    predicts. So no prompt is skipped more than ``floor(ln(max_evidence / min_evidence) / ln(1 /
    decay))`` policy updates after its last rollout (``dapo.sampling.posterior.skip_horizon``).
    ``min_evidence: 0`` is the rule without that condition. The defaults (uniform prior, decay
    0.998, threshold 0.35, 0.5 to 3 groups' worth of evidence, a horizon of 894 updates, 346 after
    a single group) come from ``dapo bench sampling`` (docs/sampling.md). ``rule: thompson``: one solve rate per
    prompt and policy version drawn from the posterior decides (skipped when a group at that rate
    has no spread with probability at least ``threshold``); no exploring rollouts.

    ``rule: streak``: a prompt whose last ``min_streak`` groups were all filtered (no spread, or outside the band)
    is a skip candidate; a candidate is skipped with probability ``prob``, which moves by
    ``prob_step`` after every round toward the point where a (smoothed) fraction ``target`` of
    rolled-out groups is filtered. ``prob`` never exceeds ``max_prob``; the exploration chance
    ``1 - prob`` is divided by ``1 + streak - min_streak`` (prompts filtered many times in a row are
    rechecked less often).

    Every rule keeps the revisit bound: a prompt is rolled out at least once every
    ``ceil(revisit_epochs * P / train_batch_size)`` policy updates, ``P`` the number of distinct
    prompts rolled out so far (one epoch's worth of updates), so none starves and drifted prompts
    are found again. It counts updates, not draws (skipped draws are cheap, and a count of draws
    grows with the passes over the data), and each prompt's own bound is staggered between half
    and all of it so that re-checks do not come at once; at most about ``s / (0.75 *
    revisit_epochs)`` of the trained groups are then spent on it, ``s`` the fraction of prompts
    skipped. When one round meets a prompt again with nothing rolled out since its previous draw
    (a whole pass skipped), the skipped prompt likeliest to spread is rolled out, so a round fills.
    Only used by strategies ``default`` and ``stream``.
    """

    # skip prompts whose recent groups were all filtered (strategy default only)
    enable: bool = True
    # "trend" (every group through a shared model of the policy's improvement; keys under trend),
    # "posterior" (Beta solve-rate posterior over all groups), "thompson" (one draw from it per
    # prompt and policy version) or "streak" (consecutive filtered groups)
    rule: str = "trend"
    # Beta prior [alpha, beta] of a prompt's solve rate (posterior and thompson rules)
    prior: list[float] = field(default_factory=lambda: [1.0, 1.0])
    # per policy update, the factor on a prompt's evidence beyond the prior (1: no forgetting)
    decay: float = 0.998
    # drop a carried group whose prompt's P(no spread) reached this before training (posterior rule)
    recheck: float = 0.9
    # skip a prompt whose P(no spread) is at least this (posterior and thompson rules)
    threshold: float = 0.35
    # target fraction of rolled-out groups that the filter drops; skip prob rises above it
    target: float = 0.1
    # consecutive filtered groups before a prompt becomes a skip candidate
    min_streak: int = 1
    # starting skip probability for candidates
    init_prob: float = 0.5
    # change of the skip probability after each round
    prob_step: float = 0.05
    # upper bound on the skip probability (1 - max_prob is the exploration rate)
    max_prob: float = 0.998
    # revisit bound, in epochs' worth of policy updates (distinct prompts / train_batch_size):
    # a prompt not rolled out for that many updates is rolled out on its next draw
    revisit_epochs: float = 100.0
    # at most this fraction of a round's rolled-out prompts are exploring rollouts (posterior rule)
    max_explore: float = 0.015
    # skip only a prompt whose posterior holds at least this many groups' worth of (decayed)
    # evidence: faded evidence means "roll it out" (posterior rule)
    min_evidence: float = 0.5
    # a posterior keeps at most this many groups' worth of evidence (posterior and thompson rules)
    max_evidence: float = 3.0
    # the trend rule's keys
    trend: TrendConfig = field(default_factory=TrendConfig)


@dataclass
class AdaptiveThresholdConfig:
    """``algorithm.filter_groups.adaptive_threshold.*``: move the band toward a kept fraction.

    Needs ``filter_rule: band``. After every round the band's half-width shrinks when more than
    ``target`` of the rolled-out groups were kept and widens when fewer were (by ``rate`` times
    the difference), around the band's centre, never narrower than ``min_width``.
    """

    # move the band's half-width toward the target kept fraction (needs filter_rule band)
    enable: bool = False
    # kept fraction (kept groups / rolled-out groups) the band steers toward
    target: float = 0.5
    # step size of the half-width update per unit of kept-fraction error
    rate: float = 0.05
    # the band never gets narrower than this
    min_width: float = 0.1


@dataclass
class FilterGroupsConfig:
    """``algorithm.filter_groups.*``."""

    # verl: turn dynamic sampling (group filtering + accumulation) on
    enable: bool = False
    # verl: per-trajectory metric the filter reads: acc | score | seq_reward (sum of
    # token_level_scores) | seq_final_reward (sum of token_level_rewards) | any reward extra key.
    # verl's default is null (which crashes when enabled); ours is acc, the safe raw metric.
    metric: str | None = "acc"
    # verl: at most this many generation rounds per training step; <= 0 means no limit
    max_num_gen_batches: int = 0
    # "default" (ours: carry-over, adaptive rounds, skipping), "verl" (the recipe, exactly) or
    # "stream" (ours, vLLM in-process only: default's filter and pool, groups streamed one by one,
    # no new group once the batch is full; the batch is taken in draw order)
    strategy: str = "default"
    # when max_num_gen_batches runs out: "error" (stop; verl's behaviour), "train" (train on the
    # groups collected so far, fewer than train_batch_size) or "skip" (no update this step;
    # with carry_over the collected groups stay in the pool)
    on_exhausted: str = "train"
    # keep surplus kept groups for later steps instead of dropping them (default strategy)
    carry_over: bool = True
    # a carried group is used at most this many policy updates after it was generated
    max_staleness: int = 1
    # size each round from a running estimate of the kept rate (within data.gen_batch_size)
    adaptive_rounds: bool = True
    # relative over-request on top of what the kept-rate estimate says is needed
    round_margin: float = 0.1
    # smallest round, in prompts, when adaptive_rounds is on
    min_round_size: int = 1
    # weight of the newest round in the kept-rate moving average
    kept_rate_ema: float = 0.3
    # pre-rollout skipping of prompts that keep giving filtered groups
    skip: SkipConfig = field(default_factory=SkipConfig)
    # "zero_spread": keep groups whose metric values are not all equal (exact equality);
    # "band": also require the group's mean metric to lie in [band[0], band[1]]
    filter_rule: str = "zero_spread"
    # inclusive [low, high] bounds on the group mean metric for filter_rule=band
    band: list[float] = field(default_factory=lambda: [0.0, 1.0])
    # move the band with training toward a target kept fraction
    adaptive_threshold: AdaptiveThresholdConfig = field(default_factory=AdaptiveThresholdConfig)
    # ours: generate the next step's batch (every round of it) in a background thread on a copy
    # of the weights while this step's update runs, so the two overlap on a CPU with a spare
    # core (on one GPU they share the device's stream); the prefetched groups are one policy
    # update stale, within max_staleness. Costs one copy of the model's weights; a graceful stop
    # waits for the prefetch. Not with strategy verl (the recipe is sequential).
    prefetch: bool = False


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(float(x))


def validate(cfg: FilterGroupsConfig) -> list[str]:
    """Every problem with ``cfg``, each naming the full key ``algorithm.filter_groups.<field>``."""
    p: list[str] = []

    def bad(name: str, msg: str) -> None:
        p.append(f"{KEY}.{name}: {msg}")

    if not isinstance(cfg.enable, bool):
        bad("enable", f"must be true or false, got {cfg.enable!r}")
    if cfg.metric is None or not isinstance(cfg.metric, str) or not cfg.metric.strip():
        if cfg.enable:
            bad(
                "metric",
                f"must name a per-trajectory metric ({', '.join(BUILTIN_METRICS)} or a reward extra key) "
                "when filtering is enabled; acc is the safe choice",
            )
    if not _is_int(cfg.max_num_gen_batches):
        bad("max_num_gen_batches", f"must be an integer (<= 0: no limit), got {cfg.max_num_gen_batches!r}")
    if cfg.strategy not in STRATEGIES:
        bad("strategy", f"must be one of {', '.join(STRATEGIES)}, got {cfg.strategy!r}")
    if cfg.on_exhausted not in ON_EXHAUSTED:
        bad("on_exhausted", f"must be one of {', '.join(ON_EXHAUSTED)}, got {cfg.on_exhausted!r}")
    if not isinstance(cfg.carry_over, bool):
        bad("carry_over", f"must be true or false, got {cfg.carry_over!r}")
    if not _is_int(cfg.max_staleness) or cfg.max_staleness < 0:
        bad("max_staleness", f"must be an integer >= 0 (policy updates), got {cfg.max_staleness!r}")
    if not isinstance(cfg.prefetch, bool):
        bad("prefetch", f"must be true or false, got {cfg.prefetch!r}")
    elif cfg.prefetch and cfg.strategy != "default":
        bad("prefetch", f"needs strategy default, got strategy={cfg.strategy!r}")
    elif cfg.prefetch and _is_int(cfg.max_staleness) and cfg.max_staleness < 1:
        bad(
            "prefetch",
            "trains on groups one policy update stale, so it needs max_staleness >= 1, "
            f"got max_staleness={cfg.max_staleness}",
        )
    if not isinstance(cfg.adaptive_rounds, bool):
        bad("adaptive_rounds", f"must be true or false, got {cfg.adaptive_rounds!r}")
    if not _is_num(cfg.round_margin) or cfg.round_margin < 0:
        bad("round_margin", f"must be a number >= 0, got {cfg.round_margin!r}")
    if not _is_int(cfg.min_round_size) or cfg.min_round_size < 1:
        bad("min_round_size", f"must be an integer >= 1, got {cfg.min_round_size!r}")
    if not _is_num(cfg.kept_rate_ema) or not 0 < cfg.kept_rate_ema <= 1:
        bad("kept_rate_ema", f"must be in (0, 1], got {cfg.kept_rate_ema!r}")

    s = cfg.skip
    if not isinstance(s.enable, bool):
        bad("skip.enable", f"must be true or false, got {s.enable!r}")
    if not _is_num(s.target) or not 0 <= s.target < 1:
        bad("skip.target", f"must be in [0, 1), got {s.target!r}")
    if not _is_int(s.min_streak) or s.min_streak < 1:
        bad("skip.min_streak", f"must be an integer >= 1, got {s.min_streak!r}")
    if not _is_num(s.max_prob) or not 0 <= s.max_prob < 1:
        bad("skip.max_prob", f"must be in [0, 1) so that every prompt keeps a chance, got {s.max_prob!r}")
    if not _is_num(s.init_prob) or not 0 <= s.init_prob <= 1:
        bad("skip.init_prob", f"must be in [0, 1], got {s.init_prob!r}")
    elif _is_num(s.max_prob) and s.init_prob > s.max_prob:
        bad("skip.init_prob", f"must not exceed skip.max_prob={s.max_prob}, got {s.init_prob!r}")
    if not _is_num(s.prob_step) or not 0 <= s.prob_step <= 1:
        bad("skip.prob_step", f"must be in [0, 1], got {s.prob_step!r}")
    if s.rule not in SKIP_RULES:
        bad("skip.rule", f"must be one of {', '.join(SKIP_RULES)}, got {s.rule!r}")
    try:
        prior_ok = len(s.prior) == 2 and all(_is_num(x) and x > 0 for x in s.prior)
    except TypeError:
        prior_ok = False
    if not prior_ok:
        bad("skip.prior", f"must be two numbers > 0 [alpha, beta], got {s.prior!r}")
    if not _is_num(s.decay) or not 0 < s.decay <= 1:
        bad("skip.decay", f"must be in (0, 1] (1: no forgetting), got {s.decay!r}")
    if not _is_num(s.threshold) or not 0 < s.threshold <= 1:
        bad("skip.threshold", f"must be in (0, 1], got {s.threshold!r}")
    if not _is_num(s.recheck) or not 0 < s.recheck <= 1:
        bad("skip.recheck", f"must be in (0, 1] (1: never drop a carried group), got {s.recheck!r}")
    if not _is_num(s.revisit_epochs) or s.revisit_epochs < 0:
        bad("skip.revisit_epochs", f"must be a number >= 0 (0: never skip), got {s.revisit_epochs!r}")
    if not _is_num(s.max_explore) or not 0 <= s.max_explore <= 1:
        bad("skip.max_explore", f"must be in [0, 1] (0: no exploring rollouts), got {s.max_explore!r}")
    if not _is_num(s.min_evidence) or s.min_evidence < 0:
        bad("skip.min_evidence", f"must be a number >= 0 (groups' worth of evidence), got {s.min_evidence!r}")
    if not _is_num(s.max_evidence) or s.max_evidence <= 0:
        bad("skip.max_evidence", f"must be a number > 0 (groups' worth of evidence), got {s.max_evidence!r}")
    elif _is_num(s.min_evidence) and s.min_evidence > s.max_evidence:
        bad(
            "skip.min_evidence",
            f"must not exceed skip.max_evidence={s.max_evidence} (nothing could be skipped), "
            f"got {s.min_evidence!r}",
        )
    _validate_trend(s.trend, bad)

    if cfg.filter_rule not in FILTER_RULES:
        bad("filter_rule", f"must be one of {', '.join(FILTER_RULES)}, got {cfg.filter_rule!r}")
    band = cfg.band
    try:
        band_ok = len(band) == 2 and all(_is_num(x) for x in band)
    except TypeError:
        band_ok = False
    if not band_ok:
        bad("band", f"must be two numbers [low, high], got {band!r}")
    elif band[0] > band[1]:
        bad("band", f"low must not exceed high, got {list(band)!r}")

    a = cfg.adaptive_threshold
    if not isinstance(a.enable, bool):
        bad("adaptive_threshold.enable", f"must be true or false, got {a.enable!r}")
    elif a.enable and cfg.filter_rule != "band":
        bad("adaptive_threshold.enable", f"needs {KEY}.filter_rule=band, got {cfg.filter_rule!r}")
    if not _is_num(a.target) or not 0 < a.target <= 1:
        bad("adaptive_threshold.target", f"must be in (0, 1], got {a.target!r}")
    if not _is_num(a.rate) or a.rate < 0:
        bad("adaptive_threshold.rate", f"must be a number >= 0, got {a.rate!r}")
    if not _is_num(a.min_width) or a.min_width < 0:
        bad("adaptive_threshold.min_width", f"must be a number >= 0, got {a.min_width!r}")
    return p


def metric_warnings(
    cfg: FilterGroupsConfig, *, overlong_buffer_enable: bool = False, use_kl_in_reward: bool = False
) -> list[str]:
    """Warnings (not errors) about filtering on a shaped reward.

    With ``seq_reward`` (scores incl. the overlong penalty) or ``seq_final_reward`` (also the
    in-reward KL), groups whose answers are all wrong (or all right) survive the filter as soon
    as the shaping differs between responses, and give gradients that only teach length/KL.
    ``score`` is safe only when the scorer gives no partial or format credit.
    """
    if not cfg.enable or not cfg.metric:
        return []
    m = cfg.metric
    out = []
    shaped = (m == "seq_reward" and overlong_buffer_enable) or (
        m == "seq_final_reward" and (overlong_buffer_enable or use_kl_in_reward)
    )
    if shaped:
        out.append(
            f"{KEY}.metric={m} is a shaped reward (overlong penalty"
            f"{' / in-reward KL' if m == 'seq_final_reward' and use_kl_in_reward else ''}): "
            "all-wrong groups whose lengths differ pass the filter and train on length alone; "
            f"{KEY}.metric=acc filters on the raw correctness"
        )
    elif m in SHAPED_METRICS:
        out.append(
            f"{KEY}.metric={m} sums token-level rewards: any shaping added later lets groups with equal "
            f"correctness pass the filter; {KEY}.metric=acc is the safe choice"
        )
    elif m == "score":
        out.append(
            f"{KEY}.metric=score: if the scorer gives partial or format credit, all-wrong groups can "
            f"pass the filter; {KEY}.metric=acc filters on correctness"
        )
    return out


def _validate_trend(t: TrendConfig, bad) -> None:
    k = "skip.trend."
    for name in ("threshold", "revisit_threshold"):
        v = getattr(t, name)
        if not _is_num(v) or not 0 < v <= 1:
            bad(k + name, f"must be in (0, 1], got {v!r}")
    if not _is_int(t.revisit_after) or t.revisit_after < 0:
        bad(k + "revisit_after", f"must be an integer >= 0 (policy updates), got {t.revisit_after!r}")
    if not _is_num(t.min_evidence) or t.min_evidence < 0:
        bad(k + "min_evidence", f"must be a number >= 0 (groups' worth of evidence), got {t.min_evidence!r}")
    if not _is_num(t.decay) or not 0 < t.decay <= 1:
        bad(k + "decay", f"must be in (0, 1] (1: no forgetting), got {t.decay!r}")
    if not isinstance(t.confirm, bool):
        bad(k + "confirm", f"must be true or false, got {t.confirm!r}")
    for name in ("gain_sd", "drift_sd"):
        v = getattr(t, name)
        if not _is_num(v) or v <= 0:
            bad(k + name, f"must be a number > 0, got {v!r}")
    if not _is_int(t.refit_every) or t.refit_every < 1:
        bad(k + "refit_every", f"must be an integer >= 1 (policy updates), got {t.refit_every!r}")
    if not _is_int(t.max_groups) or t.max_groups < 1:
        bad(k + "max_groups", f"must be an integer >= 1, got {t.max_groups!r}")
    elif _is_num(t.min_evidence) and t.min_evidence > t.max_groups:
        bad(
            k + "min_evidence",
            f"must not exceed skip.trend.max_groups={t.max_groups} (nothing could be skipped), got {t.min_evidence!r}",
        )


def skip_rule_warnings(cfg: FilterGroupsConfig) -> list[str]:
    """Skip keys set away from their defaults that the skip rule in force does not read."""
    s = cfg.skip
    if not (cfg.enable and s.enable) or cfg.strategy == "verl":
        return []
    base = SkipConfig()
    if s.rule == "trend":
        unused = ("prior", "decay", "threshold", "min_evidence", "max_evidence", "max_explore", "max_prob")
        unused += ("target", "min_streak", "init_prob", "prob_step")
        changed = [k for k in unused if getattr(s, k) != getattr(base, k)]
    else:
        names = [f.name for f in dataclasses.fields(TrendConfig)]
        changed = [f"trend.{k}" for k in names if getattr(s.trend, k) != getattr(base.trend, k)]
    if not changed:
        return []
    keys = ", ".join(f"{KEY}.skip.{k}" for k in changed)
    return [
        f"{keys}: not read by {KEY}.skip.rule={s.rule} (the rule in force); set the rule that reads them "
        "or drop them"
    ]
