"""``benchmarks/coverage_real_loop.py``'s pieces without training: the offline pass-rate filter,
the tuned gen batch, the matched-budget interpolation, a run's record and the report's numbers
against hand-computed curves, and the skip of finished runs on a rerun."""

import argparse
import json
import math
import os
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dapo.outputs.dumps import dump_generations

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))

import coverage_real_loop as bench  # noqa: E402
from coverage_report import interpolate, markdown, matched, run_record, summarize  # noqa: E402
from offline_filter import (  # noqa: E402
    has_spread,
    kept_rate,
    kept_rows,
    pass_overrides,
    pass_rates,
    tuned_gen_batch_size,
)

# ------------------------------------------------------------------ the offline filter


def test_pass_rates_and_the_filter_on_a_hand_pass():
    # 4 prompts x 4 samples: all wrong, 1/4, 3/4, all right
    uids = [f"val-{i}" for i in range(4) for _ in range(4)]
    accs = [0, 0, 0, 0] + [0, 1, 0, 0] + [1, 1, 0, 1] + [1, 1, 1, 1]
    rates = pass_rates(uids, accs)
    assert rates == {"val-0": 0.0, "val-1": 0.25, "val-2": 0.75, "val-3": 1.0}
    rows = [{"q": f"chain {i}"} for i in range(4)]
    by_row = [rates[f"val-{i}"] for i in range(4)]
    assert kept_rows(rows, by_row) == [{"q": "chain 1"}, {"q": "chain 2"}]
    assert kept_rate(by_row) == 0.5
    assert [has_spread(r) for r in (0.0, 1e-9, 0.5, 1 - 1e-9, 1.0)] == [False, True, True, True, False]
    with pytest.raises(ValueError, match="4 rows but 3 pass rates"):
        kept_rows(rows, by_row[:3])
    with pytest.raises(ValueError, match="no pass rates"):
        kept_rate([])


def test_tuned_gen_batch_size_by_hand():
    assert tuned_gen_batch_size(8, 0.25, 1.25, 1536) == 40  # 8 / 0.25 * 1.25 = 40 exactly
    assert tuned_gen_batch_size(8, 0.17, 1.25, 1536) == 59  # 58.82 up
    assert tuned_gen_batch_size(8, 1.0, 1.0, 1536) == 8
    assert tuned_gen_batch_size(8, 0.001, 1.25, 1536) == 1536  # never more than the pool
    with pytest.raises(ValueError, match="kept rate 0"):
        tuned_gen_batch_size(8, 0.0, 1.25, 1536)
    with pytest.raises(ValueError, match="margin 0.9 is under 1"):
        tuned_gen_batch_size(8, 0.5, 0.9, 1536)


@given(
    tbs=st.integers(1, 512),
    rate=st.floats(0.001, 1.0),
    margin=st.floats(1.0, 3.0),
    pool=st.integers(1, 100_000),
)
def test_tuned_gen_batch_size_is_the_smallest_round_that_fills_a_batch(tbs, rate, margin, pool):
    g = tuned_gen_batch_size(tbs, rate, margin, pool)
    assert tbs <= g <= max(tbs, pool)
    want = tbs / rate * margin
    if tbs < g < pool:  # not clamped: the smallest whole round expected to keep tbs * margin
        assert g - 1 < want + 1e-6 and g >= want - 1e-6


def test_the_pass_samples_the_pool_as_training_does(tmp_path):
    from dapo.config.load import load_config

    cfg = load_config(pass_overrides(3, tmp_path, "reasoning_wide", "/pool.parquet", []), preset="reasoning")
    vk, r = cfg.actor_rollout_ref.rollout.val_kwargs, cfg.actor_rollout_ref.rollout
    assert (vk.n, vk.temperature, vk.top_p, vk.top_k, vk.do_sample) == (8, 1.0, 1.0, -1, True)
    assert (r.n, r.temperature) == (8, 1.0)
    assert cfg.data.val_files == "/pool.parquet" and cfg.data.val_max_samples == -1
    assert cfg.trainer.seed == 3 and cfg.trainer.val_only and cfg.data.builtin_task == "reasoning_wide"
    # an override of the arms (more samples a prompt) reaches the pass too
    cfg = load_config(
        pass_overrides(3, tmp_path, "reasoning_wide", "/p", ["actor_rollout_ref.rollout.n=4"]),
        preset="reasoning",
    )
    assert cfg.actor_rollout_ref.rollout.val_kwargs.n == 4


