"""Trackers write what they are given and it reads back: tensorboard event files, a wandb offline
run, an mlflow local store; console/jsonl keep their behaviour; a missing package names its extra."""

from __future__ import annotations

import json
import struct
import sys

import pytest

from dapo.outputs.tracking import (
    LEGEND,
    ConsoleTracker,
    JsonlTracker,
    TrackerUnavailable,
    build_trackers,
    mlflow_key,
)
from runs import metric_rows

STEPS = {
    1: {"actor/pg_loss": 0.25, "val-core/arithmetic/acc/mean@4": 0.5, "train/num_gen_batches": 2},
    2: {"actor/pg_loss": -0.125, "val-core/arithmetic/acc/mean@4": 0.75, "train/num_gen_batches": 1},
    3: {"actor/pg_loss": 1.5, "train/num_gen_batches": 3, "note": "text", "missing": None},
}


def _log_all(tracker):
    for step, metrics in STEPS.items():
        tracker.log(dict(metrics), step)
    tracker.close()


def test_jsonl_and_console_unchanged(tmp_path):
    t = JsonlTracker(tmp_path)
    t.log({"a": 1.0, "b": float("nan")}, 1)
    t.close()
    assert metric_rows(tmp_path) == [{"step": 1, "a": 1.0, "b": None}]
    lines = []
    c = ConsoleTracker(lines.append)
    c.log({"train/num_gen_batches": 2.0, "actor/pg_loss": 0.5, "val-core/x/acc/mean@2": 0.25}, 3)
    assert lines[: len(LEGEND)] == list(LEGEND)
    assert lines[len(LEGEND) :] == [
        "step 3 | rounds 2 | pg_loss +0.5000",
        "  validation x: accuracy 0.250 (mean of 2)",
    ]
    c.log({"train/num_gen_batches": 1.0}, 4)  # the legend is said once
    assert lines[-1] == "step 4 | rounds 1" and lines.count(LEGEND[0]) == 1


def test_unknown_tracker_is_named(tmp_path):
    with pytest.raises(ValueError, match="'nope'.*console, jsonl, tensorboard, wandb, mlflow"):
        build_trackers(["nope"], tmp_path, print)


@pytest.mark.parametrize(
    "name,module", [("tensorboard", "tensorboard"), ("wandb", "wandb"), ("mlflow", "mlflow")]
)
def test_missing_package_names_the_extra(tmp_path, monkeypatch, name, module):
    monkeypatch.setitem(sys.modules, module, None)  # makes `import module` raise ImportError
    with pytest.raises(TrackerUnavailable, match=rf"pip install 'dapo\[{name}\]'"):
        build_trackers([name], tmp_path, print)


def test_tensorboard_event_files_read_back(tmp_path):
    pytest.importorskip(
        "tensorboard", reason="needs the 'tensorboard' extra: pip install 'dapo[tensorboard]'"
    )
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (t,) = build_trackers(["tensorboard"], tmp_path, print)
    _log_all(t)
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"actor/pg_loss", "val-core/arithmetic/acc/mean@4", "train/num_gen_batches"} <= tags
    assert "note" not in tags and "missing" not in tags
    got = {(e.step, e.value) for e in acc.Scalars("actor/pg_loss")}
    assert got == {(1, 0.25), (2, -0.125), (3, 1.5)}
    assert [(e.step, e.value) for e in acc.Scalars("val-core/arithmetic/acc/mean@4")] == [(1, 0.5), (2, 0.75)]


def _wandb_records(path):
    """Parse a wandb transaction log (``run-<id>.wandb``): a 7-byte header then LevelDB-style
    32 KiB blocks of records (crc32, length, type), each a serialized ``Record`` protobuf."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, out, buf = 32768, 7, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:
            pos += left
            continue
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            out.append(chunk)
        elif kind == 2:
            buf = chunk
        elif kind == 3:
            buf += chunk
        else:
            out.append(buf + chunk)
            buf = b""
    records = []
    for raw in out:
        rec = pb.Record()
        rec.ParseFromString(raw)
        records.append(rec)
    return records


def test_wandb_offline_run_read_back(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="needs the 'wandb' extra: pip install 'dapo[wandb]'")
    monkeypatch.delenv("WANDB_MODE", raising=False)  # offline is the default
    monkeypatch.setenv("WANDB_SILENT", "true")
    (t,) = build_trackers(
        ["wandb"], tmp_path, print, project_name="proj", experiment_name="exp", config={"data": {"seed": 7}}
    )
    assert t.mode == "offline"
    _log_all(t)
    run_id = (tmp_path / "wandb_run_id.txt").read_text().strip()
    (run_file,) = (tmp_path / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb")
    records = _wandb_records(run_file)
    kinds = [r.WhichOneof("record_type") for r in records]
    runs = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert len(runs) == 1, kinds
    run = runs[0]
    assert (run.run_id, run.project, run.display_name) == (run_id, "proj", "exp")
    config = {i.key: json.loads(i.value_json) for i in run.config.update}
    assert config["data"] == {"seed": 7}
    history = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            history[r.history.step.num] = {
                (i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item
            }
    assert sorted(history) == [1, 2, 3]
    for step, metrics in STEPS.items():
        for k, v in metrics.items():
            if v is None:
                assert k not in history[step]
            else:
                assert history[step][k] == v, (step, k)


def test_mlflow_local_store_read_back_and_resume(tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="needs the 'mlflow' extra: pip install 'dapo[mlflow]'")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    from mlflow.tracking import MlflowClient

    (t,) = build_trackers(
        ["mlflow"], tmp_path, print, project_name="proj", experiment_name="exp", config={"a": 1}
    )
    _log_all(t)
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").resolve().as_uri())
    run = client.get_run(t.run_id)
    assert run.info.run_name == "exp" and run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "proj"
    hist = client.get_metric_history(t.run_id, "actor/pg_loss")
    assert sorted((m.step, m.value) for m in hist) == [(1, 0.25), (2, -0.125), (3, 1.5)]
    key = mlflow_key("val-core/arithmetic/acc/mean@4")
    assert key == "val-core/arithmetic/acc/mean_at_4"
    assert sorted((m.step, m.value) for m in client.get_metric_history(t.run_id, key)) == [
        (1, 0.5),
        (2, 0.75),
    ]
    assert "note" not in run.data.metrics
    # a resumed run (same run dir) keeps logging into the same mlflow run
    (t2,) = build_trackers(["mlflow"], tmp_path, print, project_name="proj", experiment_name="exp")
    assert t2.run_id == t.run_id
    t2.log({"actor/pg_loss": 2.0}, 4)
    t2.close()
    assert len(client.get_metric_history(t.run_id, "actor/pg_loss")) == 4


def test_mlflow_key_sanitizer():
    assert mlflow_key("a/b-c.d e:f_g") == "a/b-c.d e:f_g"
    assert mlflow_key("x@8(y)") == "x_at_8_y_"
