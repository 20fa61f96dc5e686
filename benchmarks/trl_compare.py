"""dapo beside TRL's GRPOTrainer on a built-in task: held-out accuracy vs steps, vs training
time and vs generated tokens, interleaved runs in one script.

``--task`` picks the built-in task, its warm-started tiny model and the preset whose recipe every
arm runs (``PRESETS``):
* ``arithmetic`` (default): ``dapo.tasks.arithmetic`` and ``dapo.tasks.tiny_model``, the
  ``default`` preset. Groups often lack spread: easy sums end up all-correct, two-digit
  products all-wrong. 16 prompts x 8 responses per update in two micro-batches of 64, lr 5e-4
  with 2 warm-up steps, 24 response tokens, an 8-token overlong buffer.
* ``reasoning``: ``dapo.tasks.reasoning`` (chained operations with written working of 136-205
  tokens) and ``dapo.tasks.tiny_reasoning_model``, the ``reasoning`` preset: 8 prompts x 8
  responses in one micro-batch, 256 response tokens, a 40-token overlong buffer, the preset's lr.
* ``reasoning_sparse``: the same chains, model, preset and held-out set, trained on the
  ``reasoning_sparse`` pool (``data.builtin_task=reasoning_sparse``), where most chains are
  beyond the model and about 17% of groups have spread at the start.

The recipe is read from the preset through dapo's own config loading (``load_recipe``), so the
TRL arm follows the preset when it changes; the script stops with one line naming the key if the
preset sets something the TRL arm cannot copy. Both trainers use: AdamW with the preset's betas,
weight decay and grad clip, a constant lr after linear warm-up, the preset's clip ratios
(0.2 / 0.28), token-mean loss (TRL's ``loss_type="dapo"``), no KL (``beta=0``), one update a
step, the preset's temperature and top-k/top-p, and the same reward: dapo's scorer for the task
(math_dapo, +1 / -1) plus the DAPO overlong penalty, called from a TRL reward function. TRL runs
on CPU with ``use_cpu=True, bf16=False`` and one torch thread, as dapo does
(``trainer.torch_threads=1``). Tokenizers are loaded with ``dapo.model.loader.load_tokenizer``
(AutoTokenizer would drop the character vocabulary's spaces and newlines, which the reasoning
working is written with) and checked to round-trip a line of working.

Arms (each a fresh process, in rotating order per seed):
* ``trl``: GRPOTrainer; every group is trained on, with or without spread;
* ``dapo``: ``dapo train --config-name <preset>``: dynamic sampling, the default strategy;
* ``dapo-verl``: dynamic sampling with verl's semantics (regenerate whole rounds until full);
* ``dapo-nofilter``: ``algorithm.filter_groups.enable=false``, ``data.gen_batch_size`` =
  ``data.train_batch_size``: the same algorithm as ``trl``, so the difference is the
  framework's alone.

Every arm saves its weights every ``--eval-every`` steps (outside its timed steps); afterwards
each saved model is scored by one evaluator here, the same for all arms: greedy and 4 samples at
the preset's temperature (seeded) on the task's held-out prompts, up to the preset's
``data.max_response_length`` new tokens, graded by dapo's scorer. Training time is the sum of
step times: dapo's ``timing_s/step`` (generation, reward, update; not validation, saving or
logging) and, for TRL, on_step_begin to on_step_end (generation, reward, loss, update).

Needs TRL, which is not a dapo dependency: ``make venv-trl`` builds ``.venv-trl`` (TRL, CPU
torch, dapo) and the script is run with that venv's python:

    OMP_NUM_THREADS=1 nice -n 10 .venv-trl/bin/python benchmarks/trl_compare.py \\
        --seeds 1 2 3 --steps 60 --eval-every 10 [--arms trl dapo dapo-nofilter] [--plot PNG]

and on the long-reasoning task (a step costs about ten times an arithmetic one and scoring 64
held-out chains takes ~35 s, so fewer steps and prompts fit the same time):

    OMP_NUM_THREADS=1 nice -n 10 .venv-trl/bin/python benchmarks/trl_compare.py --task reasoning \\
        --seeds 1 2 3 --steps 30 --eval-every 10 --eval-prompts 64 [--plot PNG]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

ARMS = ("trl", "dapo", "dapo-verl", "dapo-nofilter")
# the built-in task -> the preset whose recipe every arm runs (src/dapo/config/presets/)
PRESETS = {"arithmetic": "default", "reasoning": "reasoning", "reasoning_sparse": "reasoning"}
# held-out sampled accuracy for the time-to-target columns (base models: ~0.18 and ~0.43; the
# reasoning preset's runs pass 0.6 at about step 20 of 40)
TARGETS = {"arithmetic": 0.55, "reasoning": 0.6, "reasoning_sparse": 0.55}
VAL_SAMPLES = 4
# a line of the reasoning task's working: a tokenizer that drops its spaces or newline cannot run it
ROUNDTRIP_TEXT = "1)+8: 47+8=55\n"


@dataclass(frozen=True)
class Recipe:
    """The part of a dapo preset that the TRL arm copies (the dapo arms run the preset itself)."""

    task: str
    preset: str
    prompts_per_step: int  # data.train_batch_size
    group_size: int  # rollout.n
    micro_batch: int  # actor.ppo_micro_batch_size_per_gpu
    lr: float
    warmup_steps: int
    betas: tuple[float, float]
    weight_decay: float
    grad_clip: float
    clip_low: float
    clip_high: float
    scale_rewards: str  # TRL's name for algorithm.norm_adv_by_std_in_grpo
    temperature: float
    top_p: float
    top_k: int  # 0: off (TRL's convention; dapo's is -1)
    max_response: int  # data.max_response_length
    overlong_buffer: int
    overlong_penalty_factor: float


def load_recipe(task: str) -> Recipe:
    """The recipe of ``task``'s preset, read through dapo's own config loading (as ``dapo train
    --config-name <preset>`` resolves it); exits naming the key when the preset sets something
    the TRL arm cannot copy."""
    from dapo.run_config import build_run_config

    preset = PRESETS[task]
    cfg = build_run_config([f"data.builtin_task={task}"], preset=preset).cfg
    arr, alg = cfg.actor_rollout_ref, cfg.algorithm
    actor, rollout, optim, overlong = (
        arr.actor,
        arr.rollout,
        arr.actor.optim,
        cfg.reward_model.overlong_buffer,
    )
    required = {
        "data.builtin_task": (cfg.data.builtin_task, task),
        "algorithm.adv_estimator": (alg.adv_estimator, "grpo"),
        "algorithm.use_kl_in_reward": (alg.use_kl_in_reward, False),
        "actor_rollout_ref.actor.use_kl_loss": (actor.use_kl_loss, False),
        "actor_rollout_ref.actor.entropy_coeff": (actor.entropy_coeff, 0.0),
        "actor_rollout_ref.actor.loss_agg_mode": (actor.loss_agg_mode, "token-mean"),
        "actor_rollout_ref.actor.policy_loss.loss_mode": (actor.policy_loss.loss_mode, "vanilla"),
        "actor_rollout_ref.actor.ppo_epochs": (actor.ppo_epochs, 1),
        "actor_rollout_ref.actor.ppo_mini_batch_size": (actor.ppo_mini_batch_size, cfg.data.train_batch_size),
        "actor_rollout_ref.actor.optim.lr_scheduler_type": (optim.lr_scheduler_type, "constant"),
        "reward_model.reward_manager": (cfg.reward_model.reward_manager, "dapo"),
        "reward_model.overlong_buffer.enable": (overlong.enable, True),
    }
    for key, (got, want) in required.items():
        if got != want:
            raise SystemExit(
                f"dapo: trl_compare.py copies preset {preset!r} into TRL only with {key}={want} "
                f"(one update a step, GRPO, token-mean, no KL); the preset sets {got}"
            )
    return Recipe(
        task=task,
        preset=preset,
        prompts_per_step=int(cfg.data.train_batch_size),
        group_size=int(rollout.n),
        micro_batch=int(actor.ppo_micro_batch_size_per_gpu),
        lr=float(optim.lr),
        warmup_steps=int(optim.lr_warmup_steps),
        betas=(float(optim.betas[0]), float(optim.betas[1])),
        weight_decay=float(optim.weight_decay),
        grad_clip=float(actor.grad_clip),
        clip_low=float(actor.clip_ratio_low),
        clip_high=float(actor.clip_ratio_high),
        scale_rewards="group" if alg.norm_adv_by_std_in_grpo else "none",
        temperature=float(rollout.temperature),
        top_p=float(rollout.top_p),
        top_k=max(int(rollout.top_k), 0),
        max_response=int(cfg.data.max_response_length),
        overlong_buffer=int(overlong.len),
        overlong_penalty_factor=float(overlong.penalty_factor),
    )


def dapo_arm_overrides(arm: str, recipe: Recipe) -> list[str]:
    return {
        "dapo": [],
        "dapo-verl": ["algorithm.filter_groups.strategy=verl", "algorithm.filter_groups.on_exhausted=train"],
        "dapo-nofilter": [
            "algorithm.filter_groups.enable=false",
            f"data.gen_batch_size={recipe.prompts_per_step}",
        ],
    }[arm]


def load_tokenizer_checked(model_dir: Path) -> PreTrainedTokenizerBase:
    """dapo's tokenizer for ``model_dir`` (AutoTokenizer would load the character vocabulary
    under Qwen2's class, which drops spaces and newlines), checked to round-trip the working."""
    from dapo.model.loader import load_tokenizer

    tok = load_tokenizer(model_dir)
    back = tok.decode(tok.encode(ROUNDTRIP_TEXT, add_special_tokens=False))
    if back != ROUNDTRIP_TEXT:
        raise SystemExit(f"dapo: the tokenizer in {model_dir} turns {ROUNDTRIP_TEXT!r} into {back!r}")
    return tok


