"""The default preset learns: held-out accuracy rises well above the warm start.

Builds the built-in tiny model on first use (a few minutes; the test session keeps it in its
own cache, see conftest.py), then runs a short form of `make demo`.
"""

import pytest

from dapo.cli import main
from runs import metric_rows, run_summary


@pytest.mark.slow
def test_default_preset_learns(tmp_path):
    run_dir = tmp_path / "run"
    rc = main(
        [
            "train",
            f"trainer.default_local_dir={run_dir}",
            "trainer.total_training_steps=16",
            "trainer.test_freq=-1",
            "trainer.report_freq=0",
            "trainer.logger=[jsonl]",
        ]
    )
    assert rc == 0
    summary = run_summary(run_dir)
    before, after = summary["val_acc_before"], summary["val_acc_after"]
    assert after >= before + 0.15, (before, after)
    rows = metric_rows(run_dir)
    trained = [r for r in rows if "train/num_gen_batches" in r]
    assert len(trained) == 16
    # dynamic sampling really filtered groups on this task
    assert sum(r["dynamic_sampling/filtered_groups"] for r in trained) > 0
