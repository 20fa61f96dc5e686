"""Entropy in float32 against a float64 reference, and what the max shift costs.

    PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/entropy_precision.py [--rows 64] [--vocab 32768]

For four kinds of float32 logits at four magnitudes it prints the largest absolute error of
three entropies against the float64 value of the same logits: dapo's (``entropy_from_logits``:
``-sum p log p`` on ``z - max z``), the same without the shift, and verl's
``logsumexp(z) - sum softmax(z) * z``. Then the time of the shifted forward over the
unshifted one, as a ratio of interleaved runs.
"""

from __future__ import annotations

import argparse
import time

import torch

from dapo.algo.entropy import entropy_from_logits


def unshifted(z: torch.Tensor) -> torch.Tensor:
    log_p = z - torch.logsumexp(z, dim=-1, keepdim=True)
    return -(log_p.exp() * log_p).sum(-1)


def shifted(z: torch.Tensor) -> torch.Tensor:
    z = z - z.amax(dim=-1, keepdim=True)
    log_p = z - torch.logsumexp(z, dim=-1, keepdim=True)
    return -(log_p.exp() * log_p).sum(-1)


def verl_form(z: torch.Tensor) -> torch.Tensor:
    return torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(-1)


def kinds(rows: int, vocab: int) -> dict:
    return {
        "randn*m": lambda m: torch.randn(rows, vocab) * m,
        "randn*2+m": lambda m: torch.randn(rows, vocab) * 2 + m,
        "uniform(-m,m)": lambda m: (torch.rand(rows, vocab) * 2 - 1) * m,
        "one logit m": lambda m: torch.cat(
            [torch.full((rows, 1), float(m)), torch.randn(rows, vocab - 1)], 1
        ),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    torch.manual_seed(0)
    print(f"max |H - H_float64| over {args.rows} rows x {args.vocab} vocab, float32 logits")
    print(f"{'logits':14s} {'m':>4s} {'mean H':>9s} {'dapo':>9s} {'no shift':>9s} {'verl':>9s}")
    for name, make in kinds(args.rows, args.vocab).items():
        for m in (1, 10, 35, 100):
            z = make(m)
            ref = entropy_from_logits(z.double())

            def err(h: torch.Tensor, ref: torch.Tensor = ref) -> float:
                return (h.double() - ref).abs().max().item()

            print(
                f"{name:14s} {m:4d} {ref.mean().item():9.3g} {err(entropy_from_logits(z)):9.2e} "
                f"{err(unshifted(z)):9.2e} {err(verl_form(z)):9.2e}"
            )
    z = torch.randn(args.rows, args.vocab) * 35
    times = {"shifted": 0.0, "unshifted": 0.0}
    for _ in range(args.repeats):
        for name, fn in (("shifted", shifted), ("unshifted", unshifted)):
            t0 = time.perf_counter()
            fn(z)
            times[name] += time.perf_counter() - t0
    print(f"forward time, shifted / unshifted: {times['shifted'] / times['unshifted']:.3f}")


if __name__ == "__main__":
    main()
