"""``dapo bench sampling``: each dynamic-sampling strategy against a synthetic population.

The population: prompts with a latent solve logit; most are so easy or so hard that a group of
``n`` responses has no spread. "Training" raises every logit by a per-prompt drift after every
policy update, so hard prompts become learnable and medium prompts become easy, as they do in a
real run. Rollouts are fake (``dapo.sampling.fakes.FakeRollout``): each response is correct with
the prompt's current solve probability. Costs are counted in generated groups (one group = n
responses of one prompt) and generated response tokens.

Figures per strategy (``--json`` prints ``{"config": ..., "strategies": {name: figures}}``):
rounds per step, generated groups per trained group, qualified ratio (kept groups / generated
groups; ``qualified_ratio`` counts the steps after the warm-up, ``qualified_ratio_overall`` all
steps), skipped prompts, staleness of trained groups, surplus dropped, generated tokens per
trained token, decode ticks per step (a latency proxy: every sequence in flight decodes one
token per tick, so a round lasts as long as its longest response, and ``stream`` stops at the
tick its batch is full). The simulated policy improves at the same pace whatever it trains on, so the
simulator has no accuracy of its own; two figures stand in for what a sampler costs learning:
``trained_prompts`` (distinct prompts among the groups trained after the warm-up: how much of the
data set training sees) and ``trained_reward_variance`` (mean p(1-p) of those groups' prompts
under the policy that trains on them: the reward variance, i.e. the advantage signal, a group
carries).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from dapo.config.load import ConfigError
from dapo.config.sampling import FilterGroupsConfig, SkipConfig, validate
from dapo.sampling.batcher import DynamicBatcher
from dapo.sampling.fakes import FakeGroupStream, FakeRollout, ListSource, bernoulli, prompt_rows


@dataclass
class Population:
    """Solve probability of prompt i after ``step`` policy updates: sigmoid(logit_i + drift_i*step)."""

    logits: np.ndarray
    drift: np.ndarray

    @classmethod
    def synthetic(
        cls,
        num_prompts: int = 1024,
        *,
        easy: float = 0.45,
        hard: float = 0.30,
        max_drift: float = 0.05,
        seed: int = 0,
    ) -> Population:
        """``easy`` of the prompts are nearly always solved, ``hard`` nearly never, the rest in
        between; each drifts up by U(0, max_drift) logits per update."""
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
        return cls(logits, drift)

    def prob(self, index: int, step: int) -> float:
        return 1.0 / (1.0 + math.exp(-(self.logits[index] + self.drift[index] * step)))

    def no_spread_fraction(self, n: int, step: int) -> float:
        p = 1.0 / (1.0 + np.exp(-(self.logits + self.drift * step)))
        return float(np.mean(p**n + (1 - p) ** n))


def default_strategies(skip: dict[str, Any] | None = None) -> dict[str, FilterGroupsConfig]:
    """verl mode, ours and ours without each of its parts; ``skip`` overrides ``skip.*`` keys of
    every strategy that skips."""
    sk = dataclasses.replace(SkipConfig(), **(skip or {}))
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
    fields = [f.name for f in dataclasses.fields(SkipConfig)]
    if not sep or key not in fields:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected KEY=VALUE with KEY one of algorithm.filter_groups.skip.{{{','.join(fields)}}}"
        )
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return key, value


def simulate(
    cfg: FilterGroupsConfig,
    population: Population,
    *,
    steps: int = 60,
    train_batch_size: int = 32,
    gen_batch_size: int = 96,
    n: int = 8,
    seed: int = 0,
    warmup_steps: int | None = None,
) -> dict[str, Any]:
    warmup = steps // 3 if warmup_steps is None else warmup_steps
    num = len(population.logits)
    source = ListSource(prompt_rows(num), seed=seed)
    batcher = DynamicBatcher(cfg, train_batch_size, gen_batch_size, n, seed)
    rollout = FakeRollout(
        n, bernoulli(lambda row: population.prob(row["index"], batcher.version)), seed=seed + 1
    )
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
    trained_prompts: set[int] = set()
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

    for s in range(steps):
        step = batcher.next_batch(source, generate, stream=stream)
        m = step.metrics
        for k in keys:
            tot[k] += m[k]
            if s >= warmup:
                warm[k] += m[k]
        if step.batch is None:
            skipped_steps += 1
        else:
            stale_sum += m["dynamic_sampling/staleness_mean"] * m["dynamic_sampling/trained_groups"]
            stale_max = max(stale_max, m["dynamic_sampling/staleness_max"])
            if s >= warmup:
                for i in step.batch.non_tensors["index"]:  # n rows per group: a mean over groups
                    p = population.prob(int(i), batcher.version - 1)
                    variance.append(p * (1.0 - p))
                    trained_prompts.add(int(i))

    def ratio(a: float, b: float) -> float:
        return round(a / b, 4) if b else 0.0

    g, kept, trained = (
        "dynamic_sampling/generated_groups",
        "dynamic_sampling/kept_groups",
        "dynamic_sampling/trained_groups",
    )
    return {
        "steps": steps,
        "skipped_steps": skipped_steps,
        "rounds_per_step": ratio(tot["train/num_gen_batches"], steps),
        "generated_groups": int(tot[g]),
        "trained_groups": int(tot[trained]),
        "generated_groups_per_trained_group": ratio(tot[g], tot[trained]),
        "generated_groups_per_trained_group_warm": ratio(warm[g], warm[trained]),
        "qualified_ratio": ratio(warm[kept], warm[g]),
        "qualified_ratio_overall": ratio(tot[kept], tot[g]),
        "skipped_prompts": int(tot["dynamic_sampling/skipped_prompts"]),
        "skipped_prompts_per_step": ratio(tot["dynamic_sampling/skipped_prompts"], steps),
        "surplus_dropped": int(tot["dynamic_sampling/surplus_dropped"]),
        "carried_in": int(tot["dynamic_sampling/carried_in"]),
        "staleness_mean": ratio(stale_sum, tot[trained]),
        "staleness_max": stale_max,
        "gen_tokens_per_train_token": ratio(
            tot["dynamic_sampling/generated_response_tokens"], tot["dynamic_sampling/trained_response_tokens"]
        ),
        "trained_prompts": len(trained_prompts),
        "trained_reward_variance": round(float(np.mean(variance)), 4) if variance else 0.0,
        "decode_ticks_per_step": ratio(stream.clock if stream is not None else round_ticks, steps),
        "epochs": source.epoch,
    }


def run_all(
    *,
    steps: int = 60,
    train_batch_size: int = 32,
    gen_batch_size: int = 96,
    n: int = 8,
    num_prompts: int = 1024,
    easy: float = 0.45,
    hard: float = 0.30,
    seed: int = 0,
    strategies: dict[str, FilterGroupsConfig] | None = None,
) -> dict[str, Any]:
    pop = Population.synthetic(num_prompts, easy=easy, hard=hard, seed=seed)
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
            "seed": seed,
            "no_spread_fraction_start": round(pop.no_spread_fraction(n, 0), 4),
            "no_spread_fraction_end": round(pop.no_spread_fraction(n, steps), 4),
            "skip": dataclasses.asdict(strategies["default"].skip) if "default" in strategies else None,
        },
        "strategies": out,
    }


COLUMNS = [
    ("rounds/step", "rounds_per_step"),
    ("gen groups/trained", "generated_groups_per_trained_group"),
    ("qualified (warm)", "qualified_ratio"),
    ("qualified (all)", "qualified_ratio_overall"),
    ("skipped prompts", "skipped_prompts"),
    ("surplus dropped", "surplus_dropped"),
    ("staleness mean", "staleness_mean"),
    ("staleness max", "staleness_max"),
    ("gen tok/train tok", "gen_tokens_per_train_token"),
    ("trained prompts", "trained_prompts"),
    ("reward var", "trained_reward_variance"),
    ("decode ticks/step", "decode_ticks_per_step"),
]


def format_table(result: dict[str, Any]) -> str:
    c = result["config"]
    lines = [
        f"dynamic sampling simulator: {c['num_prompts']} prompts, n={c['n']}, train_batch_size="
        f"{c['train_batch_size']}, gen_batch_size={c['gen_batch_size']}, {c['steps']} steps "
        f"(warm-up {c['warmup_steps']}), seed {c['seed']}",
        f"groups with no spread: {c['no_spread_fraction_start']:.0%} at start, "
        f"{c['no_spread_fraction_end']:.0%} at the end",
        "",
    ]
    name_w = max(len(k) for k in result["strategies"]) + 2
    header = "strategy".ljust(name_w) + "".join(h.rjust(max(len(h), 8) + 2) for h, _ in COLUMNS)
    lines += [header, "-" * len(header)]
    for name, f in result["strategies"].items():
        row = name.ljust(name_w)
        for h, k in COLUMNS:
            v = f[k]
            s = f"{v:.3f}" if isinstance(v, float) and not float(v).is_integer() else str(int(v))
            row += s.rjust(max(len(h), 8) + 2)
        lines.append(row)
    return "\n".join(lines)


def _add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--steps", type=int, default=60, help="training steps per strategy (default 60)")
    p.add_argument("--train-batch-size", type=int, default=32)
    p.add_argument("--gen-batch-size", type=int, default=96)
    p.add_argument("--n", type=int, default=8, help="responses per prompt")
    p.add_argument("--num-prompts", type=int, default=1024)
    p.add_argument("--easy", type=float, default=0.45, help="fraction of nearly-always-solved prompts")
    p.add_argument("--hard", type=float, default=0.30, help="fraction of nearly-never-solved prompts")
    p.add_argument("--seed", type=int, default=0)
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
        seed=args.seed,
        strategies=strategies,
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
