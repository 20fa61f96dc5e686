"""Does one policy-gradient step raise a model's sampled accuracy? A probe of the landscape RL
meets on the long-reasoning task.

Samples ``--prompts`` training chains x ``--n`` responses from the model at ``--temperature``,
grades them with math_dapo (+1 / -1), takes GRPO advantages (group mean and std) and the
token-mean policy-gradient loss, and backpropagates it once. Then, for each step size ``s`` in
``--sizes``, it moves a copy of the model

* along the gradient, by ``s`` in parameter-space norm (``grad``);
* by ``s * 1e-3`` per parameter in the sign of the gradient, what Adam's first steps do (``sign``);
* in a random Gaussian direction, ``s * 1e-3`` per parameter in root mean square (``random``):
  the same size as the sign step, so it shows what a step of that size costs when its
  direction carries no information;

and prints each copy's sampled accuracy on the task's test chains (``--eval-n`` samples each,
the same seed for every copy) and the sign step's norm (``s * 1e-3 * sqrt(parameters)``, about
0.65 s for the preset's model). One gradient estimate and one evaluation seed: differences of
about 0.02 are within the sampling noise of 512 graded responses.

    .venv/bin/python benchmarks/pg_step_probe.py [--model DIR] [--prompts 64] [--sizes 0.03 0.1 0.3]
"""

from __future__ import annotations

import argparse
import copy
import random

import torch
from reasoning_start import generate, load
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from dapo.actor.forward import response_logprobs
from dapo.reward.scorers.math_dapo import compute_score
from dapo.rollout.hf import RolloutOutput
from dapo.tasks.reasoning import SEED, TEST_SIZE, TRAIN_SIZE, Chain, split_chains


def sample(
    model: PreTrainedModel,
    tok: PreTrainedTokenizerBase,
    chains: list[Chain],
    n: int,
    temperature: float,
    seed: int,
    length: int,
) -> tuple[RolloutOutput, torch.Tensor]:
    """Responses of ``n`` samples per chain and their scores (+1 / -1)."""
    out, texts = generate(model, tok, chains, n, temperature, seed, length)
    scores = [compute_score(t, str(chains[i // n].answer))["score"] for i, t in enumerate(texts)]
    return out, torch.tensor(scores)


def policy_gradient(
    model: PreTrainedModel,
    tok: PreTrainedTokenizerBase,
    out: RolloutOutput,
    scores: torch.Tensor,
    n: int,
    temperature: float,
) -> dict[str, torch.Tensor]:
    """Gradient of the token-mean GRPO loss (advantages normalised by each group's std)."""
    r = scores.view(-1, n)
    adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-6)).view(-1, 1)
    ids = torch.cat([out.prompts, out.responses], 1)
    attn = torch.cat([(out.prompts != tok.pad_token_id).long(), out.response_mask], 1)
    mask = out.response_mask.float()
    model = copy.deepcopy(model).train()
    for s in range(0, ids.shape[0], 64):
        lp, _ = response_logprobs(
            model, ids[s : s + 64], attn[s : s + 64], out.responses.shape[1], temperature
        )
        (-(lp * adv[s : s + 64] * mask[s : s + 64]).sum() / mask.sum()).backward()
    return {k: p.grad.detach().clone() for k, p in model.named_parameters()}


def moved(model: PreTrainedModel, delta: dict[str, torch.Tensor]) -> PreTrainedModel:
    m = copy.deepcopy(model)
    with torch.no_grad():
        for k, p in m.named_parameters():
            p.add_(delta[k])
    return m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--model", default=None, help="model directory (default: the reasoning preset's warm start)"
    )
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--eval-n", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--response-length", type=int, default=256)
    ap.add_argument(
        "--sizes", type=float, nargs="+", default=[0.03, 0.1, 0.3], help="step sizes s (see above)"
    )
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    path, base, tok = load(args.model)
    train, test = split_chains(TRAIN_SIZE, TEST_SIZE, SEED)
    chains = random.Random(args.seed).sample(train, args.prompts)

    def accuracy(m: PreTrainedModel) -> float:
        _, s = sample(m, tok, test, args.eval_n, args.temperature, 123, args.response_length)
        return (s > 0).float().mean().item()

    out, scores = sample(base, tok, chains, args.n, args.temperature, args.seed, args.response_length)
    spread = int((scores.view(-1, args.n).std(1) > 0).sum())
    grad = policy_gradient(base, tok, out, scores, args.n, args.temperature)
    norm = torch.sqrt(sum((g**2).sum() for g in grad.values())).item()
    gen = torch.Generator().manual_seed(args.seed)
    noise = {k: torch.randn(g.shape, generator=gen) for k, g in grad.items()}
    print(f"model {path}")
    acc = (scores > 0).float().mean()
    print(f"batch: {args.prompts} prompts x {args.n}, accuracy {acc:.3f}, {spread} groups with spread")
    print(f"gradient norm {norm:.4f}; test accuracy before any step {accuracy(base):.3f}")
    params = sum(g.numel() for g in grad.values())
    print(f"sign and random steps have norm {1e-3 * params**0.5:.2f} s")
    print(f"{'s':>6} {'grad':>6} {'sign':>6} {'random':>6}")
    for s in args.sizes:
        along = accuracy(moved(base, {k: -s * g / norm for k, g in grad.items()}))
        sign = accuracy(moved(base, {k: -s * 1e-3 * torch.sign(g) for k, g in grad.items()}))
        rand = accuracy(moved(base, {k: s * 1e-3 * z for k, z in noise.items()}))
        print(f"{s:>6} {along:>6.3f} {sign:>6.3f} {rand:>6.3f}", flush=True)


if __name__ == "__main__":
    main()