# ------------------------------------------------------------------ curves and budgets


def test_interpolate_by_hand():
    pts = [(0.0, 0.4), (10.0, 0.4), (20.0, 0.6), (40.0, 0.5)]
    assert interpolate(pts, 5.0) == 0.4  # flat over the offline pass
    assert interpolate(pts, 15.0) == pytest.approx(0.5)
    assert interpolate(pts, 35.0) == pytest.approx(0.525)
    assert interpolate(pts, 40.0) == 0.5 and interpolate(pts, 0.0) == 0.4
    assert interpolate(pts, 40.1) is None and interpolate(pts, -1) is None and interpolate([], 0) is None
    # a jump at x = 10: the later point holds from there on
    assert interpolate([(0.0, 0.1), (10.0, 0.2), (10.0, 0.3), (20.0, 0.5)], 10.0) == 0.3


def _record(arm, seed, pts, **extra):
    rec = {
        "arm": arm,
        "seed": seed,
        "curve": [{"step": i, "gen_tokens": x, "wall_s": w, "acc": a} for i, (x, w, a) in enumerate(pts)],
        "gen_tokens": pts[-1][0],
        "wall_s": pts[-1][1],
        "final_acc": pts[-1][2],
        "final_acc_by_tier": {"easy": 0.9, "beyond": 0.0},
        "final_acc_start_all_wrong": 0.1,
        "distinct_prompts_trained": 100,
        "train_heldout_gap": 0.05,
        "step_s": 2.0,
    }
    rec.update(extra)
    return rec


def test_matched_budget_and_summary_against_hand_curves():
    # seed 1: grpo ends cheapest at 1000 tokens; verl_filtered pays 600 tokens offline (flat at 0.4)
    a = _record("grpo", 1, [(0, 0, 0.4), (500, 50, 0.5), (1000, 100, 0.6)])
    b = _record("verl_filtered", 1, [(600, 30, 0.4), (1400, 90, 0.8), (2000, 120, 0.9)])
    m = matched([a, b], "gen_tokens")
    assert m["budget"] == 1000
    assert m["acc"]["grpo"] == 0.6
    assert m["acc"]["verl_filtered"] == pytest.approx(0.4 + 0.4 * 400 / 800)  # 0.6
    w = matched([a, b], "wall_s")
    assert w["budget"] == 100 and w["acc"]["verl_filtered"] == pytest.approx(0.8 + 0.1 * 10 / 30)
    # seed 2: verl_filtered's pass costs more than grpo's whole run: it is still the start model
    c = _record("grpo", 2, [(0, 0, 0.5), (400, 40, 0.7)], final_acc_by_tier={"easy": 0.7})
    d = _record("verl_filtered", 2, [(600, 30, 0.5), (900, 60, 0.9)])
    s = summarize([a, b, c, d], ["grpo", "verl_filtered"])
    assert s["matched_budgets"] == {
        1: {"gen_tokens": 1000, "wall_s": 100},
        2: {"gen_tokens": 400, "wall_s": 40},
    }
    vf = s["arms"]["verl_filtered"]
    assert vf["acc_at_matched_tokens"]["values"] == pytest.approx([0.6, 0.5])
    assert vf["acc_at_matched_tokens"]["mean"] == pytest.approx(0.55)
    assert vf["acc_at_matched_tokens"]["sd"] == pytest.approx(math.sqrt(0.005))
    assert vf["acc_at_matched_wall"]["values"] == pytest.approx([0.8 + 0.1 / 3, 0.5 + 0.4 * 10 / 30])
    assert vf["final_acc"]["values"] == [0.9, 0.9] and vf["gen_tokens"]["mean"] == 1450
    g = s["arms"]["grpo"]
    assert g["final_acc_by_tier"]["easy"]["values"] == [0.9, 0.7]
    assert g["final_acc_by_tier"]["beyond"]["values"] == [0.0, None]
    table = markdown(s)
    assert "| verl_filtered | 0.900 ± 0.000 | 0.550 ± 0.071 |" in table
    assert "seed 1: 0.00 M tokens, 100 s; seed 2: 0.00 M tokens, 40 s" in table
    # a seed some arm has not finished gets no matched budget, but its runs are counted
    s = summarize([a, b, c], ["grpo", "verl_filtered"])
    assert list(s["matched_budgets"]) == [1] and s["arms"]["grpo"]["final_acc"]["values"] == [0.6, 0.7]


