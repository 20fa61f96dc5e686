"""Reward managers: decode responses, score them safely, shape overlong ones, place the reward.

``DAPORewardManager`` follows verl's ``dapo`` manager (docs/verl_compat.md, Rewards);
``NaiveRewardManager`` is the same without overlong shaping (verl's ``naive``). Calling a
manager on a :class:`dapo.batch.Batch` returns ``(token_level_scores, reward_extra_info)``
(a :class:`RewardOutput`, which also carries ``.metrics``).

Safe scoring (``reward_model.scoring.mode``, the schema's ``ScoringConfig``):

* ``auto`` (default): the built-in scorers that only run bounded regexes on capped text
  (math_dapo / arithmetic / aime*, gsm8k, countdown; see
  ``dapo.reward.scorers.INLINE_SAFE_SOURCES``) are scored in the trainer process, costing
  microseconds; every other scorer (the symbolic MATH verifier, any custom reward
  function) runs in worker processes with a per-sample wall-clock timeout.
* ``process``: everything runs in worker processes.
* ``inline``: everything runs in the trainer process: fastest, no hang protection.

``step_timeout_s`` bounds one call's scoring in worker processes: what has no result by then
is a timeout. By default (``auto``) the budget grows with the work, :func:`step_budget_s`.
``memory_limit_mb`` caps each worker's address space.

A failed sample (exception, timeout, dead worker) gets ``failure_score`` (default -1.0,
no better than a wrong math_dapo answer, so a policy cannot profit from breaking the
verifier), ``acc=False`` and ``pred="[TIMEOUT]"`` / ``"[ERROR]"``, and is counted in the
metrics ``reward/timeouts`` and ``reward/errors`` (worker deaths count as errors and also
in ``reward/worker_deaths``). An unknown ``data_source`` is a configuration error and
raises instead.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from dapo.config.schema import OverlongBufferConfig, ScoringConfig
from dapo.config.validate import overlong_problems, scoring_problems
from dapo.reward.pool import CONFIG, DIED, OK, TIMEOUT, ScorerRef, ScoringPool, call_scorer
from dapo.reward.scorers import UnknownDataSourceError, is_inline_safe

log = logging.getLogger(__name__)

_BUILTIN = ScorerRef.builtin()


RESERVED_OBJECTIVE_NAMES = ("score", "acc", "pred", "overlong", "overlong_reward")


def _as_block(value: Any, cls: type) -> Any:
    """The schema's block ``cls`` (the manager's settings); verl hands it over as a DictConfig."""
    if value is None or isinstance(value, cls):
        return value
    return cls(**dict(value))


def step_budget_s(scoring: ScoringConfig, worker_samples: int) -> float | None:
    """Seconds one scoring call may spend in worker processes (None: no bound), for
    ``worker_samples`` samples sent to workers (one per response and reward function):
    ``reward_model.scoring.step_timeout_s`` when it is a number, no bound for 0 or null, and for
    ``auto`` ``max(step_timeout_min_s, step_timeout_per_sample_s * worker_samples)``."""
    budget = scoring.step_timeout_s
    if budget == "auto":
        return max(
            float(scoring.step_timeout_min_s), float(scoring.step_timeout_per_sample_s) * worker_samples
        )
    if budget is None or float(budget) <= 0:
        return None
    return float(budget)


def objective_name_problems(names: Sequence[str]) -> list[str]:
    """Objective names must be unique, non-empty, without '/', and not a reserved reward key
    (the rule of ``reward_model.objectives``, checked by the config pipeline)."""
    bad = [n for n in names if not n or n in RESERVED_OBJECTIVE_NAMES or "/" in n]
    if bad or len(set(names)) != len(names):
        return [
            f"reward_model.objectives: names must be unique, non-empty, without '/', and not one of "
            f"{sorted(RESERVED_OBJECTIVE_NAMES)}; got {list(names)}"
        ]
    return []


@dataclass
class RewardObjective:
    """One reward function of a (possibly multi-objective) reward.

    ``compute_score`` is a :class:`ScorerRef`, a module-level function, or None for the
    built-in ``default_compute_score``. Its result's ``score`` (or the number it returns)
    is weighted by ``weight`` and summed with the other objectives.
    """

    name: str
    compute_score: ScorerRef | Callable[..., Any] | None = None
    weight: float = 1.0
    reward_kwargs: dict[str, Any] = field(default_factory=dict)


class RewardOutput(tuple):
    """``(token_level_scores, reward_extra_info)`` that also carries ``.metrics``."""

    metrics: dict[str, float]

    def __new__(
        cls, token_level_scores: torch.Tensor, reward_extra_info: dict, metrics: dict
    ) -> RewardOutput:
        out = super().__new__(cls, (token_level_scores, reward_extra_info))
        out.metrics = metrics
        return out

    @property
    def token_level_scores(self) -> torch.Tensor:
        return self[0]

    @property
    def reward_extra_info(self) -> dict[str, list]:
        return self[1]


def validate_overlong(cfg: OverlongBufferConfig | None, max_resp_len: int | None) -> None:
    """verl's rules (``dapo.config.validate.overlong_problems``), for a manager built directly."""
    if cfg is None or not cfg.enable:
        return
    if max_resp_len is None:
        raise ValueError(
            "reward_model.reward_kwargs.max_resp_len (default: data.max_response_length) must be set when "
            "reward_model.overlong_buffer.enable=True"
        )
    problems = overlong_problems(cfg, max_resp_len, "reward_model.reward_kwargs.max_resp_len")
    if problems:
        raise ValueError(problems[0])


