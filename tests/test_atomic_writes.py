"""A file a run writes whole (finished.json, summary.json, viewer.json, dumps, the rows rewritten
on a resume, the latest-checkpoint pointer) that cannot be written, for a full disk or any other
OSError, leaves no temporary file, leaves the old file as it was, and ends the command with one
`dapo:` line naming the file and what to do."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
import torch

from dapo import atomic
from dapo.atomic import WriteError
from dapo.checkpoint.manifest import CheckpointError
from dapo.cli import main
from dapo.errors import DapoError
from dapo.outputs import dumps, rundir, tracking
from runs import small_run_args

torch.set_num_threads(1)


def _temp_files(d: Path) -> list[str]:
    return sorted(p.name for p in d.rglob(".*.tmp*"))


def _enospc_for(name: str, monkeypatch) -> None:
    """``os.replace`` onto a file called ``name`` fails as on a full disk."""
    real = os.replace

    def replace(src, dst, *a, **k):
        if Path(dst).name == name:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(src, dst, *a, **k)

    monkeypatch.setattr(os, "replace", replace)


def _config():
    from dapo.run_config import build_run_config

    return build_run_config(["trainer.total_training_steps=2"]).cfg


@pytest.mark.parametrize("name", ["finished.json", "summary.json", "metrics.jsonl", "3.jsonl"])
def test_every_atomic_write_of_a_run_removes_its_temp_file_and_names_the_file(name, tmp_path, monkeypatch):
    old = '{"step": 1}\n{"step": 2}\n'
    (tmp_path / name).write_text(old)
    writes = {
        "finished.json": lambda: rundir.mark_finished(tmp_path, _config(), 2),
        "summary.json": lambda: tracking.write_summary(tmp_path, {}, {}, steps=2),
        "metrics.jsonl": lambda: rundir.keep_rows_through(tmp_path / "metrics.jsonl", 1),
        "3.jsonl": lambda: dumps.dump_generations(tmp_path, 3, ["q"], ["a"], [1], [1.0]),
    }
    _enospc_for(name, monkeypatch)
    with pytest.raises(WriteError) as e:
        writes[name]()
    assert isinstance(e.value, DapoError) and isinstance(e.value, OSError)
    msg = str(e.value)
    assert msg.startswith(f"cannot write {tmp_path / name}: No space left on device; free space on that disk")
    assert "\n" not in msg and "run the same command again" in msg
    assert _temp_files(tmp_path) == []
    assert (tmp_path / name).read_text() == old, "the file being replaced is left as it was"


def test_a_write_that_fails_part_way_removes_its_temp_file(tmp_path, monkeypatch):
    real = os.fsync

    def fsync(fd):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(WriteError) as e:
        atomic.write_text(tmp_path / "x.txt", "text", fsync=True)
    assert (
        str(e.value)
        == f"cannot write {tmp_path / 'x.txt'}: Read-only file system; make its directory writable"
    )
    monkeypatch.setattr(os, "fsync", real)
    assert list(tmp_path.iterdir()) == []
    # an exception from the caller's own block removes it too, and stays what it was
    with pytest.raises(KeyError), atomic.replacing(tmp_path / "y.txt") as f:
        f.write("half")
        raise KeyError("the caller's")
    assert list(tmp_path.iterdir()) == []


def test_the_latest_checkpoint_pointer_removes_its_temp_file_on_failure(tmp_path, monkeypatch):
    from dapo.checkpoint.store import LATEST_FILE, _write_atomic

    (tmp_path / LATEST_FILE).write_text("1\n")
    _enospc_for(LATEST_FILE, monkeypatch)
    with pytest.raises(
        CheckpointError, match=f"cannot write {tmp_path / LATEST_FILE}: No space left on device"
    ):
        _write_atomic(tmp_path / LATEST_FILE, "2\n")
    assert _temp_files(tmp_path) == [] and (tmp_path / LATEST_FILE).read_text() == "1\n"


@pytest.mark.slow
def test_a_full_disk_at_the_end_of_a_run_is_one_line_and_leaves_no_temp_file(
    tmp_path, tiny_random_model_dir, mod3_task, monkeypatch, capsys
):
    run = tmp_path / "run"
    _enospc_for("finished.json", monkeypatch)
    real = os.replace

    def report_fails(src, dst, *a, **k):  # the report too: it is rebuilt after the last step
        if Path(dst).name == "report.html":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(src, dst, *a, **k)

    monkeypatch.setattr(os, "replace", report_fails)
    capsys.readouterr()
    assert main([*small_run_args(run, tiny_random_model_dir, mod3_task, 1), "trainer.report_freq=1"]) == 2
    out, err = capsys.readouterr()
    assert f"could not refresh the report in {run}: cannot write {run / 'report.html'}" in out + err
    assert "Traceback" not in err
    assert [line for line in err.splitlines() if line.startswith("dapo:")] == [
        f"dapo: cannot write {run / 'finished.json'}: No space left on device; free space on that disk. "
        f"The run trained to its last step (1) and wrote its summary; to record it as finished, {rundir.RERUN}"
    ]
    assert _temp_files(run) == [] and not (run / "finished.json").exists()
    assert json.loads((run / "summary.json").read_text())["steps"] == 1
