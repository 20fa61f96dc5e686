"""The built-in default model: a tiny Qwen2 with a character tokenizer, warm-started on the task.

Built on first use and cached under ``$DAPO_CACHE`` (default ``~/.cache/dapo``) in
``models/tiny-arith-<fingerprint>/`` (the fingerprint hashes the recipe below, so a changed
recipe rebuilds), then reused. The warm start is a short supervised pass on the built-in
arithmetic task: the algorithm is learnt from clean targets first, then the targets become
noisy (right only part of the time, a near miss otherwise), and throughout only
``FORMAT_RATE`` of them use the graded ``Answer: X`` form. The model so starts like a
pretrained one: it knows roughly how to answer, spreads probability over candidate answers
and formats, and RL has to find the right answers and the right format from the reward alone.
"""

from __future__ import annotations

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
from dapo.tasks.arithmetic import TIER_WEIGHTS, Problem, split_problems
from dapo.tasks.build_progress import BuildProgress
from dapo.tasks.cache import ensure_model

TINY_NAME = "tiny-arith"
# Probability that a warm-start target is the right answer, by tier. Hard products are
# never shown right, so the model starts (and usually stays) unable to do them.
TARGET_ACCURACY = {"easy": 0.95, "medium": 0.5, "hard": 0.0}
# Share of warm-start targets in the graded "Answer: X" form; the rest use other forms that
# math_dapo scores as wrong, so RL must also learn the format.
FORMAT_RATE = 0.4
OTHER_FORMATS = ("The answer is {}.", "{}", "Result: {}")
SFT_STEPS = 800
CLEAN_FRACTION = 0.7
SFT_LR = 3e-3
SFT_BATCH = 128


def near_miss(answer: int, rng: random.Random) -> int:
    """A plausible wrong answer: off by one or ten, or two digits swapped."""
    kind = rng.random()
    if kind < 0.4:
        return answer + rng.choice((-1, 1))
    if kind < 0.8:
        return answer + rng.choice((-10, 10))
    s = str(abs(answer))
    if len(s) >= 2 and s[-1] != s[-2]:
        swapped = int(s[:-2] + s[-1] + s[-2])
        return -swapped if answer < 0 else swapped
    return answer + 2


def warm_start_target(p: Problem, rng: random.Random, clean: bool = False) -> str:
    """A supervised target: the answer (right or a near miss), in the graded format or not."""
    right = rng.random() < (1.0 if clean and p.tier != "hard" else TARGET_ACCURACY[p.tier])
    value = p.answer if right else near_miss(p.answer, rng)
    if rng.random() < FORMAT_RATE:
        return f"Answer: {value}"
    return rng.choice(OTHER_FORMATS).format(value)


# the same model with head size 32 (96 = 3 x 32), which vLLM's CPU attention accepts (24 it does not)
HD32 = {"num_attention_heads": 3, "num_key_value_heads": 1}


def recipe_fingerprint(config: dict[str, Any] | None = None) -> str:
    """A short hash of everything that shapes the built model, so a changed recipe rebuilds."""
    import hashlib

    from dapo.tasks import arithmetic

    recipe = json.dumps(
        {
            "config": tiny_config(128, 0, 2, **(config or {})).to_dict(),
            "sft": [
                SFT_STEPS,
                SFT_BATCH,
                SFT_LR,
                CLEAN_FRACTION,
                TARGET_ACCURACY,
                FORMAT_RATE,
                OTHER_FORMATS,
            ],
            "task": [arithmetic.TIER_WEIGHTS, Problem(12, "+", 3, "medium").question],
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(recipe.encode()).hexdigest()[:10]


def ensure_tiny_model(log: Callable[[str], None] = print, force: bool = False) -> Path:
    """Path of the cached warm-started tiny model, building it if absent."""
    return ensure_model(
        TINY_NAME, recipe_fingerprint(), lambda tmp: build_tiny_model(tmp, log=log), log, force
    )


def ensure_tiny_model_hd32(log: Callable[[str], None] = print, force: bool = False) -> Path:
    """The same recipe with head size 32, for vLLM on a CPU (``actor_rollout_ref.rollout.name=vllm``)."""
    return ensure_model(
        TINY_NAME + "-hd32",
        recipe_fingerprint(HD32),
        lambda tmp: build_tiny_model(tmp, log=log, config=HD32),
        log,
        force,
    )


def build_tiny_model(
    out_dir: Path,
    seed: int = 0,
    steps: int = SFT_STEPS,
    log: Callable[[str], None] = print,
    on_checkpoint: Callable[[int, Any, Any], None] | None = None,
    config: dict[str, Any] | None = None,
) -> dict:
    """``config``: changes to the model config (``tiny_config``'s keyword arguments)."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    tok = build_char_tokenizer()
    config = tiny_config(len(tok), tok.pad_token_id, tok.eos_token_id, **(config or {}))
    model = Qwen2ForCausalLM(config)
    train, _ = split_problems(seed=0)
    by_tier = {t: [p for p in train if p.tier == t] for t in TIER_WEIGHTS}
    tiers, weights = list(by_tier), [TIER_WEIGHTS[t] for t in by_tier]
    opt, sched = sft_optimizer(model, SFT_LR, steps, warmup=50)
    model.train()
    t0 = time.time()
    progress = BuildProgress("warm start", steps, log)
    for step in range(steps):
        probs = [rng.choice(by_tier[t]) for t in rng.choices(tiers, weights, k=SFT_BATCH)]
        # the algorithm is learnt from clean targets first; the noisy tail spreads the answers
        ids, labels, attn = _sft_batch(tok, probs, rng, clean=step < CLEAN_FRACTION * steps)
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        sft_step(model, loss, opt, sched)
        progress.step(step + 1, loss.item)
        if on_checkpoint is not None and (step + 1) % 200 == 0:
            on_checkpoint(step + 1, model, tok)
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    return {
        "seed": seed,
        "steps": steps,
        "batch": SFT_BATCH,
        "target_accuracy": TARGET_ACCURACY,
        "seconds": round(time.time() - t0, 1),
    }


def _sft_batch(tok, problems: list[Problem], rng: random.Random, clean: bool = False):
    return sft_tensors(tok, [(p.question, warm_start_target(p, rng, clean)) for p in problems])


def sft_tensors(tok, pairs: list[tuple[str, str]]):
    """``(input_ids, labels, attention_mask)`` for ``(question, target)`` pairs: the chat prompt
    of each question followed by its target and EOS, the loss on the target and EOS only."""
    seqs, prompt_lens = [], []
    for question, target in pairs:
        prompt = tok.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
        )
        ids = tok(prompt + target + tok.eos_token, add_special_tokens=False)["input_ids"]
        seqs.append(ids)
        prompt_lens.append(len(tok(prompt, add_special_tokens=False)["input_ids"]))
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), tok.pad_token_id, dtype=torch.long)
    labels = torch.full((len(seqs), width), -100, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, (s, pl) in enumerate(zip(seqs, prompt_lens)):
        ids[i, : len(s)] = torch.as_tensor(s)
        attn[i, : len(s)] = 1
        labels[i, pl : len(s)] = torch.as_tensor(s[pl:])
    return ids, labels, attn