class _ObjectiveScorer:
    """Scores a list of samples for one objective, inline or in the pool, never raising on scorer faults."""

    def __init__(self, objective: RewardObjective, config: ScoringConfig, pool: Callable[[], ScoringPool]):
        self.objective = objective
        self.config = config
        self._pool = pool
        target = objective.compute_score
        kwargs = dict(objective.reward_kwargs)
        self.fn: Callable[..., Any] | None = None
        if target is None:
            self.ref: ScorerRef | None = ScorerRef(
                **{**_BUILTIN.__dict__, "kwargs": tuple(sorted(kwargs.items()))}
            )
        elif isinstance(target, ScorerRef):
            merged = {**target.reward_kwargs, **kwargs}
            self.ref = ScorerRef(**{**target.__dict__, "kwargs": tuple(sorted(merged.items()))})
        else:
            self.fn = target
            self.ref = ScorerRef.from_callable(target, kwargs)
            if self.ref is not None and self.ref.module == _BUILTIN.module and self.ref.attr == _BUILTIN.attr:
                self.ref = ScorerRef(**{**self.ref.__dict__, "preload": _BUILTIN.preload})
            if self.ref is None:
                if config.mode == "process":
                    raise ValueError(
                        f"reward objective {objective.name!r}: reward_model.scoring.mode=process needs a reward "
                        "function importable by name (a module-level function or custom_reward_function.path); "
                        f"got {target!r}"
                    )
                log.warning(
                    "reward function %r cannot be re-imported in a worker process (lambda, closure or __main__); "
                    "it runs in the trainer process without a timeout",
                    target,
                )
        self.is_builtin = (
            self.ref is not None and self.ref.module == _BUILTIN.module and self.ref.attr == _BUILTIN.attr
        )
        self._inline_fn: Callable[..., Any] | None = self.fn

    def _inline(self, sample: dict[str, Any]) -> bool:
        if self.ref is None or self.config.mode == "inline":
            return True
        return self.config.mode == "auto" and self.is_builtin and is_inline_safe(sample["data_source"])

    def worker_samples(self, samples: list[dict[str, Any]]) -> int:
        """How many of ``samples`` this objective scores in worker processes."""
        return sum(not self._inline(s) for s in samples)

    def score(
        self, samples: list[dict[str, Any]], counts: dict[str, int], deadline: float | None = None
    ) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any] | None] = [None] * len(samples)
        inline_idx = [i for i in range(len(samples)) if self._inline(samples[i])]
        pool_idx = [i for i in range(len(samples)) if not self._inline(samples[i])]
        if inline_idx:
            fn = self._inline_fn
            if fn is None:
                fn = self._inline_fn = self.ref.load()  # type: ignore[union-attr]
            kwargs = self.ref.reward_kwargs if self.ref is not None else dict(self.objective.reward_kwargs)
            for i in inline_idx:
                try:
                    out[i] = (OK, call_scorer(fn, samples[i], kwargs))
                except UnknownDataSourceError:
                    raise
                except Exception as exc:
                    out[i] = ("error", f"{type(exc).__name__}: {exc}")
        if pool_idx:
            pool = self._pool()
            before = pool.restarts
            results = pool.map(self.ref, [samples[i] for i in pool_idx], deadline)  # type: ignore[arg-type]
            counts["worker_restarts"] += pool.restarts - before
            for i, res in zip(pool_idx, results):
                if res[0] == CONFIG:
                    raise UnknownDataSourceError(res[1])
                out[i] = res
        for status, _ in out:  # type: ignore[misc]
            if status == TIMEOUT:
                counts["timeouts"] += 1
            elif status != OK:
                counts["errors"] += 1
                if status == DIED:
                    counts["worker_deaths"] += 1
        return out  # type: ignore[return-value]


