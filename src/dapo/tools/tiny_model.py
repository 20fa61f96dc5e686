"""The tiny tool-using model for the ``tools`` preset: a tiny Qwen2 warm-started on the tool task.

Built on first use and cached under ``$DAPO_CACHE/models/tiny-tools-<fingerprint>/``. Its
tokenizer is the character tokenizer with the tool-aware template
(:data:`dapo.tools.template.TOOL_CHAT_TEMPLATE`). The warm start is a short supervised pass:

* easy sums are answered directly (``Answer: X``), right most of the time;
* two-digit products are answered with a calculator call, then ``Answer: <tool result>``,
  only ``CALL_RATE`` of the time; otherwise with a direct answer that is a near miss.

So the model starts knowing the hermes call format and how to use a tool result, but calls
rarely; RL has to find from the reward alone that calling on products pays.
The loss covers assistant tokens only (tool messages are context, as in RL).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from dapo.tools.calculator import CalculatorTool
from dapo.tools.parser import format_hermes_call
from dapo.tools.template import TOOL_CHAT_TEMPLATE, build_tool_tokenizer

TOOL_MODEL_NAME = "tiny-tools"
CALL_RATE = 0.4  # share of warm-start products answered through the calculator
EASY_ACCURACY = 0.95
SFT_STEPS = 600
SFT_BATCH = 32
SFT_LR = 3e-3
MAX_POSITIONS = 256


def _schemas() -> list[dict]:
    return [CalculatorTool().get_openai_tool_schema()]


def warm_start_example(tok, problem, rng: random.Random) -> tuple[list[int], list[int]]:
    """(token ids, loss mask) of one supervised conversation."""
    from dapo.model.tiny import near_miss

    msgs = [{"role": "user", "content": problem.question}]
    prompt = tok.apply_chat_template(msgs, tools=_schemas(), add_generation_prompt=True, tokenize=False)
    eos = tok.eos_token
    pieces: list[tuple[str, int]] = [(prompt, 0)]
    if problem.tier == "hard" and rng.random() < CALL_RATE:
        call = format_hermes_call("calculator", {"expression": problem.key})
        pieces += [(call + eos, 1), (f"<|tool|>{problem.answer}{eos}<|assistant|>", 0)]
        pieces.append((f"Answer: {problem.answer}{eos}", 1))
    else:
        right = problem.tier != "hard" and rng.random() < EASY_ACCURACY
        pieces.append((f"Answer: {problem.answer if right else near_miss(problem.answer, rng)}{eos}", 1))
    ids: list[int] = []
    mask: list[int] = []
    for text, m in pieces:
        t = tok(text, add_special_tokens=False)["input_ids"]
        ids += t
        mask += [m] * len(t)
    return ids, mask


def _len(example: tuple[list[int], list[int]]) -> int:
    return len(example[0])


def recipe_fingerprint() -> str:
    from dapo.data.builtin_tools import KIND_WEIGHTS

    recipe = json.dumps(
        [
            CALL_RATE,
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
    from dapo.model.tiny import cache_dir

    target = cache_dir() / "models" / f"{TOOL_MODEL_NAME}-{recipe_fingerprint()}"
    if (target / "config.json").exists() and (target / "dapo_warm_start.json").exists() and not force:
        return target
    log(f"building the tiny tool model (first use) into {target} ...")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{TOOL_MODEL_NAME}-", dir=target.parent))
    try:
        info = build_tiny_tool_model(tmp, log=log)
        (tmp / "dapo_warm_start.json").write_text(json.dumps(info, indent=2))
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def build_tiny_tool_model(
    out_dir: Path, seed: int = 0, steps: int = SFT_STEPS, log: Callable[[str], None] = print
) -> dict:
    from transformers import Qwen2ForCausalLM

    from dapo.data.builtin import split_problems
    from dapo.data.builtin_tools import tool_problems
    from dapo.model.tiny import tiny_config

    torch.manual_seed(seed)
    rng = random.Random(seed)
    tok = build_tool_tokenizer()
    config = tiny_config(len(tok), tok.pad_token_id, tok.eos_token_id)
    config.max_position_embeddings = MAX_POSITIONS
    model = Qwen2ForCausalLM(config)
    train, _ = split_problems(seed=0)
    pool = tool_problems(train, 20000, seed + 5)
    opt = torch.optim.AdamW(model.parameters(), lr=SFT_LR, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 30) * max(0.05, 1 - s / steps)
    )
    model.train()
    t0 = time.time()
    for step in range(steps):
        # examples of similar length share a batch (calls are ~2.5x longer), so little is padding
        batch = sorted(
            (warm_start_example(tok, rng.choice(pool), rng) for _ in range(SFT_BATCH * 2)), key=_len
        )
        batch = batch[:SFT_BATCH] if step % 2 else batch[SFT_BATCH:]
        width = max(len(ids) for ids, _ in batch)
        ids = torch.full((len(batch), width), tok.pad_token_id, dtype=torch.long)
        labels = torch.full((len(batch), width), -100, dtype=torch.long)
        attn = torch.zeros((len(batch), width), dtype=torch.long)
        for i, (s, m) in enumerate(batch):
            ids[i, : len(s)] = torch.as_tensor(s)
            attn[i, : len(s)] = 1
            lab = torch.as_tensor(s)
            lab[torch.as_tensor(m) == 0] = -100
            labels[i, : len(s)] = lab
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if (step + 1) % 50 == 0:
            log(f"  tool warm start step {step + 1}/{steps} loss {loss.item():.3f} ({time.time() - t0:.0f}s)")
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    return {
        "seed": seed,
        "steps": steps,
        "batch": SFT_BATCH,
        "call_rate": CALL_RATE,
        "seconds": round(time.time() - t0, 1),
    }
