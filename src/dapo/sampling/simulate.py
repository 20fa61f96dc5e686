"""``dapo bench sampling``: each dynamic-sampling strategy against a synthetic population.

The population (:class:`Population`): prompts with a latent solve logit; most are so easy or so
hard that a group of ``n`` responses has no spread. A prompt's logit rises by its own gain for
every trained group of it (training on a prompt is what moves it most) and by a small drift per
policy update whatever is trained (related training). So a sampler that keeps training the same
prompts solves them and must find others, and one that stops looking at a prompt cannot see it
become learnable: the simulator can fail a sampler that forgets its data. Rollouts are fake
(``dapo.sampling.fakes.FakeRollout``): each response is correct with the prompt's current solve
probability. Costs are counted in generated groups (one group = n responses of one prompt) and
generated response tokens.

Figures per strategy (``--json`` prints ``{"config": ..., "strategies": {name: figures}}``):
rounds per step, generated groups per trained group, qualified ratio (kept groups / generated
groups; ``qualified_ratio`` counts the steps after the warm-up, the first third of the run,
``qualified_ratio_overall`` all steps), skipped prompts, staleness of trained groups, surplus
dropped, generated tokens per trained token, decode ticks per step (a latency proxy: every
sequence in flight decodes one token per tick, so a round lasts as long as its longest response,
and ``stream`` ends when the groups in flight at the close are done). What a sampler costs learning:
``learnable_coverage`` (of the prompts whose true P(spread) was at least 0.5 at some step after
the warm-up, ``learnable_prompts``, the fraction trained at least once after the warm-up: the
simulator knows the truth), ``trained_prompts`` (distinct prompts trained after the warm-up),
``trained_reward_variance`` (mean p(1-p) of the trained groups' prompts under the policy that
trains on them: the advantage signal a group carries) and ``coverage``
(:mod:`dapo.sampling.coverage`'s figures at the end of the run, for every strategy). A strategy
whose step draws more than ``--max-passes`` times the pool is reported as stalled
(``stalled_at_step``) and stopped there.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dapo.config.load import ConfigError
from dapo.config.sampling import FilterGroupsConfig, SkipConfig, TrendConfig, validate
from dapo.sampling.batcher import DynamicBatcher
from dapo.sampling.coverage import C as COV
from dapo.sampling.coverage import coverage_metrics
from dapo.sampling.fakes import FakeGroupStream, FakeRollout, ListSource, bernoulli, prompt_rows
from dapo.sampling.skip import SkipPolicy


@dataclass
class Population:
    """Solve probability of prompt i after ``version`` policy updates, ``t_i`` of its own groups
    trained: ``sigmoid(logit_i + drift_i * version + gain_i * t_i)``. Training a prompt moves it
    (``gain``); training anything moves every prompt a little (``drift``, the transfer from
    related training). :meth:`train` counts the trained groups, so a sampler that keeps training
    the same prompts solves them and must find others, and one that never looks at a prompt again
    never sees it become learnable."""

    logits: np.ndarray
    drift: np.ndarray
    gain: np.ndarray
    trained: np.ndarray = dataclasses.field(default=None)  # type: ignore[assignment]
    # > 0: the training effect saturates, gain * T becomes gain * T * s / (s + T) (each trained
    # group moves the prompt less than the one before; at most gain * s in all)
    saturation: float = 0.0

    def __post_init__(self) -> None:
        if self.trained is None:
            self.trained = np.zeros(len(self.logits), dtype=np.int64)

    @classmethod
    def synthetic(
        cls,
        num_prompts: int = 4096,
        *,
        easy: float = 0.45,
        hard: float = 0.30,
        max_drift: float = 0.005,
        gain: tuple[float, float] = (0.05, 0.2),
        seed: int = 0,
        saturation: float = 0.0,
    ) -> Population:
        """``easy`` of the prompts are nearly always solved (logit U(3.5, 6)), ``hard`` nearly never
        (U(-7, -4)), the rest in between (U(-1.5, 1.5)); each drifts up by U(0, max_drift) logits
        per policy update and by U(gain) logits per trained group of its own."""
        rng = np.random.default_rng(seed)
        kind = rng.random(num_prompts)
        logits = np.where(
            kind < easy,
            rng.uniform(3.5, 6.0, num_prompts),
            np.where(
                kind < easy + hard, rng.uniform(-7.0, -4.0, num_prompts), rng.uniform(-1.5, 1.5, num_prompts)
            ),
        )
        drift = rng.uniform(0.0, max_drift, num_prompts)
        gains = rng.uniform(gain[0], gain[1], num_prompts)
        return cls(logits, drift, gains, saturation=saturation)

    def fresh(self) -> Population:
        """The same population with nothing trained yet (each strategy starts from it)."""
        return Population(self.logits, self.drift, self.gain, saturation=self.saturation)

    def effect(self, trained: np.ndarray | int) -> np.ndarray | float:
        """The training effect's count: ``T``, or ``T * s / (s + T)`` when it saturates."""
        s = self.saturation
        return trained if s <= 0 else trained * s / (s + trained)

    def logit(self, version: int) -> np.ndarray:
        return self.logits + self.drift * version + self.gain * self.effect(self.trained)

    def prob(self, index: int, version: int) -> float:
        x = (
            self.logits[index]
            + self.drift[index] * version
            + self.gain[index] * self.effect(self.trained[index])
        )
        return 1.0 / (1.0 + math.exp(-x))

    def spread_prob(self, n: int, version: int) -> np.ndarray:
        """True P(a group of ``n`` has spread), every prompt."""
        p = 1.0 / (1.0 + np.exp(-self.logit(version)))
        return 1.0 - p**n - (1.0 - p) ** n

    def no_spread_fraction(self, n: int, version: int) -> float:
        return float(np.mean(1.0 - self.spread_prob(n, version)))

    def train(self, indices: np.ndarray) -> None:
        """One trained group per entry of ``indices`` (repeats count)."""
        np.add.at(self.trained, np.asarray(indices, dtype=np.int64), 1)


