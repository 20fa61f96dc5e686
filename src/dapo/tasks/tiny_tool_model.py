"""The tiny tool-using model for the ``tools`` preset: a tiny Qwen2 warm-started on the tool task.

Built on first use and cached under ``$DAPO_CACHE/models/tiny-tools-<fingerprint>/`` (the
fingerprint hashes the recipe below, so a changed recipe rebuilds). Its tokenizer is the
character tokenizer with the tool-aware template (:data:`dapo.tools.template.TOOL_CHAT_TEMPLATE`).
The warm start is a short supervised pass in two phases, like the arithmetic model's
(:mod:`dapo.model.tiny`): the skills are learnt from clean targets first, then the targets
become noisy.

* Clean phase (``CLEAN_FRACTION`` of the steps): easy sums are answered right; two-digit
  products are answered through the calculator ``CLEAN_CALL_RATE`` of the time (the call,
  then ``Answer: <tool result>``), otherwise with a near miss.
* Noisy phase: sums are right ``EASY_ACCURACY`` of the time; products use the calculator
  only ``CALL_RATE`` of the time, otherwise a near miss (often wrong, as a small model's
  mental product would be).
* Throughout, ``COPY_SHARE`` of the examples are copy drills: a product whose calculator
  call and tool message are context (loss mask 0) and whose only target is
  ``Answer: <tool result>``. They keep the copy reliable without teaching the model to call
  more often.

So the model starts knowing the hermes call format and copying a tool result reliably, but
calls on a minority of products; RL has to find from the reward alone that calling pays.
The loss covers assistant tokens only (tool messages are context, as in RL), and the copied
answer tokens get weight ``ANSWER_WEIGHT`` (a call is ~80 tokens of fixed text; the answer
that decides the reward is ~10).
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections.abc import Callable
from pathlib import Path

import torch

from dapo.tasks.build_progress import BuildProgress
from dapo.tools.calculator import CalculatorTool
from dapo.tools.parser import format_hermes_call
from dapo.tools.template import TOOL_CHAT_TEMPLATE, build_tool_tokenizer

TOOL_MODEL_NAME = "tiny-tools"
RECIPE_VERSION = 3  # bump when warm_start_example changes shape (3: tokenizer keeps spaces on reload)
CALL_RATE = 0.3  # share of products answered through the calculator (noisy phase)
CLEAN_CALL_RATE = 0.6  # the same in the clean phase, where the call and the copy are learnt
COPY_SHARE = 0.25  # share of products that are copy drills (call as context, copy trained)
# share of call examples whose tool message holds a random number instead of the product, so
# the answer must be read from the tool message (the model would otherwise recall train products)
RANDOM_RESULT_RATE = 0.5
# short copy drills per step (a tool message and its copy, nothing else): they make the copy
# mechanism appear within ~150 steps, where full conversations alone take many hundreds
SHORT_DRILLS = 64
ANSWER_WEIGHT = 4.0  # loss weight of the final-answer tokens relative to the call tokens
EASY_ACCURACY = 0.95
CLEAN_FRACTION = 0.5
SFT_STEPS = 500
SFT_BATCH = 32
SFT_LR = 3e-3
MAX_POSITIONS = 256


class ContextRenderer:
    """Context tokens exactly as the RL loop builds them (:class:`MultiTurnRollout` with the
    tokenizer as ``load_tokenizer`` reloads it from the model directory): the prompt with the
    tool line, and a tool message plus the next generation prompt. Targets (what the model
    generates) are encoded with the character tokenizer the model was built with."""

    def __init__(self, context_tokenizer, target_tokenizer=None):
        from types import SimpleNamespace

        from dapo.rollout.multiturn import MultiTurnRollout

        self.target = target_tokenizer or context_tokenizer
        engine = SimpleNamespace(pad_token_id=context_tokenizer.pad_token_id)
        self._loop = MultiTurnRollout(engine, context_tokenizer, [CalculatorTool()])

    def prompt(self, question: str) -> list[int]:
        return self._loop.prompt_ids({"raw_prompt": [{"role": "user", "content": question}]})

    def tool_message(self, text: str) -> list[int]:
        return self._loop.tool_message_ids([text])

    def generated(self, text: str) -> list[int]:
        return list(self.target(text, add_special_tokens=False)["input_ids"]) + [self.target.eos_token_id]


def warm_start_example(
    render: ContextRenderer, problem, rng: random.Random, clean: bool = False
) -> tuple[list[int], list[float]]:
    """(token ids, per-token loss weights) of one supervised conversation.

    Weights: 0 on the prompt and tool messages (context, and the call of a copy drill),
    1 on a generated call, ``ANSWER_WEIGHT`` on the final ``Answer: X`` turn.
    """
    from dapo.tasks.tiny_model import near_miss

    pieces: list[tuple[list[int], float]] = [(render.prompt(problem.question), 0.0)]
    hard = problem.tier == "hard"
    drill = hard and rng.random() < COPY_SHARE
    call_rate = CLEAN_CALL_RATE if clean else CALL_RATE
    if drill or (hard and rng.random() < call_rate):
        call = format_hermes_call("calculator", {"expression": problem.key})
        result = problem.answer if rng.random() >= RANDOM_RESULT_RATE else rng.randint(100, 9801)
        pieces += [
            (render.generated(call), 0.0 if drill else 1.0),
            (render.tool_message(str(result)), 0.0),
            (render.generated(f"Answer: {result}"), ANSWER_WEIGHT),
        ]
    else:
        right = not hard and (clean or rng.random() < EASY_ACCURACY)
        value = problem.answer if right else near_miss(problem.answer, rng)
        pieces.append((render.generated(f"Answer: {value}"), ANSWER_WEIGHT))
    ids: list[int] = []
    weights: list[float] = []
    for toks, w in pieces:
        ids += toks
        weights += [w] * len(toks)
    return ids, weights


def short_copy_drill(render: ContextRenderer, rng: random.Random) -> tuple[list[int], list[float]]:
    """End of a turn, a tool message with a random number, and ``Answer: <that number>`` (trained)."""
    value = rng.randint(0, 10 ** rng.randint(1, 4) - 1)
    pieces = [
        ([render.target.eos_token_id], 0.0),
        (render.tool_message(str(value)), 0.0),
        (render.generated(f"Answer: {value}"), 1.0),
    ]
    return [t for toks, _ in pieces for t in toks], [w for toks, w in pieces for _ in toks]


def _padded(batch: list[tuple[list[int], list[float]]], pad_id: int):
    width = max(len(ids) for ids, _ in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    weights = torch.zeros((len(batch), width), dtype=torch.float32)
    attn = torch.zeros((len(batch), width), dtype=torch.long)
    for i, (s, w) in enumerate(batch):
        ids[i, : len(s)] = torch.as_tensor(s)
        attn[i, : len(s)] = 1
        weights[i, : len(s)] = torch.as_tensor(w)
    return ids, weights, attn


def _weighted_nll(model, batch: list[tuple[list[int], list[float]]], pad_id: int) -> torch.Tensor:
    ids, weights, attn = _padded(batch, pad_id)
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
    nll = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none"
    ).view_as(ids[:, 1:])
    w = weights[:, 1:]
    return (nll * w).sum() / w.sum().clamp(min=1.0)


def _len(example: tuple[list[int], list[int]]) -> int:
    return len(example[0])


def recipe_fingerprint() -> str:
    from dapo.tasks.arithmetic_tools import KIND_WEIGHTS

    recipe = json.dumps(
        [
            RECIPE_VERSION,
            CALL_RATE,
            CLEAN_CALL_RATE,
            COPY_SHARE,
            RANDOM_RESULT_RATE,
            SHORT_DRILLS,
            ANSWER_WEIGHT,
            CLEAN_FRACTION,
            EASY_ACCURACY,
            SFT_STEPS,
            SFT_BATCH,
            SFT_LR,
            MAX_POSITIONS,
            KIND_WEIGHTS,
            TOOL_CHAT_TEMPLATE,
        ],
        sort_keys=True,
    )
    return hashlib.sha256(recipe.encode()).hexdigest()[:10]


def ensure_tiny_tool_model(log: Callable[[str], None] = print, force: bool = False) -> Path:
    """Path of the cached warm-started tool model, building it if absent."""
    from dapo.tasks.cache import ensure_model

    build = lambda tmp: build_tiny_tool_model(tmp, log=log)  # noqa: E731
    return ensure_model(TOOL_MODEL_NAME, recipe_fingerprint(), build, log, force)


def build_tiny_tool_model(
    out_dir: Path, seed: int = 0, steps: int = SFT_STEPS, log: Callable[[str], None] = print
) -> dict:
    from transformers import Qwen2ForCausalLM

    from dapo.actor.optim import sft_optimizer, sft_step
    from dapo.model.loader import load_tokenizer
    from dapo.model.tiny import tiny_config
    from dapo.tasks.arithmetic import split_problems
    from dapo.tasks.arithmetic_tools import tool_problems

    torch.manual_seed(seed)
    rng = random.Random(seed)
    tok = build_tool_tokenizer()
    config = tiny_config(len(tok), tok.pad_token_id, tok.eos_token_id)
    config.max_position_embeddings = MAX_POSITIONS
    # the RL loop renders context with the tokenizer as load_tokenizer reloads it from the model
    # directory (its class follows config.json); the warm start trains on exactly those tokens
    config.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    render = ContextRenderer(load_tokenizer(out_dir), tok)
    model = Qwen2ForCausalLM(config)
    train, _ = split_problems(seed=0)
    pool = tool_problems(train, 20000, seed + 5)
    opt, sched = sft_optimizer(model, SFT_LR, steps, warmup=30)
    model.train()
    t0 = time.time()
    progress = BuildProgress("tool warm start", steps, log)
    for step in range(steps):
        # examples of similar length share a batch (calls are ~2.5x longer), so little is padding
        clean = step < CLEAN_FRACTION * steps
        batch = sorted(
            (warm_start_example(render, rng.choice(pool), rng, clean) for _ in range(SFT_BATCH * 2)), key=_len
        )
        batch = batch[:SFT_BATCH] if step % 2 else batch[SFT_BATCH:]
        loss = _weighted_nll(model, batch, tok.pad_token_id)
        if SHORT_DRILLS:
            drills = [short_copy_drill(render, rng) for _ in range(SHORT_DRILLS)]
            loss = loss + _weighted_nll(model, drills, tok.pad_token_id)
        sft_step(model, loss, opt, sched)
        progress.step(step + 1, loss.item)
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    return {
        "seed": seed,
        "steps": steps,
        "batch": SFT_BATCH,
        "call_rate": CALL_RATE,
        "clean_call_rate": CLEAN_CALL_RATE,
        "copy_share": COPY_SHARE,
        "random_result_rate": RANDOM_RESULT_RATE,
        "short_drills": SHORT_DRILLS,
        "seconds": round(time.time() - t0, 1),
    }