# ------------------------------------------------------------------------------ the TRL arm


def overlong_penalty(length: int, recipe: Recipe) -> float:
    """DAPO's soft overlong punishment, as dapo's reward manager applies it."""
    exceed = length - (recipe.max_response - recipe.overlong_buffer)
    return min(-exceed / recipe.overlong_buffer * recipe.overlong_penalty_factor, 0.0)


def run_trl(recipe: Recipe, seed: int, steps: int, eval_every: int, run_dir: Path) -> None:
    """One GRPOTrainer run; writes ``metrics.jsonl`` (one row a step) and ``step_<N>/`` weights."""
    import pyarrow.parquet as pq
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from dapo.reward.scorers import default_compute_score
    from dapo.tasks import builtin_model, builtin_task

    torch.set_num_threads(1)
    model_dir = builtin_model(recipe.task)
    train_path, _ = builtin_task(recipe.task)
    rows = pq.read_table(train_path).to_pylist()
    dataset = Dataset.from_list(
        [
            {
                "prompt": r["prompt"],
                "ground_truth": r["reward_model"]["ground_truth"],
                "data_source": r["data_source"],
            }
            for r in rows
        ]
    )
    tok = load_tokenizer_checked(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    gen = {"sequences": 0, "tokens": 0, "acc": 0.0}

    def reward(prompts, completions, completion_ids, ground_truth, data_source, **_):
        out = []
        for comp, ids, gt, src in zip(completions, completion_ids, ground_truth, data_source):
            text = comp[-1]["content"] if isinstance(comp, list) else comp
            res = default_compute_score(src, text, gt)
            score = float(res["score"]) if isinstance(res, dict) else float(res)
            gen["acc"] += float(res.get("acc", score > 0)) if isinstance(res, dict) else float(score > 0)
            out.append(score + overlong_penalty(len(ids), recipe))
            gen["tokens"] += len(ids)
        gen["sequences"] += len(completions)
        return out

    rows_out: list[dict] = []

    class Timing(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            step_s = time.perf_counter() - self.t0
            row = {"step": state.global_step, "step_s": step_s, **{f"gen_{k}": v for k, v in gen.items()}}
            rows_out.append(row)
            gen.update(sequences=0, tokens=0, acc=0.0)
            if state.global_step % eval_every == 0 or state.global_step == steps:
                kw["model"].save_pretrained(run_dir / f"step_{state.global_step}")
                tok.save_pretrained(run_dir / f"step_{state.global_step}")

    sequences = recipe.prompts_per_step * recipe.group_size
    micro = min(recipe.micro_batch, sequences)
    if sequences % micro:
        raise SystemExit(
            f"dapo: {sequences} sequences a step do not split into micro-batches of {micro} "
            f"(actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu in preset {recipe.preset!r})"
        )
    config = GRPOConfig(
        output_dir=str(run_dir / "trl_out"),
        use_cpu=True,
        bf16=False,
        fp16=False,
        seed=seed,
        data_seed=seed,
        max_steps=steps,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=sequences // micro,
        num_generations=recipe.group_size,
        max_completion_length=recipe.max_response,
        temperature=recipe.temperature,
        top_p=recipe.top_p,
        top_k=recipe.top_k,
        learning_rate=recipe.lr,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=recipe.warmup_steps,
        weight_decay=recipe.weight_decay,
        adam_beta1=recipe.betas[0],
        adam_beta2=recipe.betas[1],
        max_grad_norm=recipe.grad_clip,
        loss_type="dapo",
        beta=0.0,
        epsilon=recipe.clip_low,
        epsilon_high=recipe.clip_high,
        scale_rewards=recipe.scale_rewards,
        num_iterations=1,
        gradient_checkpointing=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        processing_class=tok,
        callbacks=[Timing()],
    )
    if trainer.processing_class is not tok:
        raise SystemExit("dapo: GRPOTrainer replaced the tokenizer it was given")
    trainer.train()
    with open(run_dir / "metrics.jsonl", "w") as f:
        for row in rows_out:
            f.write(json.dumps(row) + "\n")


# ------------------------------------------------------------------------------ the dapo arms


def run_dapo(arm: str, recipe: Recipe, seed: int, steps: int, eval_every: int, run_dir: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "dapo.cli",
        "train",
        "--config-name",
        recipe.preset,
        f"data.builtin_task={recipe.task}",
        f"trainer.seed={seed}",
        f"data.seed={seed}",
        f"trainer.total_training_steps={steps}",
        f"trainer.save_freq={eval_every}",
        f"trainer.default_local_dir={run_dir}",
        "trainer.test_freq=0",
        "trainer.val_before_train=false",
        # the one validation dapo still runs after the last step is not used here: keep it small
        "data.val_max_samples=4",
        "trainer.logger=[jsonl]",
        "trainer.report_freq=0",
        "trainer.rollout_data_dir=null",
        "trainer.save_final_model=false",
        "trainer.torch_threads=1",
        *dapo_arm_overrides(arm, recipe),
    ]
    run_logged(cmd, run_dir)


def run_logged(cmd: list[str], run_dir: Path) -> None:
    """Run ``cmd`` with its output in ``run_dir/log.txt``; on failure, show the log's tail."""
    log = run_dir / "log.txt"
    with open(log, "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        tail = "\n".join(log.read_text().splitlines()[-30:])
        raise SystemExit(f"dapo: {' '.join(cmd[:4])} ... failed (exit {rc}); the end of {log}:\n{tail}")


def dapo_rows(run_dir: Path, recipe: Recipe) -> list[dict]:
    out = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if "timing_s/step" not in r:
            continue
        out.append(
            {
                "step": int(r["step"]),
                "step_s": r["timing_s/step"],
                "gen_sequences": r.get("dynamic_sampling/generated_groups", 0.0) * recipe.group_size,
                "gen_tokens": r.get("dynamic_sampling/generated_response_tokens", 0.0),
                "trained_groups": r.get("dynamic_sampling/trained_groups", recipe.prompts_per_step),
            }
        )
    return out


def dapo_checkpoints(run_dir: Path) -> dict[int, Path]:
    from dapo.checkpoint.store import HF_SUBDIR

    out = {}
    for d in run_dir.glob("global_step_*"):
        out[int(d.name.rsplit("_", 1)[1])] = d / HF_SUBDIR
    return out


def trl_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def trl_checkpoints(run_dir: Path) -> dict[int, Path]:
    return {int(d.name.split("_")[1]): d for d in run_dir.glob("step_*")}


# ------------------------------------------------------------------------------ evaluation


class Evaluator:
    """Held-out accuracy of a saved model: greedy, and the mean of ``VAL_SAMPLES`` samples at
    the recipe's temperature with a fixed seed, on the task's test prompts, up to the recipe's
    response length, graded by dapo's scorer (math_dapo for both built-in tasks)."""

    def __init__(self, recipe: Recipe, max_prompts: int | None = None):
        import pyarrow.parquet as pq

        from dapo.tasks import builtin_task

        self.recipe = recipe
        _, test_path = builtin_task(recipe.task)
        rows = pq.read_table(test_path).to_pylist()[:max_prompts]
        self.prompts = [r["prompt"] for r in rows]
        self.truths = [r["reward_model"]["ground_truth"] for r in rows]
        self.source = rows[0]["data_source"]

    def __call__(self, model_dir: Path) -> dict[str, float]:
        import torch
        from transformers import AutoModelForCausalLM

        from dapo.reward.scorers import default_compute_score

        tok = load_tokenizer_checked(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        tok.padding_side = "left"
        enc = tok.apply_chat_template(
            self.prompts, add_generation_prompt=True, tokenize=True, return_dict=True, padding=True,
            return_tensors="pt",
        )  # fmt: skip
        out: dict[str, float] = {}
        r = self.recipe
        for name, kwargs in (
            ("greedy", {"do_sample": False, "num_return_sequences": 1}),
            ("sampled", {"do_sample": True, "temperature": r.temperature, "top_k": r.top_k, "top_p": r.top_p,
                         "num_return_sequences": VAL_SAMPLES}),
        ):  # fmt: skip
            torch.manual_seed(1234)
            with torch.no_grad():
                ids = model.generate(
                    **enc,
                    max_new_tokens=r.max_response,
                    eos_token_id=tok.eos_token_id,
                    pad_token_id=tok.pad_token_id,
                    **kwargs,
                )
            texts = tok.batch_decode(ids[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
            k = kwargs["num_return_sequences"]
            accs = []
            for i, text in enumerate(texts):
                res = default_compute_score(self.source, text, self.truths[i // k])
                accs.append(float(res["acc"]) if isinstance(res, dict) else float(res > 0))
            out[name] = sum(accs) / len(accs)
        return out


# ------------------------------------------------------------------------------ the comparison


def run_arm(arm: str, seed: int, steps: int, eval_every: int, out: Path, evaluate: Evaluator) -> dict:
    recipe = evaluate.recipe
    run_dir = out / f"{arm}-seed{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if arm == "trl":
        cmd = [sys.executable, __file__, "--trl-worker", str(run_dir), "--task", recipe.task]
        cmd += ["--seeds", str(seed), "--steps", str(steps), "--eval-every", str(eval_every)]
        run_logged(cmd, run_dir)
        rows, ckpts = trl_rows(run_dir), trl_checkpoints(run_dir)
    else:
        run_dapo(arm, recipe, seed, steps, eval_every, run_dir)
        rows, ckpts = dapo_rows(run_dir, recipe), dapo_checkpoints(run_dir)
    wall = time.perf_counter() - t0
    cum_s, cum_tok, cum_seq, by_step = 0.0, 0.0, 0.0, {}
    for r in rows:
        cum_s += r["step_s"]
        cum_tok += r["gen_tokens"]
        cum_seq += r["gen_sequences"]
        by_step[r["step"]] = (cum_s, cum_tok, cum_seq)
    curve = []  # (step, train s, generated tokens, greedy acc, sampled acc)
    for step in sorted(ckpts):
        acc = evaluate(ckpts[step])
        s, tokens, _ = by_step[step]
        curve.append([step, s, tokens, acc["greedy"], acc["sampled"]])
    return {
        "arm": arm,
        "seed": seed,
        "process_wall_s": wall,
        "train_s": cum_s,
        "step_s_median": statistics.median(r["step_s"] for r in rows),
        "gen_sequences_per_step": cum_seq / len(rows),
        "gen_tokens_per_step": cum_tok / len(rows),
        "curve": curve,
    }


def first_reaching(curve: list, target: float, x: int) -> float | None:
    """``x`` column of the first evaluation at which the sampled accuracy, averaged with the
    evaluation before it, is at least ``target`` (so one lucky evaluation does not decide it)."""
    for prev, point in zip(curve, curve[1:]):
        if (prev[4] + point[4]) / 2 >= target - 1e-9:
            return point[x]
    return None


def late_acc(run: dict, col: int, last: int = 3) -> float:
    """Held-out accuracy over the run's last ``last`` evaluations (the policy oscillates at this lr)."""
    return statistics.mean(p[col] for p in run["curve"][-last:])


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summarize(results: list[dict], arms: list[str], target: float) -> list[dict]:
    """One row per arm: per-seed values, and ratios to the ``trl`` run of the same seed."""
    ref_arm = "trl" if "trl" in arms else arms[0]
    refs = {r["seed"]: r for r in results if r["arm"] == ref_arm}
    table = []
    for arm in arms:
        runs = [r for r in results if r["arm"] == arm]
        time_ratios = [
            ratio(first_reaching(r["curve"], target, 1), first_reaching(refs[r["seed"]]["curve"], target, 1))
            for r in runs
        ]
        token_ratios = [
            ratio(first_reaching(r["curve"], target, 2), first_reaching(refs[r["seed"]]["curve"], target, 2))
            for r in runs
        ]
        table.append(
            {
                "arm": arm,
                "late_acc": [late_acc(r, 4) for r in runs],
                "late_acc_greedy": [late_acc(r, 3) for r in runs],
                "train_s": [r["train_s"] for r in runs],
                "step_ratio_vs_ref": statistics.median(
                    r["step_s_median"] / refs[r["seed"]]["step_s_median"] for r in runs
                ),
                "gen_sequences_per_step": statistics.mean(r["gen_sequences_per_step"] for r in runs),
                "gen_tokens_per_step": statistics.mean(r["gen_tokens_per_step"] for r in runs),
                "steps_to_target": [first_reaching(r["curve"], target, 0) for r in runs],
                "time_to_target_s": [first_reaching(r["curve"], target, 1) for r in runs],
                "time_ratio_vs_ref": time_ratios,
                "token_ratio_vs_ref": token_ratios,
            }
        )
    return table


def plot(results: list[dict], arms: list[str], base: dict[str, float], recipe: Recipe, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4), sharey=True)
    colors = dict(zip(ARMS, ("tab:red", "tab:blue", "tab:green", "tab:gray")))
    for arm in arms:
        for i, r in enumerate(r for r in results if r["arm"] == arm):
            pts = [[0, 0.0, 0.0, base["greedy"], base["sampled"]], *r["curve"]]
            for ax, x in zip(axes, (0, 1, 2)):
                ax.plot(
                    [p[x] for p in pts],
                    [p[4] for p in pts],
                    color=colors[arm],
                    alpha=0.8,
                    marker=".",
                    label=arm if i == 0 else None,
                )
    for ax, label in zip(axes, ("training step", "training time (s)", "generated response tokens")):
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[2].ticklabel_format(axis="x", style="sci", scilimits=(-3, 3))  # token counts overlap in full
    axes[0].set_ylabel(f"held-out accuracy (mean of {VAL_SAMPLES} samples, T={recipe.temperature:g})")
    fig.suptitle(f"{recipe.task} task, preset {recipe.preset}")
    axes[0].legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)


def fmt_list(values: list, spec: str) -> str:
    return " ".join("never" if v is None else format(v, spec) for v in values)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--task", choices=sorted(PRESETS), default="arithmetic", help="built-in task and its preset"
    )
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--arms", nargs="+", choices=ARMS, default=["trl", "dapo", "dapo-nofilter"])
    ap.add_argument(
        "--target",
        type=float,
        default=None,
        help="held-out sampled accuracy for the time-to-target columns "
        f"(default: {', '.join(f'{k} {v}' for k, v in TARGETS.items())})",
    )
    ap.add_argument("--eval-prompts", type=int, default=None, help="score only the first N held-out prompts")
    ap.add_argument("--out", type=Path, default=None, help="run directory (default: a new temporary one)")
    ap.add_argument("--plot", type=Path, default=None, help="write accuracy vs steps / time / tokens (PNG)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--trl-worker", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    recipe = load_recipe(args.task)
    if args.target is None:
        args.target = TARGETS[args.task]
    if args.trl_worker is not None:
        run_trl(recipe, args.seeds[0], args.steps, args.eval_every, args.trl_worker)
        return 0
    try:
        import trl  # noqa: F401
    except ImportError:
        print("dapo: trl_compare.py needs TRL: `make venv-trl`, then run it with .venv-trl/bin/python")
        return 2
    import torch

    from dapo.tasks import builtin_model

    torch.set_num_threads(1)
    out = args.out or Path(tempfile.mkdtemp(prefix="dapo-trl-compare-"))
    evaluate = Evaluator(recipe, args.eval_prompts)
    base = evaluate(builtin_model(args.task))
    results = []
    for i, seed in enumerate(args.seeds):
        order = (
            args.arms[i % len(args.arms) :] + args.arms[: i % len(args.arms)]
        )  # rotate: no arm always first
        for arm in order:
            results.append(run_arm(arm, seed, args.steps, args.eval_every, out, evaluate))
            r = results[-1]
            print(
                f"seed {seed} {arm}: train {r['train_s']:.0f} s, process {r['process_wall_s']:.0f} s, "
                f"final acc {r['curve'][-1][4]:.3f}",
                file=sys.stderr,
                flush=True,
            )
    summary = {
        "task": args.task,
        "recipe": asdict(recipe),
        "steps": args.steps,
        "seeds": args.seeds,
        "target": args.target,
        "base_acc": base,
        "arms": summarize(results, args.arms, args.target),
        "runs": results,
        "out_dir": str(out),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    if args.plot:
        plot(results, args.arms, base, recipe, args.plot)
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(
        f"{args.task} task (preset {recipe.preset}, lr {recipe.lr:g}), {args.steps} steps, seeds "
        f"{args.seeds}; base model held-out accuracy: sampled {base['sampled']:.3f}, greedy "
        f"{base['greedy']:.3f}; target: sampled {args.target} "
        "(mean of two consecutive evaluations); ratios are to trl's run of the same seed"
    )
    cols = [
        ("late acc (sampled)", "late_acc", ".3f"),
        ("late acc (greedy)", "late_acc_greedy", ".3f"),
        ("train s", "train_s", ".0f"),
        ("steps to target", "steps_to_target", ".0f"),
        ("s to target", "time_to_target_s", ".0f"),
        ("time/trl", "time_ratio_vs_ref", ".2f"),
        ("tokens/trl", "token_ratio_vs_ref", ".2f"),
    ]
    print(
        f"{'arm':<14} {'step/trl':>8} {'seq/step':>8} {'tok/step':>8} "
        + " ".join(f"{c[0]:>20}" for c in cols)
    )
    for t in summary["arms"]:
        print(
            f"{t['arm']:<14} {t['step_ratio_vs_ref']:>8.2f} {t['gen_sequences_per_step']:>8.0f}"
            f" {t['gen_tokens_per_step']:>8.0f} " + " ".join(f"{fmt_list(t[k], f):>20}" for _, k, f in cols)
        )
    print("\ncurves (step: train s, sampled acc)")
    for r in results:
        print(
            f"  {r['arm']:<14} seed {r['seed']}: "
            + " ".join(f"{p[0]}:{p[1]:.0f}s,{p[4]:.3f}" for p in r["curve"])
        )
    print(f"run directory: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