def default_strategies(skip: dict[str, Any] | None = None) -> dict[str, FilterGroupsConfig]:
    """verl mode, ours and ours without each of its parts; ``skip`` overrides ``skip.*`` keys of
    every strategy that skips."""
    flat = {k: v for k, v in (skip or {}).items() if not k.startswith("trend.")}
    nested = {k.removeprefix("trend."): v for k, v in (skip or {}).items() if k.startswith("trend.")}
    sk = dataclasses.replace(SkipConfig(), **flat)
    if nested:
        sk = dataclasses.replace(sk, trend=dataclasses.replace(sk.trend, **nested))
    base = FilterGroupsConfig(enable=True, metric="acc", on_exhausted="train", skip=sk)
    return {
        "verl": dataclasses.replace(base, strategy="verl"),
        "default": base,
        "default_no_skip": dataclasses.replace(base, skip=SkipConfig(enable=False)),
        "default_no_carry_over": dataclasses.replace(base, carry_over=False),
        "default_fixed_rounds": dataclasses.replace(base, adaptive_rounds=False),
        "stream": dataclasses.replace(base, strategy="stream"),
    }


def _skip_override(text: str) -> tuple[str, Any]:
    """``--skip KEY=VALUE``: a ``skip.*`` key and its value (a JSON number or list, else a string)."""
    key, sep, raw = text.partition("=")
    fields = [f.name for f in dataclasses.fields(SkipConfig) if f.name != "trend"]
    fields += ["trend." + f.name for f in dataclasses.fields(TrendConfig)]
    if not sep or key not in fields:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected KEY=VALUE with KEY one of algorithm.filter_groups.skip.{{{','.join(fields)}}}"
        )
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return key, value


# the skip rule this project shipped first (Jeffreys' prior, fast decay toward it, no evidence
# bounds): on a pool larger than a few batches it stops visiting most prompts, which the
# simulator must be able to show (benchmarks and tests run it as ``--skip`` overrides)
FIRST_RULE: dict[str, Any] = {
    "rule": "posterior",
    "prior": [0.5, 0.5],
    "decay": 0.85,
    "threshold": 0.2,
    "min_evidence": 0.0,
    "max_evidence": 1e9,
}

LEARNABLE = 0.5  # true P(spread) at which a prompt counts as learnable (learnable_coverage)


class Stalled(RuntimeError):
    """A step drew more prompts (skipped ones included) than the simulator's pass limit."""


class _GuardedSource(ListSource):
    """The prompt source, counting the draws of the current step against ``limit`` (0: none)."""

    def __init__(self, rows: list[dict], seed: int, limit: int) -> None:
        super().__init__(rows, seed=seed)
        self.limit = limit
        self.step_draws = 0

    def take(self, k: int) -> list[dict]:
        self.step_draws += k
        if self.limit and self.step_draws > self.limit:
            raise Stalled(f"more than {self.limit} draws in one step")
        return super().take(k)


