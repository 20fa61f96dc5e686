"""Where a model starts on the long-reasoning task: solve rates per tier (sampled and greedy),
how often each kind of line is right in its samples, and how the solve rate spreads over chains.

A line counts as right when the value after ``=`` follows from the value the model wrote
before it on that line, so a slip is counted once and not again in the lines that carry it;
lines not in the working's form (``3)+8: 63+8=71``) are not counted. With ``--split train`` it
reads a task's training chains instead (``reasoning_sparse`` shares the ``reasoning`` task's
test chains; its training pool is where most chains are beyond reach), and the share of chains
with spread is the share of groups of ``--n`` that dynamic sampling would keep.

    .venv/bin/python benchmarks/reasoning_start.py [--task reasoning_sparse --split train] [--model DIR] \
        [--n 8] [--temperature 1.0]
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from dapo.model.loader import load_tokenizer
from dapo.reward.scorers.math_dapo import compute_score
from dapo.rollout.hf import HFRollout, RolloutOutput, SamplingParams
from dapo.tasks.reasoning import SEED, TEST_SIZE, TIERS, TRAIN_SIZE, Chain, apply, sparse_split, split_chains
from dapo.tasks.tiny_reasoning_model import step_kind

LINE = re.compile(r"\d+\)([+-])(\d+): (\d+)[+-]\d+=(\d+)$")


def prompt_ids(tok: PreTrainedTokenizerBase, chains: list[Chain]) -> list[list[int]]:
    """Each chain's question in the chat template, as the trainer encodes its prompts."""
    texts = [
        tok.apply_chat_template(
            [{"role": "user", "content": c.question}], add_generation_prompt=True, tokenize=False
        )
        for c in chains
    ]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def load(model_dir: str | None) -> tuple[str, PreTrainedModel, PreTrainedTokenizerBase]:
    """``model_dir`` (default: the reasoning preset's warm start, built on first use), its model
    and dapo's tokenizer for it."""
    from transformers import AutoModelForCausalLM

    from dapo.tasks.tiny_reasoning_model import ensure_reasoning_model

    path = model_dir or str(ensure_reasoning_model())
    return path, AutoModelForCausalLM.from_pretrained(path), load_tokenizer(path)


def generate(
    model: PreTrainedModel,
    tok: PreTrainedTokenizerBase,
    chains: list[Chain],
    n: int,
    temperature: float,
    seed: int,
    length: int,
    do_sample: bool = True,
) -> tuple[RolloutOutput, list[str]]:
    """``n`` responses per chain (chain j's are rows ``j*n .. j*n+n-1``) and their texts."""
    engine = HFRollout(model, [tok.eos_token_id], tok.pad_token_id, seed=seed)
    params = SamplingParams(n=n, temperature=temperature, do_sample=do_sample, response_length=length)
    out = engine.generate(prompt_ids(tok, chains), params)
    texts = [
        tok.decode(out.responses[i][out.response_mask[i].bool()], skip_special_tokens=True)
        for i in range(out.responses.shape[0])
    ]
    return out, texts


def line_kinds(text: str, hits: dict[str, list[bool]]) -> None:
    """Count each written line as right or wrong under its kind."""
    for line in text.split("\n"):
        m = LINE.match(line)
        if m:
            op, x, before, after = m[1], int(m[2]), int(m[3]), int(m[4])
            right = apply(before, op, x)
            hits[step_kind(before, op, right)].append(after == right)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--model", default=None, help="model directory (default: the reasoning preset's warm start)"
    )
    ap.add_argument("--task", choices=("reasoning", "reasoning_sparse"), default="reasoning")
    ap.add_argument("--split", choices=("test", "train"), default="test")
    ap.add_argument("--n", type=int, default=8, help="samples per chain")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--response-length", type=int, default=256)
    args = ap.parse_args()
    torch.set_num_threads(1)
    path, model, tok = load(args.model)
    train, test = (
        sparse_split() if args.task == "reasoning_sparse" else split_chains(TRAIN_SIZE, TEST_SIZE, SEED)
    )
    chains = train if args.split == "train" else test
    tiers = [t for t in TIERS if any(c.tier == t for c in chains)]
    print(f"model {path}; {len(chains)} {args.split} chains of {args.task}")
    for label, n, do_sample in (
        (f"temperature {args.temperature}, {args.n} samples", args.n, True),
        ("greedy", 1, False),
    ):
        _, texts = generate(model, tok, chains, n, args.temperature, 0, args.response_length, do_sample)
        solved: dict[str, list[float]] = defaultdict(list)
        hits: dict[str, list[bool]] = defaultdict(list)
        for j, chain in enumerate(chains):
            right = 0
            for text in texts[j * n : (j + 1) * n]:
                right += compute_score(text, str(chain.answer))["acc"]
                line_kinds(text, hits)
            solved[chain.tier].append(right / n)
        every = [r for t in tiers for r in solved[t]]
        print(
            f"\n{label}: solved "
            + ", ".join(f"{t} {sum(solved[t]) / len(solved[t]):.3f}" for t in tiers)
            + f", all {sum(every) / len(every):.3f}"
        )
        print(
            "  lines right: "
            + ", ".join(f"{k} {sum(v) / len(v):.3f} ({len(v)})" for k, v in sorted(hits.items()))
        )
        if n > 1:
            every_sample, no_sample = sum(r == 1 for r in every), sum(r == 0 for r in every)
            spread = 1 - (every_sample + no_sample) / len(every)
            print(
                f"  chains solved by every sample {every_sample}, by none {no_sample}; with spread {spread:.3f}"
            )
            for t in tiers:
                print(f"  {t:6s} solve rates " + " ".join(f"{r:.2f}" for r in sorted(solved[t])))


if __name__ == "__main__":
    main()
