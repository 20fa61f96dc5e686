"""The batcher's outputs, pinned: every strategy and the main options, driven with the fakes, give
the same step metrics, group records, round reports, warnings, batches and checkpoint state as
when the digests were taken. Restructuring the batcher must leave these digests alone; a
deliberate change of behaviour (the skip rule, the pool, the metrics) updates them in the same
commit and says why.

Each case runs enough steps to skip prompts, carry groups over, drop stale or re-checked ones and
(where configured) exhaust the round budget; the test also checks that those paths were taken,
so a digest cannot silently pin a run that never reached them.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable

import numpy as np
import pytest
import torch

from dapo.checkpoint import store as checkpoint
from dapo.config.sampling import AdaptiveThresholdConfig, FilterGroupsConfig, SkipConfig
from dapo.sampling import DynamicBatcher, GenerationBudgetExhausted
from dapo.sampling.fakes import FakeGroupStream, FakeRollout, ListSource, bernoulli, prompt_rows
from dapo.sampling.simulate import FIRST_RULE

torch.set_num_threads(1)
P = "dynamic_sampling/"
PROMPTS = 48


def _base_probs() -> dict[int, float]:
    """A third of the prompts solved, a sixth unsolvable, the rest in between."""
    rng = np.random.default_rng(11)
    out = {}
    for i in range(PROMPTS):
        out[i] = 1.0 if i % 3 == 0 else 0.0 if i % 6 == 1 else float(rng.uniform(0.15, 0.85))
    return out


BASE = _base_probs()


def _prob(index: int, version: int) -> float:
    """Drifting with training, so prompts get solved and carried groups go out of date."""
    return float(min(1.0, max(0.0, BASE[index] + 0.04 * version)))


def cfg(**kw) -> FilterGroupsConfig:
    base = {"enable": True, "metric": "acc", "skip": POSTERIOR}
    base.update(kw)
    return FilterGroupsConfig(**base)


# the skip rule before faded evidence meant "roll it out" (Jeffreys' prior, fast decay, no minimum
# evidence): on these 48 prompts it is what takes the stream cases down their re-check and
# surplus-drop paths
OLD_SKIP = FIRST_RULE
# the posterior rule, the default before the trend rule: the default_* cases were pinned with it
# and keep it, so their digests still pin the batcher's other paths unchanged; the *_trend cases
# pin the trend rule (the default now)
POSTERIOR = SkipConfig(rule="posterior")

# name -> (config, train_batch_size, gen_batch_size, n, steps, next_batch options)
CASES: dict[str, tuple] = {
    "default_posterior": (cfg(skip=SkipConfig(rule="posterior", recheck=0.3)), 4, 12, 4, 16, {}),
    "default_trend": (cfg(skip=SkipConfig(recheck=0.3)), 4, 12, 4, 16, {}),
    "default_streak": (
        cfg(skip=SkipConfig(rule="streak", init_prob=0.6, revisit_epochs=2.0)),
        4,
        12,
        4,
        16,
        {},
    ),
    "default_no_carry": (cfg(carry_over=False, adaptive_rounds=False), 4, 10, 4, 12, {}),
    "default_band_adaptive": (
        cfg(
            filter_rule="band",
            band=[0.2, 0.8],
            adaptive_threshold=AdaptiveThresholdConfig(enable=True, target=0.4, rate=0.2),
            max_staleness=2,
        ),
        4,
        12,
        4,
        14,
        {},
    ),
    "default_exhausted_train": (
        cfg(max_num_gen_batches=2, on_exhausted="train", adaptive_rounds=False),
        6,
        5,
        4,
        12,
        {},
    ),
    "default_exhausted_skip": (cfg(max_num_gen_batches=1, on_exhausted="skip"), 6, 6, 4, 12, {}),
    "default_prefetch_lag": (cfg(max_staleness=2, metric="seq_reward"), 3, 12, 4, 12, {"lag": 1}),
    "verl": (cfg(strategy="verl", max_num_gen_batches=3, on_exhausted="train"), 6, 6, 4, 12, {}),
    "verl_skip": (cfg(strategy="verl", max_num_gen_batches=1, on_exhausted="skip"), 4, 5, 4, 8, {}),
    "unfiltered": (FilterGroupsConfig(enable=False), 4, 6, 4, 6, {}),
    "stream_posterior": (
        cfg(strategy="stream", skip=SkipConfig(recheck=0.2, **OLD_SKIP)),
        4,
        8,
        4,
        14,
        {"stream": True},
    ),
    "stream_trend": (cfg(strategy="stream", skip=SkipConfig(recheck=0.3)), 4, 8, 4, 14, {"stream": True}),
    "stream_streak_budget": (
        cfg(strategy="stream", max_num_gen_batches=1, skip=SkipConfig(rule="streak", init_prob=0.6)),
        5,
        6,
        4,
        12,
        {"stream": True},
    ),
    "stream_fixed_rounds": (
        cfg(
            strategy="stream",
            adaptive_rounds=False,
            carry_over=False,
            max_num_gen_batches=3,
            skip=SkipConfig(**OLD_SKIP),
        ),
        4,
        6,
        4,
        10,
        {"stream": True},
    ),
}

# which paths each case must take (metric summed over the run > 0)
EXERCISED = {
    "default_posterior": ("skipped_prompts", "carried_in", "recheck_dropped", "filtered_all_correct"),
    "default_trend": ("skipped_prompts", "carried_in", "recheck_dropped", "filtered_all_wrong"),
    "default_streak": ("skipped_prompts", "carried_in", "stale_dropped", "surplus_dropped"),
    "default_no_carry": ("skipped_prompts", "surplus_dropped"),
    "default_band_adaptive": ("filtered_out_of_band", "carried_in", "skipped_prompts"),
    "default_exhausted_train": ("partial_step", "skipped_prompts"),
    "default_exhausted_skip": ("skipped_step", "carried_in"),
    "default_prefetch_lag": ("carried_in", "shaped_metric_slip", "stale_dropped"),
    "verl": ("partial_step", "surplus_dropped", "filtered_all_wrong"),
    "verl_skip": ("skipped_step",),
    "unfiltered": ("trained_groups",),
    "stream_posterior": ("skipped_prompts", "drained_groups", "carried_in", "recheck_dropped"),
    "stream_trend": ("skipped_prompts", "drained_groups", "carried_in"),
    "stream_streak_budget": ("skipped_prompts", "partial_step", "skipped_step"),
    "stream_fixed_rounds": ("drained_groups", "surplus_dropped"),
}

PINNED = {
    "default_posterior": "0e5ce7e7a901d670",
    "default_trend": "b2ef5cfdabd174c3",
    "default_streak": "0b228ea9f6fbb0b6",
    "default_no_carry": "cc83916fdce25532",
    "default_band_adaptive": "2f9e7ca6ee0e3760",
    "default_exhausted_train": "d2a97f7924091d7e",
    "default_exhausted_skip": "f33cf86246294c12",
    "default_prefetch_lag": "c64af7e558b6069f",
    "verl": "fe573b52c0503c4a",
    "verl_skip": "0ef2fa6aeefcb323",
    "unfiltered": "732472a24e392969",
    "stream_posterior": "6e1ebd04949dd8f1",
    "stream_trend": "c361bc0e25bf61c6",
    "stream_streak_budget": "814dc336a561eea6",
    "stream_fixed_rounds": "576726a36da6012b",
    "errors": "6c0138550a8dc8a3",
}

# cases resumed from a checkpointed state mid-run (the resumed run must match the unbroken one)
RESUMED = (
    "default_posterior",
    "default_trend",
    "default_streak",
    "default_band_adaptive",
    "stream_posterior",
    "stream_trend",
)


def canon(x):
    """Plain JSON-able form with exact floats (repr) and tensors by dtype, shape and bytes."""
    if isinstance(x, torch.Tensor):
        t = x.detach().cpu().contiguous()
        return {
            "dtype": str(t.dtype),
            "shape": list(t.shape),
            "sha": hashlib.sha256(t.numpy().tobytes()).hexdigest(),
        }
    if isinstance(x, np.ndarray):
        return canon(x.tolist())
    if isinstance(x, np.generic):
        return [type(x).__name__, canon(x.item())]
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return x
    if isinstance(x, int):
        return ["int", x]
    if isinstance(x, float):
        return ["float", repr(x)]
    if isinstance(x, dict):
        return [[str(k), canon(v)] for k, v in x.items()]  # insertion order is part of the output
    if isinstance(x, list | tuple):
        return [canon(v) for v in x]
    raise TypeError(f"cannot pin {type(x).__name__}")


def step_record(s, infos: list[dict]) -> dict:
    b = s.batch
    return {
        "action": s.action,
        "metrics": canon(s.metrics),
        "groups": canon(s.group_records),
        "rounds": canon(infos),
        "batch": None
        if b is None
        else {
            # a batch's column order is not part of its content
            "non_tensors": canon({k: b.non_tensors[k].tolist() for k in sorted(b.non_tensors)}),
            "tensors": canon({k: b.tensors[k] for k in sorted(b.tensors)}),
        },
    }


class Run:
    """One batcher with its prompt source, fake rollout (and fake engine) and a log of warnings."""

    def __init__(self, name: str) -> None:
        c, B, Bg, n, self.steps, self.opts = CASES[name]
        self.b = DynamicBatcher(c, B, Bg, n, seed=5)
        self.src = ListSource(prompt_rows(PROMPTS), seed=3)
        self.gen = FakeRollout(
            n, bernoulli(lambda r: _prob(r["index"], self.b.version)), seed=7, overlong_penalty=0.5
        )

    def step(self) -> dict:
        infos: list[dict] = []
        kw = {"lag": self.opts.get("lag", 0) if self.b.calls else 0, "on_round": infos.append}
        if self.opts.get("stream"):
            s = self.b.next_batch(self.src, None, stream=FakeGroupStream(self.gen), **kw)
        else:
            s = self.b.next_batch(self.src, self.gen, **kw)
        return step_record(s, infos) | {"_metrics": s.metrics}

    def checkpoint(self) -> tuple[dict, str]:
        """The batcher's state as a checkpoint writes it (tensors apart, the rest through JSON)."""
        tensors: dict = {}
        plain = checkpoint._extract(self.b.state_dict(), {}, tensors, "")
        text = json.dumps(plain)
        state = checkpoint._insert(json.loads(text), {}, tensors)
        saved = (state, self.src.state_dict(), self.gen.rng.bit_generator.state)
        # the key order of a pooled batch's columns comes from a set (Batch.concat); all else is pinned
        for g in plain["pool"]:
            g["batch"] = {part: dict(sorted(cols.items())) for part, cols in g["batch"].items()}
        return saved, json.dumps(plain) + json.dumps(canon(dict(sorted(tensors.items()))))

    def restore(self, saved) -> None:
        state, src_state, rng_state = saved
        self.b.load_state_dict(state)
        self.src.load_state_dict(src_state)
        self.gen.rng.bit_generator.state = rng_state


class Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _capture(fn: Callable[[], list]) -> tuple[list, list[str]]:
    h = Warnings()
    logger = logging.getLogger("dapo.sampling")
    logger.addHandler(h)
    try:
        return fn(), h.messages
    finally:
        logger.removeHandler(h)


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj).encode()).hexdigest()[:16]


def _strip(rec: dict) -> dict:
    return {k: v for k, v in rec.items() if k != "_metrics"}


def run_case(name: str) -> tuple[list[dict], list[str], list[str]]:
    """Every step's record, the warnings, and the checkpoint text at mid-run (resumed cases)."""
    run = Run(name)
    mid = run.steps // 2
    texts: list[str] = []

    def go() -> list[dict]:
        out = []
        for i in range(run.steps):
            if i == mid and name in RESUMED:
                saved, text = run.checkpoint()
                texts.append(text)
                rest = [run.step() for _ in range(run.steps - mid)]
                resumed = Run(name)
                resumed.restore(saved)
                again = [resumed.step() for _ in range(run.steps - mid)]
                assert [_strip(r) for r in again] == [_strip(r) for r in rest], "resume diverged"
                return out + rest
            out.append(run.step())
        return out

    records, warned = _capture(go)
    return records, warned, texts


@pytest.mark.parametrize("name", sorted(CASES))
def test_batcher_outputs_are_pinned(name):
    records, warned, texts = run_case(name)
    totals = {k: sum(r["_metrics"].get(P + k, 0) for r in records) for k in EXERCISED[name]}
    assert all(v > 0 for v in totals.values()), f"{name}: a path was not taken: {totals}"
    got = _digest([[_strip(r) for r in records], warned, texts])
    assert got == PINNED[name], f"{name}: batcher outputs changed: {got} (pinned {PINNED[name]})"


def test_budget_errors_are_pinned():
    hard = bernoulli(lambda r: 0.0)
    messages = []
    for strategy in ("default", "verl", "stream"):
        b = DynamicBatcher(cfg(strategy=strategy, max_num_gen_batches=2, on_exhausted="error"), 4, 4, 2, 0)
        src, gen = ListSource(prompt_rows(PROMPTS), seed=1), FakeRollout(2, hard, seed=2)
        stream = FakeGroupStream(gen) if strategy == "stream" else None
        with pytest.raises(GenerationBudgetExhausted) as e:
            b.next_batch(src, gen, stream=stream)
        messages.append(str(e.value))
    got = _digest(messages)
    assert got == PINNED["errors"], f"budget errors changed: {got} (pinned {PINNED['errors']})"
