"""The tiny model for the ``reasoning`` preset, warm-started on the long-reasoning task.

Built on first use and cached under ``$DAPO_CACHE/models/tiny-reasoning-<fingerprint>/`` (the
fingerprint hashes the recipe below). Same character tokenizer and Qwen2 shape family as the
arithmetic model (:mod:`dapo.model.tiny`), with room for ~300 tokens.

The warm start teaches the format and the procedure, and leaves the sampled accuracy to RL:
every target writes one numbered line per operation and ends ``Answer: X``. A clean phase
(right results) comes first so the procedure is learnt; in the noisy phase that follows, a
line's result is right with the probability of its kind (``STEP_ACCURACY``: plain lines always,
carries and borrows 0.9, lines with three-digit values 0.75), and a wrong line is a near miss
that the following lines carry forward, as a model that slipped would. The model so writes the
right working greedily but slips at temperature 1 where a line carries, borrows or crosses 100:
it starts solving easy chains about half the time and hard ones rarely, and RL raises its
sampled accuracy by making those lines surer. Plain lines are kept exact on purpose: a model
unsure on every line (an earlier recipe, plain lines right 0.99 of the time and under-trained)
spreads its doubt over all ~200 tokens of a response, and a policy-gradient step from 64 prompts x
8 responses then lowered its accuracy instead of raising it. In the noisy phase ``RAMBLE_RATE`` of
the targets re-check a few lines before answering, which runs into the overlong buffer of the
preset (so overlong shaping has something to shape). The warm start never sees the task's test
questions.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import Qwen2ForCausalLM

from dapo.actor.optim import sft_optimizer, sft_step
from dapo.model.tiny import tiny_config
from dapo.model.tokenizer import build_char_tokenizer
from dapo.tasks.build_progress import BuildProgress
from dapo.tasks.cache import ensure_model
from dapo.tasks.reasoning import (
    SEED,
    TEST_SIZE,
    TIER_WEIGHTS,
    TRAIN_SIZE,
    Chain,
    apply,
    make_chains,
    split_chains,
    step_line,
    working,
)
from dapo.tasks.tiny_model import HD32, sft_tensors

MODEL_NAME = "tiny-reasoning"
# probability that a warm-start line's result is right, by kind of step (noisy phase)
STEP_ACCURACY = {"plain": 1.0, "wrap": 0.9, "big": 0.75, "mul": 0.5}
RAMBLE_RATE = 0.15
CLEAN_FRACTION = 0.6
SFT_STEPS = 1200
SFT_BATCH = 32
SFT_LR = 3e-3
MODEL_SIZES = dict(
    hidden_size=96, num_hidden_layers=4, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2
)
MAX_POSITIONS = 352
WARM_START_CHAINS = 3000
# the long-tail variant's share of chains of 1 to 16 operations
LONGTAIL_SHARE = 0.25


def step_kind(before: int, op: str, after: int) -> str:
    if op == "*":
        return "mul"
    if before > 99 or after > 99:
        return "big"
    return "wrap" if before // 10 != after // 10 else "plain"


def near_miss(value: int, rng: random.Random) -> int:
    """A plausible slip: off by one or by ten."""
    return value + rng.choice((-1, 1, -10, 10))


def noisy_values(chain: Chain, rng: random.Random, clean: bool) -> list[int]:
    """Running values as a fallible model writes them: each line right with its kind's
    probability (always when ``clean``), errors carried forward."""
    out, v = [], chain.start
    for op, x in chain.ops:
        right = apply(v, op, x)
        kind = step_kind(v, op, right)
        p = 1.0 if clean else STEP_ACCURACY[kind]
        v = right if rng.random() < p else near_miss(right, rng)
        out.append(v)
    return out


def warm_start_target(chain: Chain, rng: random.Random, clean: bool = False) -> str:
    """A supervised target: the working (right when ``clean``, else slipping at the kinds'
    rates), re-checking a few lines before the answer in ``RAMBLE_RATE`` of the noisy ones."""
    values = noisy_values(chain, rng, clean)
    text = working(chain, values)
    if not clean and rng.random() < RAMBLE_RATE:
        # re-check a few lines before answering: longer, same answer
        head, answer = text.rsplit("Answer: ", 1)
        befores = [chain.start, *values[:-1]]
        picks = sorted(rng.sample(range(len(chain.ops)), k=min(len(chain.ops), rng.randint(3, 6))))
        check = "".join(
            "check " + step_line(i + 1, befores[i], chain.ops[i][0], chain.ops[i][1], values[i])
            for i in picks
        )
        text = f"{head}{check}Answer: {answer}"
    return text


def model_sizes(config: dict[str, Any] | None = None) -> dict[str, Any]:
    return {**MODEL_SIZES, **(config or {})}


def recipe_fingerprint(config: dict[str, Any] | None = None, longtail: bool = False) -> str:
    recipe = json.dumps(
        {
            "config": tiny_config(
                128, 0, 2, max_position_embeddings=MAX_POSITIONS, **model_sizes(config)
            ).to_dict(),
            "sft": [
                SFT_STEPS,
                SFT_BATCH,
                SFT_LR,
                CLEAN_FRACTION,
                STEP_ACCURACY,
                RAMBLE_RATE,
                WARM_START_CHAINS,
                *(["longtail", LONGTAIL_SHARE] if longtail else []),
            ],
            "task": [TIER_WEIGHTS, working(make_chains(3, 0)[0])],
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(recipe.encode()).hexdigest()[:10]


def ensure_reasoning_model(log: Callable[[str], None] = print, force: bool = False) -> Path:
    """Path of the cached warm-started reasoning model, building it if absent."""
    build = lambda tmp: build_reasoning_model(tmp, log=log)  # noqa: E731
    return ensure_model(MODEL_NAME, recipe_fingerprint(), build, log, force)


def ensure_reasoning_model_hd32(log: Callable[[str], None] = print, force: bool = False) -> Path:
    """The same recipe with head size 32, for vLLM on a CPU (``actor_rollout_ref.rollout.name=vllm``)."""
    build = lambda tmp: build_reasoning_model(tmp, log=log, config=HD32)  # noqa: E731
    return ensure_model(MODEL_NAME + "-hd32", recipe_fingerprint(HD32), build, log, force)


def ensure_longtail_model_hd32(log: Callable[[str], None] = print, force: bool = False) -> Path:
    """The head-32 model warm-started also on chains of 1 to 16 operations (``LONGTAIL_SHARE`` of
    its chains), for ``data.builtin_task=reasoning_longtail`` with vLLM: the reasoning model
    itself saw chains of 9 to 12 operations only and writes that much working whatever the chain."""
    build = lambda tmp: build_reasoning_model(tmp, log=log, config=HD32, longtail=True)  # noqa: E731
    return ensure_model(
        MODEL_NAME + "-longtail-hd32", recipe_fingerprint(HD32, longtail=True), build, log, force
    )


def warm_start_chains(seed: int) -> list[Chain]:
    """The warm start's own chains (another seed than the task's), never a test question of the task."""
    test = {c.question for c in split_chains(TRAIN_SIZE, TEST_SIZE, SEED)[1]}
    return [c for c in make_chains(WARM_START_CHAINS, seed + 1000) if c.question not in test]


def longtail_warm_start_chains(seed: int) -> list[Chain]:
    """``warm_start_chains`` with ``LONGTAIL_SHARE`` of them replaced by long-tail blocks (chains
    of 1 to 16 operations) of their own seed, none a question of the ``reasoning_longtail`` task."""
    from dapo.tasks.reasoning import LONGTAIL_STEPS, longtail_chains, longtail_split

    train, test = longtail_split()
    task = {c.question for c in train + test}
    normal = [c for c in warm_start_chains(seed) if c.question not in task]
    blocks = int(WARM_START_CHAINS * LONGTAIL_SHARE) // len(LONGTAIL_STEPS)
    tail = longtail_chains(blocks, seed + 2000, task | {c.question for c in normal})
    mixed = normal[: WARM_START_CHAINS - len(tail)] + tail
    random.Random(seed + 3000).shuffle(mixed)
    return mixed


def build_reasoning_model(
    out_dir: Path,
    seed: int = 0,
    steps: int = SFT_STEPS,
    log: Callable[[str], None] = print,
    config: dict[str, Any] | None = None,
    longtail: bool = False,
) -> dict:
    """``config``: changes to the model config (``tiny_config``'s keyword arguments);
    ``longtail``: warm-start on :func:`longtail_warm_start_chains`."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    tok = build_char_tokenizer()
    config = tiny_config(
        len(tok),
        tok.pad_token_id,
        tok.eos_token_id,
        max_position_embeddings=MAX_POSITIONS,
        **model_sizes(config),
    )
    model = Qwen2ForCausalLM(config)
    chains = longtail_warm_start_chains(seed) if longtail else warm_start_chains(seed)
    opt, sched = sft_optimizer(model, SFT_LR, steps, warmup=20)
    model.train()
    t0 = time.time()
    progress = BuildProgress("warm start", steps, log)
    for step in range(steps):
        clean = step < CLEAN_FRACTION * steps
        batch = rng.sample(chains, SFT_BATCH)
        ids, labels, attn = sft_tensors(tok, [(c.question, warm_start_target(c, rng, clean)) for c in batch])
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        sft_step(model, loss, opt, sched)
        progress.step(step + 1, loss.item)
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    return {"seed": seed, "steps": steps, "batch": SFT_BATCH, "seconds": round(time.time() - t0, 1)}
