"""The step-time model behind `dapo bench cluster` (dapo.bench.step_model), against hand-computed
numbers, and the command's calibration and verl check on the recorded runs."""

from __future__ import annotations

import json

import pytest

from dapo.bench.step_model import (
    Gpu,
    LinearCost,
    Model,
    RooflineCost,
    Workload,
    best_split,
    decode_time,
    full_engine_time,
    predict_step,
    update_time,
)

STEPS = LinearCost(step_s=1.0, row_s=0.0)
ROWS = LinearCost(step_s=0.0, row_s=1.0)
CTX = LinearCost(step_s=0.0, row_s=0.0, ctx_s=1.0)


def test_a_round_costs_its_longest_response_in_steps_and_its_tokens_in_rows():
    assert decode_time([1, 2, 3], 0, STEPS) == 3.0  # three engine steps, the batch shrinking
    assert decode_time([1, 2, 3], 0, ROWS) == 6.0  # 3 + 2 + 1 rows
    # contexts: step 0 three rows at 10, step 1 two at 11, step 2 one at 12
    assert decode_time([1, 2, 3], 10, CTX) == 3 * 10 + 2 * 11 + 12
    # one row over a 3-step span: contexts 10, 11, 12 (the middle context times three)
    assert decode_time([3], 10, CTX) == 33.0
    assert decode_time([0, 0], 5, STEPS) == 0.0


def test_a_row_cap_queues_sequences_continuous_batching():
    assert decode_time([2, 3], 0, STEPS, max_rows=1) == 5.0  # one after the other
    assert decode_time([2, 3], 0, STEPS, max_rows=2) == 3.0
    # cap 2 over [1, 3, 2]: 1 and 3 start; at step 1 the 2 enters and ends at 3 with the 3
    assert decode_time([1, 3, 2], 0, STEPS, max_rows=2) == 3.0
    assert decode_time([1, 3, 2], 0, ROWS, max_rows=2) == 6.0  # rows = tokens, whatever the order
    # the 2 entering at step 1 starts from the prompt: contexts 0,1,2 (the 3) + 0 (the 1) + 0,1 (the 2)
    assert decode_time([1, 3, 2], 0, CTX, max_rows=2) == 3 + 0 + 1


def test_an_engine_that_never_drains_pays_tokens_over_rows():
    assert full_engine_time([2, 2, 4], 0, STEPS, rows=2) == 4.0  # 8 tokens, 2 a step
    # mean context before a token: sum L(L-1)/2 / sum L = (1 + 1 + 6) / 8 = 1; 4 steps of 2 rows
    assert full_engine_time([2, 2, 4], 0, CTX, rows=2) == 8.0
    # the same tokens in a round wait for the 4: 4 steps, and the full engine halves the steps
    assert decode_time([2, 2, 4], 0, STEPS) == 4.0 and full_engine_time([2, 2, 4], 0, STEPS, rows=3) == 8 / 3


def test_roofline_step_is_the_longer_of_reading_and_computing():
    m = Model("m", params=1e9, active_params=1e9, layers=2, d_model=8, kv_bytes_per_token=1e3)
    g = Gpu("g", peak_flops=1e12, hbm_bytes_s=1e12)
    c = RooflineCost(m, g, tp=2, bw_eff=0.5, decode_mfu=0.5, prefill_mfu=1.0, overhead_s=0.001)
    # reading 2e9 weight bytes + 1e6 KV bytes at 2 x 1e12 x 0.5: 2.001e-3 s; computing one row
    # 2e9 FLOPs at 2 x 1e12 x 0.5: 2e-3 s
    assert c.step(1, 1e3) == pytest.approx(2.001e-3 + 0.001)
    # 10 rows: 2e-2 s of compute beats the reading
    assert c.step(10, 1e3) == pytest.approx(2e-2 + 0.001)
    assert c.prefill(100) == pytest.approx(2e9 * 100 / 2e12)


def test_update_time_counts_passes_of_parameters_and_attention():
    m = Model("m", params=1e9, active_params=5e8, layers=4, d_model=10, kv_bytes_per_token=0)
    g = Gpu("g", peak_flops=1e12, hbm_bytes_s=1e12)
    # per token a forward is 2 x 5e8 + 2 x 4 x 10 x 100 = 1e9 + 8000; 4 passes, 1e4 tokens, 2 GPUs at 0.5
    assert update_time(1e4, 100, m, 2, g, 0.5) == pytest.approx(4 * (1e9 + 8000) * 1e4 / 1e12)


def _workload(**kw) -> Workload:
    base = dict(
        rounds={"verl": [[4, 4], [4, 4]], "default": [[1, 4]]},
        prompt_len=0,
        engines=1,
        rows=8,
        train_s=3.0,
        sync_s=0.5,
        stream=[1, 4],
        steady=[1, 4],
    )
    return Workload(**{**base, **kw})