def simulate(
    cfg: FilterGroupsConfig,
    population: Population,
    *,
    steps: int = 200,
    train_batch_size: int = 32,
    gen_batch_size: int = 96,
    n: int = 8,
    seed: int = 0,
    warmup_steps: int | None = None,
    max_passes: float = 50.0,
    skip_policy: Callable[[DynamicBatcher, Population], SkipPolicy] | None = None,
) -> dict[str, Any]:
    """One strategy on a fresh copy of ``population`` (its training moves the copy only).

    ``skip_policy(batcher, population)``: a replacement for the batcher's skip policy, given the
    copy the run trains (a measurement can so compare the rule with one that knows the truth).

    A step that draws more than ``max_passes`` times the pool's size (skipped draws included;
    0: no limit) stops the strategy: it has stopped finding prompts worth rolling out and spins
    over its data (each draw is cheap, but not that cheap). ``stalled_at_step`` says where; the
    figures then cover the steps before it, and ``steps`` says how many."""
    warmup = steps // 3 if warmup_steps is None else warmup_steps
    pop = population.fresh()
    num = len(pop.logits)
    source = _GuardedSource(prompt_rows(num), seed, int(max_passes * num))
    batcher = DynamicBatcher(cfg, train_batch_size, gen_batch_size, n, seed)
    if skip_policy is not None:
        batcher.skip = skip_policy(batcher, pop)
    rollout = FakeRollout(n, bernoulli(lambda row: pop.prob(row["index"], batcher.version)), seed=seed + 1)
    keys = [
        "train/num_gen_batches",
        "dynamic_sampling/generated_groups",
        "dynamic_sampling/kept_groups",
        "dynamic_sampling/trained_groups",
        "dynamic_sampling/skipped_prompts",
        "dynamic_sampling/surplus_dropped",
        "dynamic_sampling/generated_response_tokens",
        "dynamic_sampling/trained_response_tokens",
        "dynamic_sampling/carried_in",
    ]
    tot = dict.fromkeys(keys, 0.0)
    warm = dict.fromkeys(keys, 0.0)
    stale_sum = 0.0
    stale_max = 0.0
    skipped_steps = 0
    skipped_with_spread = 0.0
    rolled = np.zeros(num, dtype=bool)
    counts = np.zeros(num, dtype=np.int64)  # trained groups per prompt, the whole run
    trained_warm = np.zeros(num, dtype=bool)  # trained at least once after the warm-up
    learnable = np.zeros(num, dtype=bool)  # true P(spread) >= LEARNABLE at a step after the warm-up
    variance: list[float] = []
    # decode ticks (one token per sample per tick, every sequence in flight at once): a round
    # takes its longest response; strategy stream runs its groups on the fake engine clock
    stream = FakeGroupStream(rollout) if cfg.strategy == "stream" else None
    round_ticks = 0

    def generate(rows: list[dict]):
        nonlocal round_ticks
        b = rollout(rows)
        round_ticks += int(b.tensors["response_mask"].sum(-1).max().item())
        return b

    stalled = None
    done = 0
    for s in range(steps):
        if s >= warmup:
            learnable |= pop.spread_prob(n, batcher.version) >= LEARNABLE
        source.step_draws = 0
        try:
            step = batcher.next_batch(source, generate, stream=stream)
        except Stalled:
            stalled = s + 1
            break
        done = s + 1
        m = step.metrics
        for k in keys:
            tot[k] += m[k]
            if s >= warmup:
                warm[k] += m[k]
        skipped_with_spread += m.get(COV + "skipped_with_spread", 0.0)
        for g in step.group_records:
            if g["index"] is not None:
                rolled[int(g["index"])] = True
        if step.batch is None:
            skipped_steps += 1
            continue
        stale_sum += m["dynamic_sampling/staleness_mean"] * m["dynamic_sampling/trained_groups"]
        stale_max = max(stale_max, m["dynamic_sampling/staleness_max"])
        idx = np.asarray(step.batch.non_tensors["index"].tolist()[::n], dtype=np.int64)  # one per group
        if s >= warmup:
            p = 1.0 / (1.0 + np.exp(-pop.logit(batcher.version - 1)[idx]))
            variance.extend((p * (1.0 - p)).tolist())
            trained_warm[idx] = True
        np.add.at(counts, idx, 1)
        pop.train(idx)

    def ratio(a: float, b: float) -> float:
        return round(a / b, 4) if b else 0.0

    g, kept, trained = (
        "dynamic_sampling/generated_groups",
        "dynamic_sampling/kept_groups",
        "dynamic_sampling/trained_groups",
    )
    cov = coverage_metrics(
        rolled_out=int(rolled.sum()),
        trained_counts=counts.tolist(),
        skipped_with_spread=int(skipped_with_spread),
        pool_size=num,
    )
    return {
        "steps": done,
        "stalled_at_step": stalled,
        "skipped_steps": skipped_steps,
        "rounds_per_step": ratio(tot["train/num_gen_batches"], done),
        "generated_groups": int(tot[g]),
        "trained_groups": int(tot[trained]),
        "generated_groups_per_trained_group": ratio(tot[g], tot[trained]),
        "generated_groups_per_trained_group_warm": ratio(warm[g], warm[trained]),
        "qualified_ratio": ratio(warm[kept], warm[g]),
        "qualified_ratio_overall": ratio(tot[kept], tot[g]),
        "skipped_prompts": int(tot["dynamic_sampling/skipped_prompts"]),
        "skipped_prompts_per_step": ratio(tot["dynamic_sampling/skipped_prompts"], done),
        "surplus_dropped": int(tot["dynamic_sampling/surplus_dropped"]),
        "carried_in": int(tot["dynamic_sampling/carried_in"]),
        "staleness_mean": ratio(stale_sum, tot[trained]),
        "staleness_max": stale_max,
        "gen_tokens_per_train_token": ratio(
            tot["dynamic_sampling/generated_response_tokens"], tot["dynamic_sampling/trained_response_tokens"]
        ),
        "trained_prompts": int(trained_warm.sum()),
        "learnable_prompts": int(learnable.sum()),
        "learnable_coverage": ratio(float((learnable & trained_warm).sum()), float(learnable.sum())),
        "trained_reward_variance": round(float(np.mean(variance)), 4) if variance else 0.0,
        "decode_ticks_per_step": ratio(stream.clock if stream is not None else round_ticks, done),
        "epochs": source.epoch,
        "coverage": {k.removeprefix(COV): round(v, 4) for k, v in cov.items()},
        "no_spread_fraction_end": round(pop.no_spread_fraction(n, batcher.version), 4),
    }


