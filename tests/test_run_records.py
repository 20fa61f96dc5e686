"""The batcher's per-group records and groups.jsonl (dapo.outputs.records)."""

from __future__ import annotations

import json

import torch
from hypothesis import given, settings
from hypothesis import strategies as hs

from dapo.config.sampling import FilterGroupsConfig
from dapo.outputs.records import GroupRecorder, read_groups, read_metrics, summarize_step
from dapo.sampling import DynamicBatcher
from dapo.sampling.fakes import FakeRollout, ListSource, prompt_rows, scripted

torch.set_num_threads(1)


def _verl_step(table, *, enable=True, B=2, Bg=3, n=2):
    cfg = FilterGroupsConfig(enable=enable, metric="acc", strategy="verl", on_exhausted="error")
    src = ListSource(prompt_rows(len(table)), shuffle=False)
    gen = FakeRollout(n, scripted(table), response_length=8, seed=0)
    return DynamicBatcher(cfg, B, Bg, n, 0).next_batch(src, gen)


def test_batcher_records_every_generated_group_with_fate_round_and_mean():
    table = {0: [[1, 1]], 1: [[0, 1]], 2: [[0, 0]], 3: [[1, 0]], 4: [[0, 1]], 5: [[1, 1]]}
    step = _verl_step(table)
    recs = step.group_records
    assert [(r["round"], r["index"], r["fate"], r["mean"]) for r in recs] == [
        (1, 0, "filtered_all_correct", 1.0),
        (1, 1, "kept", 0.5),
        (1, 2, "filtered_all_wrong", 0.0),
        (2, 3, "kept", 0.5),
        (2, 4, "kept", 0.5),  # kept, then dropped by verl's trim: still a kept group
        (2, 5, "filtered_all_correct", 1.0),
    ]
    assert all(r["n"] == 2 and len(r["response_lengths"]) == 2 for r in recs)
    assert all(1 <= x <= 8 for r in recs for x in r["response_lengths"])
    # the counts agree with the batcher's own metrics
    m = step.metrics
    assert sum(r["fate"] == "kept" for r in recs) == m["dynamic_sampling/kept_groups"]
    assert (
        sum(r["fate"] == "filtered_all_correct" for r in recs) == m["dynamic_sampling/filtered_all_correct"]
    )


def test_filtering_disabled_records_all_groups_as_kept():
    step = _verl_step({0: [[1, 1]], 1: [[0, 1]], 2: [[0, 0]]}, enable=False)
    assert [(r["fate"], r["mean"]) for r in step.group_records] == [
        ("kept", 1.0),
        ("kept", 0.5),
        ("kept", 0.0),
    ]


def test_default_strategy_records_rounds():
    cfg = FilterGroupsConfig(
        enable=True, metric="acc", strategy="default", max_num_gen_batches=5, on_exhausted="train"
    )
    table = {i: [[1, 1]] if i % 2 else [[0, 1]] for i in range(8)}
    src = ListSource(prompt_rows(8), shuffle=False)
    step = DynamicBatcher(cfg, 3, 4, 2, 0).next_batch(src, FakeRollout(2, scripted(table)))
    fates = [r["fate"] for r in step.group_records]
    assert fates.count("kept") == step.metrics["dynamic_sampling/kept_groups"]
    assert max(r["round"] for r in step.group_records) == step.metrics["train/num_gen_batches"]


def test_summarize_step_hand_example():
    recs = [
        {"round": 1, "fate": "kept", "n": 4, "mean": 0.25, "response_lengths": [1, 7, 8, 16]},
        {"round": 1, "fate": "kept", "n": 4, "mean": 0.25, "response_lengths": [2, 2, 2, 2]},
        {"round": 2, "fate": "filtered_all_wrong", "n": 4, "mean": 0.0, "response_lengths": [16, 16, 0, 3]},
    ]
    line = summarize_step(5, recs, skipped_prompts=2, max_response_length=16, overlong_buffer_len=4)
    assert line["groups"] == [
        {"mean": 0.25, "n": 4, "fate": "kept", "round": 1, "count": 2},
        {"mean": 0.0, "n": 4, "fate": "filtered_all_wrong", "round": 2, "count": 1},
    ]
    assert line["rounds"] == 2 and line["skipped_prompts"] == 2
    # 64 bins over [0, 16] -> width 1, 17 bins; 16 lands in the last bin
    h = line["response_length_hist"]
    assert h["bin_width"] == 1 and len(h["counts"]) == 17
    assert h["counts"][16] == 3 and h["counts"][2] == 4 and sum(h["counts"]) == 12
    assert line["response_length"]["clipped"] == 3 and line["response_length"]["max"] == 16


