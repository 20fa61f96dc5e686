"""``...max_token_len_per_gpu=auto``: the fit from measured probes, the config keys, and a real
address-space limit (RLIMIT_AS, in child processes) that a too-large fixed budget exhausts while
``auto`` picks a budget that runs."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import torch

from dapo.actor import auto_budget
from dapo.actor.auto_budget import AutoBudget
from dapo.actor.dp_actor import actor_settings_from_config
from dapo.config.load import load_config
from dapo.config.schema import AutoBudgetConfig
from dapo.config.validate import validate
from fixtures.config_helpers import run_config

CHILD = Path(__file__).with_name("auto_budget_child.py")


def test_fit_solves_for_the_headroom(monkeypatch):
    monkeypatch.setattr(auto_budget, "headroom", lambda device, limit=None: (10_000_000, "test"))
    logs: list[str] = []
    ab = AutoBudget(
        "ppo_max_token_len_per_gpu", AutoBudgetConfig(margin=0.2), torch.device("cpu"), logs.append
    )
    keep = []

    def probe(rows: list[int]) -> None:  # 1000 bytes per token of the rows + 200 kB fixed
        keep.clear()
        keep.append(torch.empty(200_000, dtype=torch.uint8).fill_(1))
        keep.append(torch.empty(1000 * sum(lengths[i] for i in rows), dtype=torch.uint8).fill_(1))
        keep.clear()

    lengths = [50, 40, 30, 20, 10, 10, 5]
    budget = ab.choose(lengths, probe)
    # rows 50+40 (>= 2 x 50) and 50+40+30+20+10+10 (>= 4 x 50): slope 1000 B/token, 200 kB fixed
    # memory allows (10 MB x 0.8 - 200 kB) / 1000 B = 7800 tokens; the batch has 165, so the
    # timed candidates are 50, 100 and 165 (the longest row doubling, capped)
    assert len(logs) == 1 and "memory allows 7800" in logs[0] and "headroom 10 MiB (test)" in logs[0]
    assert budget in (50, 100, 165) and f"ppo_max_token_len_per_gpu={budget} " in logs[0]
    assert "50: " in logs[0] and "tokens/s" in logs[0]
    assert ab.choose(lengths, probe) == budget and len(logs) == 1  # chosen once
    ab.observe(int(10_000_000 * 0.85))  # within the margin: keep
    assert ab.value == budget
    ab.observe(int(10_000_000 * 0.95))  # within margin / 2 of the headroom: probe again
    assert ab.value is None and "probing again" in logs[-1]


def test_auto_config_keys():
    base = ["actor_rollout_ref.actor.ppo_max_token_len_per_gpu=auto"]
    (p,) = validate(load_config(base))
    assert (
        p.startswith("actor_rollout_ref.actor.ppo_max_token_len_per_gpu=auto") and "use_dynamic_bsz=true" in p
    )
    cfg = run_config(
        *base,
        "actor_rollout_ref.actor.use_dynamic_bsz=true",
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=auto",
        "trainer.auto_budget.memory_limit_gb=2",
    )
    s = actor_settings_from_config(cfg)
    assert s.auto_ppo and s.auto_log_prob and s.ppo_token_budget == 16384
    assert s.auto_budget.memory_limit_gb == 2.0 and s.auto_budget.margin == 0.2
    (p,) = validate(load_config(["actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=lots"]))
    assert "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu" in p and "'lots'" in p


def test_auto_runs_where_a_fixed_budget_exhausts_the_limit(tiny_random_model_dir):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[1] / "src"), env.get("PYTHONPATH", "")])
    limit_mb = "150"  # of address space above the child's size after a warm-up step
    procs = {
        budget: subprocess.Popen(
            [sys.executable, str(CHILD), str(tiny_random_model_dir), budget, limit_mb],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            text=True,
        )
        for budget in ("100000", "auto")
    }
    out = {k: json.loads(p.communicate(timeout=600)[0].strip().splitlines()[-1]) for k, p in procs.items()}
    fixed, auto = out["100000"], out["auto"]
    assert not fixed["ok"] and "allocate" in fixed["error"]
    assert auto["ok"] and math.isfinite(auto["loss"])
    # several micro-batches, each at least the batch's longest row (the smallest budget timed, which
    # can be the fastest)
    assert auto["longest"] <= auto["budget"] < auto["tokens"]
    assert any("RLIMIT_AS" in line and "auto: ppo_max_token_len_per_gpu=" in line for line in auto["logs"])