def run_all(
    *,
    steps: int = 200,
    train_batch_size: int = 32,
    gen_batch_size: int = 96,
    n: int = 8,
    num_prompts: int = 4096,
    easy: float = 0.45,
    hard: float = 0.30,
    max_drift: float = 0.005,
    gain: tuple[float, float] = (0.05, 0.2),
    seed: int = 0,
    strategies: dict[str, FilterGroupsConfig] | None = None,
    max_passes: float = 50.0,
    saturation: float = 0.0,
) -> dict[str, Any]:
    pop = Population.synthetic(
        num_prompts, easy=easy, hard=hard, max_drift=max_drift, gain=gain, seed=seed, saturation=saturation
    )
    strategies = strategies or default_strategies()
    out = {
        name: simulate(
            cfg,
            pop,
            steps=steps,
            train_batch_size=train_batch_size,
            gen_batch_size=gen_batch_size,
            n=n,
            seed=seed,
            max_passes=max_passes,
        )
        for name, cfg in strategies.items()
    }
    return {
        "config": {
            "steps": steps,
            "warmup_steps": steps // 3,
            "train_batch_size": train_batch_size,
            "gen_batch_size": gen_batch_size,
            "n": n,
            "num_prompts": num_prompts,
            "easy_fraction": easy,
            "hard_fraction": hard,
            "max_drift": max_drift,
            "gain": list(gain),
            "saturation": saturation,
            "max_passes": max_passes,
            "seed": seed,
            "no_spread_fraction_start": round(pop.no_spread_fraction(n, 0), 4),
            "skip": dataclasses.asdict(strategies["default"].skip) if "default" in strategies else None,
        },
        "strategies": out,
    }


COLUMNS = [
    ("rounds/step", "rounds_per_step"),
    ("gen groups/trained", "generated_groups_per_trained_group"),
    ("qualified (warm)", "qualified_ratio"),
    ("qualified (all)", "qualified_ratio_overall"),
    ("learnable cov", "learnable_coverage"),
    ("trained prompts", "trained_prompts"),
    ("skipped prompts", "skipped_prompts"),
    ("surplus dropped", "surplus_dropped"),
    ("staleness max", "staleness_max"),
    ("gen tok/train tok", "gen_tokens_per_train_token"),
    ("reward var", "trained_reward_variance"),
    ("decode ticks/step", "decode_ticks_per_step"),
    ("rolled out", ("coverage", "rolled_out_prompts")),
    ("never rolled out", ("coverage", "never_rolled_out")),
    ("top10% share", ("coverage", "top10_trained_share")),
    ("skipped w/ spread", ("coverage", "skipped_with_spread")),
]