@settings(max_examples=40, deadline=None)
@given(
    hs.lists(
        hs.tuples(
            hs.integers(1, 3),
            hs.sampled_from(["kept", "filtered_all_correct", "filtered_all_wrong"]),
            hs.lists(hs.integers(0, 300), min_size=1, max_size=6),
        ),
        max_size=30,
    ),
    hs.integers(1, 300),
)
def test_summarize_keeps_every_group_and_response(groups, R):
    recs = [
        {
            "round": r,
            "fate": f,
            "n": len(ls),
            "mean": sum(x % 2 for x in ls) / len(ls),
            "response_lengths": ls,
        }
        for r, f, ls in groups
    ]
    line = summarize_step(1, recs, max_response_length=R)
    assert sum(g["count"] for g in line["groups"]) == len(recs)
    total = sum(len(ls) for _, _, ls in groups)
    assert sum(line.get("response_length_hist", {}).get("counts", [])) == total
    json.dumps(line)  # JSON-able


def test_recorder_roundtrip_resume_and_torn_line(tmp_path):
    table = {0: [[1, 1]], 1: [[0, 1]], 2: [[0, 0]], 3: [[1, 0]], 4: [[0, 1]], 5: [[1, 1]]}
    step = _verl_step(table)
    rec = GroupRecorder(
        tmp_path, max_response_length=8, overlong_buffer_len=2, rollout_data_dir=str(tmp_path / "r")
    )
    rec.write(1, step)
    rec.write(2, step)
    rec.write(2, step)  # resumed run repeats step 2
    with (tmp_path / "groups.jsonl").open("a") as f:
        f.write('{"step": 3, "gro')  # killed mid-write
    got = read_groups(tmp_path)
    assert list(got) == [1, 2]
    assert sum(g["count"] for g in got[1]["groups"]) == 6
    assert got[1]["max_response_length"] == 8 and got[1]["overlong_buffer_len"] == 2
    info = json.loads((tmp_path / "viewer.json").read_text())
    assert info["rollout_data_dir"] == str((tmp_path / "r").resolve())


def test_recorder_never_raises_and_the_report_refreshes_on_schedule(tmp_path, monkeypatch):
    rec = GroupRecorder(tmp_path)
    rec.write(1, object())  # not a SampledStep: warns, no exception
    calls, lines = [], []
    import dapo.viewer.report as report

    monkeypatch.setattr(report, "build_report", lambda d: calls.append(d) or d)
    assert report.refresh_report(tmp_path, 1, 2, False, log=lines.append) is None
    report.refresh_report(tmp_path, 2, 2, False, log=lines.append)
    report.refresh_report(tmp_path, 3, 2, True, log=lines.append)
    assert calls == [tmp_path, tmp_path]
    monkeypatch.setattr(report, "build_report", lambda d: 1 / 0)
    assert report.refresh_report(tmp_path, 4, 2, False, log=lines.append) is None  # never stops training
    assert lines == [f"could not refresh the report in {tmp_path}: division by zero"]
    assert report.refresh_report(tmp_path, 4, 0, True, log=lines.append) is None  # report_freq 0: off
    assert calls == [tmp_path, tmp_path]


def test_read_metrics_merges_rows_of_one_step(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(
        '{"step": 0, "val/acc": 0.1}\n{"step": 1, "a": 1}\n{"step": 1, "val/acc": 0.2}\nnot json\n'
    )
    assert read_metrics(tmp_path) == {0: {"step": 0, "val/acc": 0.1}, 1: {"step": 1, "a": 1, "val/acc": 0.2}}
