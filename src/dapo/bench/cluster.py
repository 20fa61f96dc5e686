"""``dapo bench cluster``: the step-time model (:mod:`dapo.bench.step_model`) calibrated on this
machine's runs, checked against verl's published sync vs ``colocate_async`` ratio, then used to
predict the wall time per step of each strategy on two GPU setups. It is a model: see the
section in docs/results.md for what it leaves out.

1. **This machine.** The runs of ``benchmarks/cluster_calibration.py`` (``cluster_data.RUNS``: the
   default preset's tiny model on the own engine, one setting changed per run). Their
   generation, update and remaining time per step, in CPU seconds (wall seconds times the share
   of a core the run got: on two cores shared with other jobs the wall seconds of runs minutes
   apart differ by half for the same work), are fitted by least squares on the other runs and
   each run's typical (median) step is predicted from its own statistics (leave one run out).
2. **verl's ratio.** verl's published DAPO-Math-17k run of its V1 trainer (Qwen3.5-35B-A3B, 4
   nodes, 32k responses, 150 steps) took 22.79 h in sync mode and 14.72 h with
   ``colocate_async`` (14.10 h ``separate_async``): a ratio of 0.65. The model must give 0.65 +-
   0.1 for that run before its predictions are printed.
3. **Predictions** for the DAPO recipe's 32B setup and a 7B one, per strategy.

GPU figures (dense bf16 FLOP/s and memory bandwidth) are NVIDIA's datasheet numbers; every
other number of the GPU picture (efficiencies, batch sizes, response-length distributions, the
MoE model's shape) is an assumption, named as such in ``ASSUMPTIONS`` and printed.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from dapo.bench.step_model import (
    STRATEGIES,
    Gpu,
    LinearCost,
    Model,
    RooflineCost,
    Workload,
    best_split,
    predict_step,
    update_time,
)

# NVIDIA H100 Tensor Core GPU datasheet, SXM5 column: 989 TFLOPS bf16 dense (1,979 with
# sparsity), 3.35 TB/s HBM3. The verl run's GPU type is not part of its figures: H100 assumed.
H100 = Gpu("H100-SXM", 989e12, 3.35e12)

# config.json of Qwen/Qwen2.5-32B and Qwen/Qwen2.5-7B on Hugging Face (layers, hidden size,
# key-value heads x head size 128); KV bytes = 2 (K and V) x layers x kv_heads x 128 x 2 (bf16)
QWEN25_32B = Model("Qwen2.5-32B", 32.5e9, 32.5e9, 64, 5120, 2 * 64 * 8 * 128 * 2)
QWEN25_7B = Model("Qwen2.5-7B", 7.6e9, 7.6e9, 28, 3584, 2 * 28 * 4 * 128 * 2)
# assumption: Qwen3.5-35B-A3B's total and active parameters from its name, the rest of its shape
# (48 layers, width 2048, 4 KV heads of 128) borrowed from Qwen3-30B-A3B's config.json; its
# linear-attention layers, if any, are not modelled (every layer is given a KV cache)
QWEN35_35B_A3B = Model("Qwen3.5-35B-A3B (Qwen3-30B-A3B shape)", 35e9, 3e9, 48, 2048, 2 * 48 * 4 * 128 * 2)

ASSUMPTIONS = {
    "decode: share of HBM bandwidth reached": 0.6,
    "decode: share of peak FLOP/s reached": 0.3,
    "prefill: share of peak FLOP/s": 0.4,
    "engine step overhead s": 0.004,
    "training: share of peak FLOP/s (MFU)": 0.35,
    "rows an engine decodes at once (vLLM max_num_seqs)": 256,
    "weight sync: bytes/s (weights over NVLink/IB)": 25e9,
    "kept rate of dynamic sampling (groups with spread)": 0.5,
    "response lengths": "lognormal, sigma 0.8, clipped at the maximum (sigma 0.5 and 1.0 also shown for verl's run)",
    "mean prompt tokens": 256,
    "one_step_off / separate_async: share of GPUs generating": "the best of 1/2, 5/8, 3/4, 7/8",
}
SHARES = (0.5, 0.625, 0.75, 0.875)


# ------------------------------------------------------------------------------ this machine


def gen_features(s: dict[str, Any], n: int) -> list[float]:
    """A step's generation on the own engine as ``decode_time`` sees it with a linear step cost
    (contexts here are under 80 tokens, so their term is left out): engine steps (each round as
    long as the step's longest response), rows decoded (the generated tokens), prompt tokens
    prefilled (once per prompt)."""
    return [s["rounds"] * s["max_response"], s["gen_tokens"], s["gen_groups"] * s["prompt_len"]]


def update_features(s: dict[str, Any], n: int) -> list[float]:
    """Old log-probs and the update: a fixed part, the trained tokens (prompts included), and the
    same tokens again when the step recomputed old log-probs (``old_log_prob`` 1: more than one
    mini-batch, so no on-policy fast path), a forward pass the update's backward does not share."""
    tokens = s["trained_tokens"] + s["trained_rows"] * n * s["prompt_len"]
    return [1.0, tokens, s.get("old_log_prob", 0.0) * tokens]


def other_features(s: dict[str, Any], n: int) -> list[float]:
    """The rest of a step (reward, advantages, dumps, logging, what the two timers leave out of
    the trained batch's handling): a fixed part, the responses scored and the trained tokens."""
    return [1.0, s["gen_groups"] * n, s["trained_tokens"]]


def _fit(x: list[list[float]], y: list[float]) -> np.ndarray:
    """Least squares with every coefficient kept at or above 0 (a cost is never negative):
    refit without the columns that come out negative until none does."""
    X, Y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    keep = list(range(X.shape[1]))
    while True:
        coef = np.zeros(X.shape[1])
        coef[keep] = np.linalg.lstsq(X[:, keep], Y, rcond=None)[0]
        neg = [i for i in keep if coef[i] < 0]
        if not neg:
            return coef
        keep = [i for i in keep if i not in neg]


@dataclass(frozen=True)
class CpuFit:
    gen: np.ndarray
    update: np.ndarray
    other: np.ndarray

    @property
    def cost(self) -> LinearCost:
        """The fitted own-engine step: ``gen[0]`` a step, ``gen[1]`` a row, ``gen[2]`` a prompt token."""
        return LinearCost(step_s=self.gen[0], row_s=self.gen[1], prefill_s=self.gen[2])

    def predict(self, s: dict[str, Any], n: int) -> dict[str, float]:
        g = float(np.dot(self.gen, gen_features(s, n)))
        u = float(np.dot(self.update, update_features(s, n)))
        o = float(np.dot(self.other, other_features(s, n)))
        return {"gen_s": g, "update_s": u, "wall_s": g + u + o}


TIMES = ("wall_s", "gen_s", "update_s")


def run_summary(run: dict[str, Any]) -> dict[str, float]:
    """A run's typical step: the median over its steps of every figure (a shared machine's
    load spikes fall on a few steps; the median leaves them out), its times in CPU seconds (wall
    seconds times the share of a core the run got, ``cpu_share``), which is what they would take
    on a core of its own."""

    def value(s: dict[str, Any], k: str) -> float:
        return s[k] * s.get("cpu_share", 1.0) if k in TIMES else s[k]

    keys = [k for k, v in run["steps"][0].items() if isinstance(v, int | float)]
    return {k: float(np.median([value(s, k) for s in run["steps"]])) for k in keys}


def fit_cpu(runs: dict[str, dict[str, Any]]) -> CpuFit:
    """The coefficients, fitted on each run's typical step."""
    steps = [(run_summary(r), r["n"]) for r in runs.values()]
    gen = _fit([gen_features(s, n) for s, n in steps], [s["gen_s"] for s, _ in steps])
    upd = _fit([update_features(s, n) for s, n in steps], [s["update_s"] for s, _ in steps])
    rest = [s["wall_s"] - s["gen_s"] - s["update_s"] for s, _ in steps]
    other = _fit([other_features(s, n) for s, n in steps], rest)
    return CpuFit(gen, upd, other)


def leave_one_out(runs: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per run: its typical step's measured wall (and generation) time against the prediction
    of a fit on the other runs."""
    out = []
    for name, run in runs.items():
        fit = fit_cpu({k: v for k, v in runs.items() if k != name})
        s = run_summary(run)
        p = fit.predict(s, run["n"])
        out.append(
            {
                "run": name,
                "measured_wall_s": s["wall_s"],
                "predicted_wall_s": p["wall_s"],
                "wall_error": p["wall_s"] / s["wall_s"] - 1,
                "measured_gen_s": s["gen_s"],
                "predicted_gen_s": p["gen_s"],
                "gen_error": p["gen_s"] / s["gen_s"] - 1,
            }
        )
    return out


# ------------------------------------------------------------------------------ the GPU picture


def lengths(count: int, max_len: int, mean_frac: float, sigma: float, seed: int) -> list[int]:
    """``count`` response lengths, lognormal with mean ``mean_frac * max_len`` before clipping at
    ``max_len`` (the overlong ones stop there)."""
    rng = np.random.default_rng(seed)
    mu = math.log(mean_frac * max_len) - sigma**2 / 2
    x = np.clip(np.rint(rng.lognormal(mu, sigma, count)), 1, max_len)
    return x.astype(int).tolist()


@dataclass(frozen=True)
class Setup:
    name: str
    model: Model
    gpus: int
    tp: int
    prompts: int  # train_batch_size
    n: int
    max_len: int
    gen_batch: int  # verl mode's gen_batch_size
    mean_frac: float = 0.25
    sigma: float = 0.8


def setup_workload(st: Setup, kept_rate: float, seed: int = 0) -> tuple[Workload, RooflineCost]:
    """Each strategy's generation for one step of ``st`` at ``kept_rate``: ``verl`` runs rounds of
    ``gen_batch`` prompts until ``prompts`` groups are kept; ``default``, ``stream`` and
    ``async_partial`` generate the prompts expected to bring them (``prompts / kept_rate``; the
    surplus is carried, so in the long run no more is generated) as one round, one stream, or
    tokens for an engine that never drains."""
    a = ASSUMPTIONS
    cost = RooflineCost(
        st.model,
        H100,
        st.tp,
        bw_eff=a["decode: share of HBM bandwidth reached"],
        decode_mfu=a["decode: share of peak FLOP/s reached"],
        prefill_mfu=a["prefill: share of peak FLOP/s"],
        overhead_s=a["engine step overhead s"],
    )
    rounds_verl = math.ceil(st.prompts / (kept_rate * st.gen_batch))
    needed = math.ceil(st.prompts / kept_rate)

    def draw(groups: int, salt: int) -> list[int]:
        return lengths(groups * st.n, st.max_len, st.mean_frac, st.sigma, seed + salt)

    default = draw(needed, 1)
    prompt = a["mean prompt tokens"]
    trained = st.prompts * st.n * (prompt + float(np.mean(default)))
    train_s = update_time(
        trained,
        prompt + float(np.mean(default)),
        st.model,
        st.gpus,
        H100,
        a["training: share of peak FLOP/s (MFU)"],
    )
    w = Workload(
        rounds={"verl": [draw(st.gen_batch, 10 + i) for i in range(rounds_verl)], "default": [default]},
        prompt_len=prompt,
        engines=st.gpus // st.tp,
        rows=a["rows an engine decodes at once (vLLM max_num_seqs)"],
        train_s=train_s,
        sync_s=st.model.params * st.model.weight_bytes / a["weight sync: bytes/s (weights over NVLink/IB)"],
        stream=default,
        steady=default,
    )
    return w, cost


# verl's published run: Qwen3.5-35B-A3B on 4 nodes (32 GPUs), 32k responses; train batch and n
# are assumptions (128 prompts x 16: about one pass over DAPO-Math-17k in its 150 steps)
VERL_RUN = Setup("verl DAPO-Math-17k", QWEN35_35B_A3B, 32, 4, 128, 16, 32768, 128, mean_frac=0.35)
VERL_RATIO = (22.79, 14.72, 14.10)  # hours: sync, colocate_async, separate_async

SETUPS = (
    # the DAPO recipe's 32B run: 16 nodes x 8 GPUs, 512 prompts x 16, 20k responses, rollout TP 4,
    # gen_batch_size 3 x 512
    Setup("DAPO 32B (Qwen2.5-32B, 128 GPUs)", QWEN25_32B, 128, 4, 512, 16, 20480, 1536),
    # a 7B setup: one node of 8 GPUs, 128 prompts x 16, 8k responses, rollout TP 1
    Setup("7B (Qwen2.5-7B, 8 GPUs)", QWEN25_7B, 8, 1, 128, 16, 8192, 384),
)


def verl_check(sigmas: tuple[float, ...] = (0.5, 0.8, 1.0)) -> list[dict[str, Any]]:
    """The model's sync vs ``colocate_async`` (and ``separate_async``) ratio on verl's run, per
    length spread. Sync is one round of the step's prompts (no dynamic sampling in that run),
    colocate_async an engine that never drains alternating with training."""
    out = []
    for sigma in sigmas:
        st = Setup(**{**VERL_RUN.__dict__, "sigma": sigma})
        w, cost = setup_workload(st, kept_rate=1.0)
        sync = predict_step("default", w, cost).wall_s
        colo = predict_step("async_partial", w, cost).wall_s
        share, sep_t = best_split("async_partial", w, cost, SHARES)
        sep = sep_t.wall_s
        out.append(
            {
                "sigma": sigma,
                "sync_s": sync,
                "colocate_async_s": colo,
                "separate_async_s": sep,
                "ratio": colo / sync,
                "separate_ratio": sep / sync,
                "separate_gen_share": share,
                "published_sync_s_per_step": VERL_RATIO[0] * 3600 / 150,
            }
        )
    return out


def predictions(kept_rate: float) -> list[dict[str, Any]]:
    rows = []
    for st in SETUPS:
        w, cost = setup_workload(st, kept_rate)
        for strategy in STRATEGIES:
            share = None
            if strategy == "one_step_off":
                share, t = best_split(strategy, w, cost, SHARES)
            else:
                t = predict_step(strategy, w, cost)
            rows.append({"setup": st.name, "strategy": strategy, "gen_share": share, **t.__dict__})
    return rows


def run(args: argparse.Namespace) -> dict[str, Any]:
    from dapo.bench.cluster_data import RUNS

    cpu = leave_one_out(RUNS["runs"])
    fit = fit_cpu(RUNS["runs"])
    check = verl_check()
    ok = bool(
        abs(next(c for c in check if c["sigma"] == 0.8)["ratio"] - VERL_RATIO[1] / VERL_RATIO[0]) <= 0.1
    )
    worst = float(max(abs(r["wall_error"]) for r in cpu))
    return {
        "cpu_runs": cpu,
        "cpu_worst_error": worst,
        "cpu_within_20_percent": bool(worst <= 0.2),
        "cpu_load": [RUNS["load_before"], RUNS["load_after"]],
        "cpu_cost": {"step_s": fit.cost.step_s, "row_s": fit.cost.row_s, "prefill_s": fit.cost.prefill_s},
        "verl_check": check,
        "verl_published_ratio": VERL_RATIO[1] / VERL_RATIO[0],
        "verl_check_passed": ok,
        "predictions": predictions(args.kept_rate) if ok else [],
        "assumptions": ASSUMPTIONS,
    }


def _print(out: dict[str, Any]) -> None:
    print("This machine (own engine, tiny model), CPU seconds per step, leave one run out:")
    for r in out["cpu_runs"]:
        print(
            f"  {r['run']:<11} wall/step {r['measured_wall_s']:.3f} s measured, {r['predicted_wall_s']:.3f} "
            f"predicted ({r['wall_error']:+.0%}); generation {r['measured_gen_s']:.3f} vs "
            f"{r['predicted_gen_s']:.3f} ({r['gen_error']:+.0%})"
        )
    c = out["cpu_cost"]
    print(
        f"  fitted step: {c['step_s'] * 1e3:.3f} ms + {c['row_s'] * 1e3:.4f} ms a row; "
        f"{c['prefill_s'] * 1e3:.4f} ms a prompt token"
    )
    print(f"  load: {out['cpu_load'][0]} / {out['cpu_load'][1]}")
    verdict = "yes" if out["cpu_within_20_percent"] else "NO"
    print(f"  every held-out run within 20%: {verdict} (worst {out['cpu_worst_error']:.0%})")
    print(f"verl's run, colocate_async / sync (published {out['verl_published_ratio']:.3f}):")
    for r in out["verl_check"]:
        print(
            f"  sigma {r['sigma']}: sync {r['sync_s']:.0f} s/step (published {r['published_sync_s_per_step']:.0f}),"
            f" colocate_async {r['colocate_async_s']:.0f} s: ratio {r['ratio']:.3f};"
            f" separate_async ratio {r['separate_ratio']:.3f} (best split: {r['separate_gen_share']} generating)"
        )
    if not out["verl_check_passed"]:
        print("the model misses verl's ratio by more than 0.1: no predictions")
        return
    print("Predicted wall per step (a model; see docs/results.md):")
    for r in out["predictions"]:
        print(
            f"  {r['setup']:<34} {r['strategy']:<14} wall {r['wall_s']:8.1f} s"
            f" (generation {r['gen_s']:7.1f}, training {r['train_s']:6.1f}, sync {r['sync_s']:4.1f})"
            + (f", {r['gen_share']} of the GPUs generating" if r["gen_share"] is not None else "")
        )
    print("Assumptions:")
    for k, v in out["assumptions"].items():
        print(f"  {k}: {v}")


def _main(args: argparse.Namespace) -> int:
    out = run(args)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        _print(out)
    return 0


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``cluster`` to a ``dapo bench`` subparsers object; dispatch with ``args.func(args)``."""
    p = subparsers.add_parser(
        "cluster",
        help="a step-time model: calibrated here, checked on verl's async ratio, GPU predictions",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of the text report")
    p.add_argument(
        "--kept-rate",
        type=float,
        default=ASSUMPTIONS["kept rate of dynamic sampling (groups with spread)"],
        help="share of groups with spread in the GPU predictions (default 0.5)",
    )
    p.set_defaults(func=_main)
    return p