def test_strategies_add_or_overlap_generation_and_training():
    w = _workload()
    assert predict_step("verl", w, STEPS).wall_s == 4 + 4 + 3 + 0.5  # two rounds of 4 steps
    assert predict_step("default", w, STEPS).wall_s == 4 + 3 + 0.5
    assert predict_step("stream", w, STEPS).gen_s == 4.0
    # 5 tokens on an engine that keeps both rows busy: 2.5 steps
    assert predict_step("async_partial", w, STEPS).wall_s == 2.5 + 3 + 0.5
    # overlapped on half the devices each: training takes twice as long, generation spread over
    # the one engine left (floor(1 x 0.5) is 0: at least one)
    t = predict_step("one_step_off", _workload(engines=2, gen_share=0.5), STEPS)
    assert (t.gen_s, t.train_s, t.wall_s) == (4.0, 6.0, 6.5)
    share, best = best_split("one_step_off", _workload(engines=4), STEPS, (0.5, 0.75))
    # 3 engines at 3/4: [1, 4] still needs 4 steps; training 3 / 0.25 = 12 (worse than 6 at 1/2)
    assert share == 0.5 and best.wall_s == 6.5
    assert predict_step("verl", _workload(engines=2), STEPS).gen_s == 8.0  # one sequence an engine
    with pytest.raises(ValueError, match="unknown strategy 'nope'"):
        predict_step("nope", w, STEPS)


def test_round_spreads_sequences_over_engines_and_waits_for_the_slowest():
    w = _workload(rounds={"default": [[1, 1, 1, 9]]}, engines=2)
    # round robin: engine 0 gets [1, 1], engine 1 [1, 9]: the round lasts 9 steps
    assert predict_step("default", w, STEPS).gen_s == 9.0
    assert predict_step("default", w, ROWS).gen_s == 10.0


def _synthetic_runs() -> dict:
    """Runs whose times follow the fitted form exactly: generation 2 ms a step + 0.1 ms a row,
    update 0.2 s + 0.5 ms a trained token (+ 0.3 ms when old log-probs were recomputed), the
    rest 0.05 s."""
    runs = {}
    for i, (rounds, gen_tokens, trained, old) in enumerate(
        [(1, 1000, 700, 0), (2, 2000, 1400, 0), (1, 3000, 2800, 1), (3, 2500, 1400, 0), (2, 1500, 2100, 1)]
    ):
        s = {
            "rounds": rounds,
            "max_response": 20,
            "gen_tokens": gen_tokens,
            "gen_groups": 16,
            "prompt_len": 0.0,
        }
        s |= {"trained_tokens": trained, "trained_rows": 16, "old_log_prob": float(old)}
        s["gen_s"] = 0.002 * rounds * 20 + 0.0001 * gen_tokens
        s["update_s"] = 0.2 + 0.0005 * trained + 0.0003 * trained * old
        s["wall_s"] = s["gen_s"] + s["update_s"] + 0.05
        slow = {**s, **{k: s[k] * 3 for k in ("wall_s", "gen_s", "update_s")}, "cpu_share": 1 / 3}
        runs[f"r{i}"] = {"n": 8, "steps": [s, slow]}
    return runs


def test_cpu_fit_recovers_a_known_cost_and_predicts_held_out_runs():
    from dapo.bench.cluster import fit_cpu, leave_one_out, run_summary

    runs = _synthetic_runs()
    # the second step ran at a third of a core: in CPU seconds it is the first step again
    assert run_summary(runs["r0"])["wall_s"] == pytest.approx(runs["r0"]["steps"][0]["wall_s"])
    fit = fit_cpu(runs)
    assert (fit.cost.step_s, fit.cost.row_s) == (pytest.approx(0.002), pytest.approx(0.0001))
    assert fit.update == pytest.approx([0.2, 0.0005, 0.0003], abs=1e-9)
    for r in leave_one_out(runs):
        assert abs(r["wall_error"]) < 1e-6 and abs(r["gen_error"]) < 1e-6


def test_recorded_cpu_runs_held_out_errors():
    """The recorded runs (in the trainer's CPU seconds per step, two cores at load about 3): every
    held-out prediction is within the 20% the model is meant to reach."""
    from dapo.bench.cluster import leave_one_out
    from dapo.bench.cluster_data import RUNS

    out = leave_one_out(RUNS["runs"])
    assert len(out) == len(RUNS["runs"]) >= 5
    assert all(abs(r["wall_error"]) <= 0.2 for r in out), out


def test_verl_ratio_is_reproduced_and_predictions_print(capsys):
    from dapo.bench.cluster import VERL_RATIO, verl_check
    from dapo.cli import main

    published = VERL_RATIO[1] / VERL_RATIO[0]
    assert published == pytest.approx(0.646, abs=1e-3)
    mid = next(r for r in verl_check() if r["sigma"] == 0.8)
    assert abs(mid["ratio"] - published) <= 0.1
    assert main(["bench", "cluster"]) == 0
    out = capsys.readouterr().out
    assert "Predicted wall per step" in out
    for name in ("verl", "default", "stream", "one_step_off", "async_partial"):
        assert f" {name} " in out
    assert main(["bench", "cluster", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["verl_check_passed"] is True and len(got["predictions"]) == 10
    assert got["cpu_within_20_percent"] is (got["cpu_worst_error"] <= 0.2)