# ------------------------------------------------------------------ a run's record


Q = {"e1": "11 1)+1 2)+1 =", "e2": "20 1)-2 2)-2 =", "h1": "95 1)+7 2)+7 =", "b1": "150 1)-12 2)-12 ="}
VAL_TIERS = {Q["e1"]: "easy", Q["e2"]: "easy", Q["h1"]: "hard", Q["b1"]: "beyond"}


def _val_dump(d, step, right):
    """Two samples a chain; ``right``: the chain's number of right samples."""
    inputs, accs = [], []
    for key, k in right.items():
        for i in range(2):
            inputs.append(f"user\n{Q[key]}\nassistant\n")
            accs.append(1.0 if i < k else 0.0)
    dump_generations(d, step, inputs, ["..."] * len(inputs), ["0"] * len(inputs), accs, {"acc": accs})


def test_run_record_against_a_hand_run(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    rows = [
        {"step": 0, "val/acc": 0.375},
        {"step": 1, "timing_s/step": 2.0, "dynamic_sampling/generated_response_tokens": 100.0,
         "train/acc_generated": 0.2, "timing_s/gen": 1.0, "train/num_gen_batches": 1},
        {"step": 2, "timing_s/step": 4.0, "dynamic_sampling/generated_response_tokens": 300.0,
         "train/acc_generated": 0.6, "timing_s/gen": 3.0, "train/num_gen_batches": 3, "val/acc": 0.625},
    ]  # fmt: skip
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # step 0: e1 2/2, e2 1/2, h1 0/2, b1 0/2 -> h1 and b1 never solved; step 2: h1 1/2, b1 0/2
    _val_dump(run / "validation", 0, {"e1": 2, "e2": 1, "h1": 0, "b1": 0})
    _val_dump(run / "validation", 2, {"e1": 2, "e2": 2, "h1": 1, "b1": 0})
    for step, keys in ((1, ["e1", "h1"]), (2, ["h1", "b1"])):
        prompts = [f"user\n{Q[k]}\nassistant\n" for k in keys for _ in range(2)]
        dump_generations(run / "rollouts", step, prompts, ["x"] * 4, ["0"] * 4, [0.0] * 4, {"acc": [0.0] * 4})
    # two invocations (a resumed run): their CPU and wall seconds add up
    (run / "cpu_usage.jsonl").write_text('{"cpu_s": 3.0, "wall_s": 10.0}\n{"cpu_s": 1.0, "wall_s": 2.0}\n')
    train_tiers = {**VAL_TIERS, "99 1)+1 2)+1 =": "easy"}
    offline = {"generated_response_tokens": 1000.0, "wall_s": 10.0, "kept_rate": 0.5}
    rec = run_record(run, "verl_tuned", 1, VAL_TIERS, train_tiers, offline=offline, window=1)
    assert [(p["step"], p["wall_s"], p["gen_tokens"], p["acc"]) for p in rec["curve"]] == [
        (0, 10.0, 1000.0, 0.375),
        (2, 16.0, 1400.0, 0.625),
    ]
    assert rec["curve"][0]["acc_by_tier"] == {"easy": 0.75, "hard": 0.0, "beyond": 0.0}
    assert rec["curve"][1]["acc_by_tier"] == {"easy": 1.0, "hard": 0.5, "beyond": 0.0}
    assert rec["start_all_wrong_chains"] == 2
    assert rec["curve"][0]["acc_start_all_wrong"] == 0.0 and rec["final_acc_start_all_wrong"] == 0.25
    assert (rec["wall_s"], rec["gen_tokens"], rec["train_s"]) == (16.0, 1400.0, 6.0)
    assert rec["train_acc_generated_last"] == 0.6 and rec["train_heldout_gap"] == pytest.approx(-0.025)
    assert rec["distinct_prompts_trained"] == 3 and rec["pool_size"] == 5
    assert rec["distinct_prompts_trained_by_tier"] == {"beyond": 1, "easy": 1, "hard": 1}
    assert rec["step_s"] == 3.0 and rec["phase_s"]["gen"] == 2.0 and rec["rounds_per_step"] == 2.0
    assert (rec["process_cpu_s"], rec["process_wall_s"], rec["cpu_share"]) == (4.0, 12.0, 4.0 / 12.0)
    rec = run_record(run, "grpo", 1, VAL_TIERS, train_tiers, window=2)  # no offline pass
    assert rec["curve"][0]["wall_s"] == 0.0 and rec["gen_tokens"] == 400.0
    assert rec["train_acc_generated_last"] == pytest.approx(0.4)


def test_run_record_names_a_prompt_without_a_chain(tmp_path):
    run = tmp_path / "run"
    (run / "rollouts").mkdir(parents=True)
    (run / "metrics.jsonl").write_text(json.dumps({"step": 0, "val/acc": 0.5}) + "\n")
    dump_generations(run / "validation", 0, ["what is 2+2?"], ["4"], ["4"], [1.0], {"acc": [1.0]})
    with pytest.raises(ValueError, match=r"validation/0.jsonl line 1: no chain question"):
        run_record(run, "ours", 1, VAL_TIERS, VAL_TIERS)


# ------------------------------------------------------------------ the command


def _args(tmp_path, **kw):
    base = dict(
        seeds=[1], steps=20, test_freq=10, val_samples=-1, save_freq=10, margin=1.25,
        task="reasoning_wide", arms=list(bench.ARMS), parallel=2, out=tmp_path, overrides=[],
        records=tmp_path / "results", start_model="0123456789abcdef",
    )  # fmt: skip
    base.update(kw)
    return argparse.Namespace(**base)


def test_a_finished_run_is_read_not_run_again(tmp_path):
    args = _args(tmp_path)
    record = {"arm": "verl_tuned", "seed": 1, "final_acc": 0.61, "spec": bench.spec(args, "verl_tuned", 1)}
    bench.write_record(args.records, record)
    passes = bench.OfflinePasses(args)
    # read back whole: no offline pass, no run directory, no log
    assert bench.run_arm(args, "verl_tuned", 1, passes, task={}) == record
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results"]
    assert bench.finished_record(args.records, bench.spec(args, "verl_tuned", 1)) == record
    # another spec (more steps, another margin, other overrides, another warm start) is not its record
    for changed in (
        dict(steps=30),
        dict(margin=1.5),
        dict(overrides=["actor_rollout_ref.rollout.n=4"]),
        dict(start_model="fedcba9876543210"),
    ):
        other = bench.spec(_args(tmp_path, **changed), "verl_tuned", 1)
        assert bench.finished_record(args.records, other) is None, changed
    assert bench.finished_record(args.records, bench.spec(args, "verl_tuned", 2)) is None
    # the margin is verl_tuned's alone: another arm's record stands whatever the margin
    assert bench.spec(args, "ours", 1) == bench.spec(_args(tmp_path, margin=1.5), "ours", 1)


def test_every_arm_validates_and_a_bad_key_is_named(tmp_path):
    bench.check_arms(_args(tmp_path))  # the arms' keys exist and their values are accepted
    with pytest.raises(SystemExit, match=r"arm verl: .*algorithm\.filter_groups\.no_such_key"):
        bench.check_arms(_args(tmp_path, overrides=["algorithm.filter_groups.no_such_key=1"]))


def test_the_arms_differ_where_they_should(tmp_path):
    args = _args(tmp_path)
    task = {"train_batch_size": 8, "test_parquet": "/t/test.parquet"}
    offline = {
        "generated_response_tokens": 9.0,
        "wall_s": 1.0,
        "kept_rate": 0.2,
        "kept": 307,
        "prompts": 1536,
    }
    keys, cost = bench.arm_overrides(args, "verl_tuned", offline, tmp_path / "off", task)
    assert keys[-1] == "data.gen_batch_size=50" and cost["gen_batch_size"] == 50  # 8 / 0.2 * 1.25
    keys, cost = bench.arm_overrides(args, "verl_filtered", offline, tmp_path / "off", task)
    assert f"data.train_files={tmp_path / 'off' / 'filtered.parquet'}" in keys
    assert "data.val_files=/t/test.parquet" in keys and cost["wall_s"] == 1.0
    keys, cost = bench.arm_overrides(args, "verl", None, tmp_path, task)
    assert "actor_rollout_ref.actor.on_policy_fast_path=true" in keys and cost is None


def test_an_unfinished_run_of_the_same_config_is_continued_not_replaced(tmp_path):
    from reasoning_runs import PRESET, recorded_config, same_config, train_args

    from dapo.config.load import load_config, to_yaml
    from dapo.config.resolve import resolve

    args = train_args(1, 20, 10, ["data.builtin_task=reasoning_wide"])
    run = tmp_path / "run"
    run.mkdir()
    assert not recorded_config(run, args)  # nothing started there
    text = to_yaml(resolve(load_config([*args, f"trainer.default_local_dir={run}"], preset=PRESET)))
    (run / "config.yaml").write_text(text)
    # started with this configuration (where it ran aside): continued, but not read as finished
    assert recorded_config(run, args) and not same_config(run, args)
    assert not recorded_config(run, train_args(2, 20, 10, ["data.builtin_task=reasoning_wide"]))
    (run / "finished.json").write_text("{}")
    assert same_config(run, args)


def test_job_order_puts_each_seeds_pass_first_and_its_arms_last():
    order = bench.job_order([1, 2], ["verl", "verl_filtered", "verl_tuned", "ours", "grpo"])
    seed1 = ["offline_pass", "verl", "ours", "grpo", "verl_filtered", "verl_tuned"]
    assert order == [(1, j) for j in seed1] + [(2, j) for j in seed1]
    assert bench.job_order([3], ["ours", "grpo"]) == [(3, "ours"), (3, "grpo")]  # no pass needed


def test_run_measured_counts_the_childs_cpu_and_raises_on_failure():
    import subprocess

    from reasoning_runs import run_measured

    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"
    usage = run_measured([sys.executable, "-c", spin])
    assert usage["cpu_s"] >= 0.3 and usage["wall_s"] > 0
    with pytest.raises(subprocess.CalledProcessError) as e:
        run_measured([sys.executable, "-c", "raise SystemExit(3)"])
    assert e.value.returncode == 3


def test_a_killed_invocations_cpu_seconds_are_carried_into_the_run(tmp_path, monkeypatch):
    """A run killed with its benchmark (a session's end) keeps the CPU seconds it had used: the
    sampled partial file goes into the run's usage when the next invocation starts."""
    import signal
    import subprocess
    import threading

    import reasoning_runs as rr

    monkeypatch.setattr(rr, "PARTIAL_EVERY_S", 0.05)
    marker = tmp_path / "spun"
    child = (
        "import time, pathlib\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
        f"pathlib.Path({str(marker)!r}).touch()\ntime.sleep(3600)"
    )
    partial = tmp_path / rr.PARTIAL_FILE
    failed: list[BaseException] = []

    def run() -> None:
        try:
            rr.run_measured([sys.executable, "-c", child], partial)
        except subprocess.CalledProcessError as e:
            failed.append(e)

    worker = threading.Thread(target=run)
    worker.start()
    while not (marker.exists() and partial.exists() and json.loads(partial.read_text())["cpu_s"] >= 0.3):
        threading.Event().wait(0.05)
    pid = next(int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _is_child(p, marker))
    os.kill(pid, signal.SIGKILL)
    worker.join()
    assert failed and failed[0].returncode == -signal.SIGKILL
    rr.carry_partial(tmp_path)
    assert not partial.exists()
    (row,) = [json.loads(x) for x in (tmp_path / rr.CPU_FILE).read_text().splitlines()]
    assert row["killed"] is True and row["cpu_s"] >= 0.3
    assert rr.run_usage(tmp_path)["cpu_s"] == row["cpu_s"]


def _is_child(proc_dir: Path, marker: Path) -> bool:
    try:
        return str(marker) in (proc_dir / "cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