def _failure_result(status: str, failure_score: float) -> dict[str, Any]:
    return {
        "score": float(failure_score),
        "acc": False,
        "pred": "[TIMEOUT]" if status == TIMEOUT else "[ERROR]",
    }


def _as_float(value: Any) -> float:
    if isinstance(value, torch.Tensor):
        return float(value.item())
    return float(value)


class DAPORewardManager:
    """verl's DAPO reward manager with safe scoring and optional multi-objective rewards.

    Args:
        tokenizer: decodes ``responses`` (``decode(ids, skip_special_tokens=True)``, ``eos_token``).
        compute_score: a reward function (verl keyword signature), a :class:`ScorerRef`, or
            None for the built-in ``default_compute_score``. Ignored when ``objectives`` is given.
        reward_fn_key: the non-tensor column that names the data source (``data.reward_fn_key``).
        max_resp_len: the response budget the overlong penalty is measured against.
        overlong_buffer_cfg: ``reward_model.overlong_buffer`` (the schema's dataclass, or a mapping
            of its keys as verl passes it).
        objectives: a list of :class:`RewardObjective`; their weighted scores are summed. Each
            objective's raw score is in ``reward_extra_info[<name>]`` (so a filter metric may
            name it) and its mean in the metric ``reward/<name>/mean``.
        scoring: ``reward_model.scoring`` (the schema's ``ScoringConfig``, or a mapping of its keys)
            for isolation, timeout and failure score.
        reward_kwargs: extra keyword arguments for ``compute_score`` (``custom_reward_function.reward_kwargs``).
        num_examine: print this many decoded samples per data source on each call.
    """

    apply_overlong = True

    def __init__(
        self,
        tokenizer: Any,
        compute_score: ScorerRef | Callable[..., Any] | None = None,
        reward_fn_key: str = "data_source",
        max_resp_len: int | None = None,
        overlong_buffer_cfg: Any = None,
        *,
        objectives: Sequence[RewardObjective] | None = None,
        scoring: ScoringConfig | Mapping[str, Any] | None = None,
        reward_kwargs: Mapping[str, Any] | None = None,
        num_examine: int = 0,
    ) -> None:
        self.tokenizer = tokenizer
        self.reward_fn_key = reward_fn_key
        self.max_resp_len = max_resp_len
        self.overlong_buffer_cfg = (
            _as_block(overlong_buffer_cfg, OverlongBufferConfig) if self.apply_overlong else None
        )
        validate_overlong(self.overlong_buffer_cfg, max_resp_len)
        scoring = _as_block(scoring, ScoringConfig) or ScoringConfig()
        problems = scoring_problems(scoring)
        if problems:
            raise ValueError(problems[0])
        self.scoring = scoring
        self.num_examine = num_examine
        self.multi_objective = bool(objectives)
        if objectives:
            problems = objective_name_problems([o.name for o in objectives])
            if problems:
                raise ValueError(problems[0])
            self.objectives = list(objectives)
        else:
            self.objectives = [RewardObjective("score", compute_score, 1.0, dict(reward_kwargs or {}))]
        self._pool: ScoringPool | None = None
        self._scorers = [_ObjectiveScorer(o, scoring, self._get_pool) for o in self.objectives]
        self.last_metrics: dict[str, float] = {}

    # -- pool lifecycle --------------------------------------------------------------------
    def _get_pool(self) -> ScoringPool:
        if self._pool is None:
            self._pool = ScoringPool(
                num_workers=self.scoring.num_workers,
                timeout_s=self.scoring.timeout_s,
                memory_limit_mb=self.scoring.memory_limit_mb,
            )
        return self._pool

    def close(self) -> None:
        """Stop the scoring worker processes (they also stop at interpreter exit)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __enter__(self) -> DAPORewardManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- scoring ---------------------------------------------------------------------------
    def _valid_lengths(self, batch: Any) -> torch.Tensor:
        responses = batch["responses"]
        R = responses.shape[1]
        if "attention_mask" in batch and "prompts" in batch:
            attn = batch["attention_mask"]
            P = batch["prompts"].shape[1]
            if attn.shape[1] == P + R:
                return attn[:, P:].sum(-1).long()
        if "response_mask" in batch:
            mask = batch["response_mask"].bool()
            positions = torch.arange(1, R + 1, device=mask.device).expand_as(mask)
            return (positions * mask).max(-1).values.long()
        return torch.full((responses.shape[0],), R, dtype=torch.long)

    def _decode(self, ids: list[int]) -> str:
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        eos = getattr(self.tokenizer, "eos_token", None)
        if eos and text.endswith(eos):
            text = text[: -len(eos)]
        return text

    def _samples(self, batch: Any, lengths: torch.Tensor) -> list[dict[str, Any]]:
        if self.reward_fn_key not in batch.non_tensors:
            raise KeyError(
                f"data.reward_fn_key={self.reward_fn_key!r}: the batch has no such column "
                f"(columns: {sorted(batch.non_tensors)})"
            )
        sources = batch.non_tensors[self.reward_fn_key]
        reward_model = batch.non_tensors.get("reward_model")
        extra = batch.non_tensors.get("extra_info")
        responses = batch["responses"].tolist()
        samples = []
        for i in range(len(sources)):
            rm = reward_model[i] if reward_model is not None else None
            if not isinstance(rm, Mapping) or "ground_truth" not in rm:
                raise KeyError(f"row {i}: reward_model.ground_truth is missing (reward_model={rm!r})")
            info = extra[i] if extra is not None else None
            samples.append(
                {
                    "data_source": sources[i],
                    "solution_str": self._decode(responses[i][: int(lengths[i])]),
                    "ground_truth": rm["ground_truth"],
                    "extra_info": dict(info) if isinstance(info, Mapping) else {},
                }
            )
        return samples

    def __call__(self, batch: Any) -> RewardOutput:
        t0, start = time.perf_counter(), time.monotonic()
        lengths = self._valid_lengths(batch)
        samples = self._samples(batch, lengths)
        n = len(samples)
        budget = step_budget_s(self.scoring, sum(s.worker_samples(samples) for s in self._scorers))
        # the budget starts with the call: decoding the responses is part of scoring them
        deadline = None if budget is None else start + budget
        counts = {"timeouts": 0, "errors": 0, "worker_deaths": 0, "worker_restarts": 0}
        per_objective = [scorer.score(samples, counts, deadline) for scorer in self._scorers]
        failure = self.scoring.failure_score

        rows: list[dict[str, Any]] = []
        objective_scores: dict[str, list[float]] = {o.name: [] for o in self.objectives}
        for i in range(n):
            row: dict[str, Any] = {}
            combined = 0.0
            for k, (objective, results) in enumerate(zip(self.objectives, per_objective)):
                status, value = results[i]
                result = value if status == OK else _failure_result(status, failure)
                if isinstance(result, Mapping):
                    score = _as_float(result["score"])
                    fields = dict(result)
                else:
                    score = _as_float(result)
                    fields = {"score": score, "acc": score}
                objective_scores[objective.name].append(score)
                combined += objective.weight * score
                if not self.multi_objective:
                    row.update(fields)
                    continue
                row[objective.name] = score
                for key, val in fields.items():
                    if key != "score":
                        row[f"{objective.name}/{key}"] = val
                if k == 0:
                    row["acc"] = fields.get("acc", score)
                    if "pred" in fields:
                        row["pred"] = fields["pred"]
            if self.multi_objective:
                row["score"] = combined
            rows.append(row)

        keys: list[str] = []
        for row in rows:
            keys.extend(k for k in row if k not in keys)
        reward_extra_info: dict[str, list] = {k: [row.get(k) for row in rows] for k in keys}

        responses = batch["responses"]
        scores = torch.zeros(responses.shape, dtype=torch.float32)
        cfg = self.overlong_buffer_cfg
        overlong_rewards, overlong_flags = [], []
        for i, row in enumerate(rows):
            reward = _as_float(row["score"])
            if cfg is not None and cfg.enable:
                expected_len = self.max_resp_len - cfg.len  # type: ignore[operator]
                exceed_len = int(lengths[i]) - expected_len
                overlong_reward = min(-exceed_len / cfg.len * cfg.penalty_factor, 0.0)
                reward += overlong_reward
                overlong_rewards.append(overlong_reward)
                overlong_flags.append(overlong_reward < 0)
            scores[i, max(int(lengths[i]) - 1, 0)] = reward
        if cfg is not None and cfg.enable and cfg.log:
            reward_extra_info["overlong_reward"] = overlong_rewards
            reward_extra_info["overlong"] = overlong_flags

        metrics: dict[str, float] = {
            "reward/timeouts": float(counts["timeouts"]),
            "reward/errors": float(counts["errors"]),
            "reward/worker_deaths": float(counts["worker_deaths"]),
            "reward/worker_restarts": float(counts["worker_restarts"]),
            "reward/scoring_time_s": time.perf_counter() - t0,
        }
        if self.multi_objective:
            for name, vals in objective_scores.items():
                metrics[f"reward/{name}/mean"] = float(np.mean(vals)) if vals else 0.0
        if counts["timeouts"] or counts["errors"]:
            log.warning(
                "reward scoring: %d timeouts, %d errors in %d samples (scored %s)",
                counts["timeouts"],
                counts["errors"],
                n,
                failure,
            )
        self._examine(samples, reward_extra_info)
        self.last_metrics = metrics
        return RewardOutput(scores, reward_extra_info, metrics)

    def _examine(self, samples: list[dict[str, Any]], info: dict[str, list]) -> None:
        if self.num_examine <= 0:
            return
        printed: dict[Any, int] = {}
        for i, s in enumerate(samples):
            ds = s["data_source"]
            if printed.get(ds, 0) >= self.num_examine:
                continue
            printed[ds] = printed.get(ds, 0) + 1
            print("[response]", s["solution_str"])
            print("[ground_truth]", s["ground_truth"])
            for key, vals in info.items():
                print(f"[{key}]", vals[i])


class NaiveRewardManager(DAPORewardManager):
    """verl's ``naive`` manager: the same scoring and placement, no overlong shaping."""

    apply_overlong = False

    def __init__(
        self, tokenizer: Any, compute_score: Any = None, reward_fn_key: str = "data_source", **kwargs: Any
    ):
        kwargs.pop("overlong_buffer_cfg", None)
        super().__init__(tokenizer, compute_score, reward_fn_key, **kwargs)


REWARD_MANAGERS = {"dapo": DAPORewardManager, "naive": NaiveRewardManager}