def format_table(result: dict[str, Any]) -> str:
    c = result["config"]
    lines = [
        f"dynamic sampling simulator: {c['num_prompts']} prompts, n={c['n']}, train_batch_size="
        f"{c['train_batch_size']}, gen_batch_size={c['gen_batch_size']}, {c['steps']} steps "
        f"(warm-up {c['warmup_steps']}), seed {c['seed']}",
        f"groups with no spread at the start: {c['no_spread_fraction_start']:.0%}; prompts drift "
        f"U(0, {c['max_drift']}) logits per update and U({c['gain'][0]}, {c['gain'][1]}) per trained group",
        "",
    ]
    name_w = max(len(k) for k in result["strategies"]) + 2
    header = "strategy".ljust(name_w) + "".join(h.rjust(max(len(h), 8) + 2) for h, _ in COLUMNS)
    lines += [header, "-" * len(header)]
    for name, f in result["strategies"].items():
        row = name.ljust(name_w)
        for h, k in COLUMNS:
            v = f[k[0]][k[1]] if isinstance(k, tuple) else f[k]
            s = f"{v:.3f}" if isinstance(v, float) and not float(v).is_integer() else str(int(v))
            row += s.rjust(max(len(h), 8) + 2)
        lines.append(row)
    stalled = [
        f"{k} at step {f['stalled_at_step']}" for k, f in result["strategies"].items() if f["stalled_at_step"]
    ]
    if stalled:
        lines += [
            "",
            f"stalled (more than {c['max_passes']:g} passes over the pool in one step; figures cover "
            "the steps before): " + ", ".join(stalled),
        ]
    return "\n".join(lines)


def _add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--steps", type=int, default=200, help="training steps per strategy (default 200)")
    p.add_argument("--train-batch-size", type=int, default=32)
    p.add_argument("--gen-batch-size", type=int, default=96)
    p.add_argument("--n", type=int, default=8, help="responses per prompt")
    p.add_argument("--num-prompts", type=int, default=4096)
    p.add_argument("--easy", type=float, default=0.45, help="fraction of nearly-always-solved prompts")
    p.add_argument("--hard", type=float, default=0.30, help="fraction of nearly-never-solved prompts")
    p.add_argument(
        "--drift", type=float, default=0.005, help="max logit drift per policy update (related training)"
    )
    p.add_argument(
        "--gain",
        type=float,
        nargs=2,
        default=[0.05, 0.2],
        metavar=("LOW", "HIGH"),
        help="logit gain per trained group of the prompt itself, U(LOW, HIGH)",
    )
    p.add_argument(
        "--saturation",
        type=float,
        default=0.0,
        metavar="S",
        help="> 0: a prompt's training effect saturates, gain * T becomes gain * T * S / (S + T) "
        "(a dynamic the trend rule's linear model does not have; default 0: linear)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--max-passes",
        type=float,
        default=50.0,
        help="stop a strategy whose step draws more than this many times the pool (0: no limit)",
    )
    p.add_argument(
        "--skip",
        type=_skip_override,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a skip.* key of the skipping strategies (repeatable), e.g. --skip threshold=0.1",
    )


def _run(args: argparse.Namespace) -> int:
    strategies = default_strategies(dict(args.skip))
    problems = validate(strategies["default"])
    if problems:
        raise ConfigError([f"--skip: {p}" for p in problems])
    result = run_all(
        steps=args.steps,
        train_batch_size=args.train_batch_size,
        gen_batch_size=args.gen_batch_size,
        n=args.n,
        num_prompts=args.num_prompts,
        easy=args.easy,
        hard=args.hard,
        max_drift=args.drift,
        gain=(args.gain[0], args.gain[1]),
        seed=args.seed,
        max_passes=args.max_passes,
        strategies=strategies,
        saturation=args.saturation,
    )
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(format_table(result))
    return 0


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``sampling`` to a ``dapo bench`` subparsers object; dispatch with ``args.func(args)``."""
    p = subparsers.add_parser(
        "sampling",
        help="simulate each dynamic-sampling strategy on a synthetic drifting population",
        description=__doc__.split("\n\n")[0],
    )
    _add_args(p)
    p.set_defaults(func=_run)
    return p
