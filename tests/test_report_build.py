"""dapo report: one self-contained HTML page plus the figures as PNG, from a run directory."""

from __future__ import annotations

import re

import pytest
import torch

pytest.importorskip("matplotlib", reason="the report needs the 'report' extra (matplotlib)")

from dapo.viewer.report import FIGURES, build_report, load_run  # noqa: E402
from runs import metric_rows  # noqa: E402
from synthetic_runs import write_synthetic_run  # noqa: E402

torch.set_num_threads(1)
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return write_synthetic_run(tmp_path_factory.mktemp("run"), steps=6, test_freq=3)


def _cli(argv):
    from dapo.cli import main

    return main(argv)


def test_report_from_synthetic_run_is_self_contained(run_dir, tmp_path, capsys):
    out = tmp_path / "sub" / "r.html"
    assert _cli(["report", str(run_dir), "--output", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    page = out.read_text()
    # every figure is drawn (the synthetic run has all the data) and embedded
    imgs = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(imgs) == len(FIGURES)
    assert "Not shown" not in page
    # nothing is fetched from elsewhere
    assert not re.search(r'(src|href)="(?!data:)', page)
    for spec in FIGURES:
        png = tmp_path / "sub" / f"r_{spec.name}.png"
        assert png.read_bytes()[:8] == PNG, spec.name
        assert f'id="{spec.name}"' in page
    # the summary table counts what the batcher reported
    metrics = metric_rows(run_dir)
    kept = sum(m.get("dynamic_sampling/kept_groups", 0) for m in metrics)
    assert re.search(rf"<td>kept</td><td>{kept} \(", page)


def test_default_output_is_in_the_run_dir(run_dir):
    out = build_report(run_dir)
    assert out == run_dir / "report.html" and out.is_file()
    assert (run_dir / "report_group_accuracy.png").is_file()


def test_heatmap_counts_every_generated_group(run_dir):
    from dapo.viewer.report import fig_group_heatmap

    run = load_run(run_dir)
    fig, why = fig_group_heatmap(run)
    assert why is None
    mesh = fig.axes[0].collections[0]
    total = sum(g["count"] for line in run.groups.values() for g in line["groups"])
    assert mesh.get_array().sum() == total
    gen = sum(m.get("dynamic_sampling/generated_groups", 0) for m in run.metrics.values())
    assert total == gen


def test_metrics_only_run_lists_what_is_missing(run_dir, tmp_path):
    (tmp_path / "metrics.jsonl").write_text((run_dir / "metrics.jsonl").read_text())
    page = build_report(tmp_path).read_text()
    assert "Not shown" in page and "groups.jsonl" in page
    # the length figure falls back to the trained batch's response_length/* metrics
    assert 'id="response_length"' in page and 'id="fates"' in page


def test_empty_dir_is_a_clear_error(tmp_path, capsys):
    assert _cli(["report", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"dapo: {tmp_path}: neither metrics.jsonl nor groups.jsonl found; pass the run directory "
        "(trainer.default_local_dir) of a run that logged with trainer.logger containing jsonl\n"
    )
    assert _cli(["report", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err == f"dapo: {tmp_path / 'nope'}: no such run directory\n"


def test_coverage_rows_and_figure_read_the_batcher_figures(run_dir):
    from dapo.viewer.report import _summary_rows, fig_coverage

    run = load_run(run_dir)
    metrics = metric_rows(run_dir)
    last = [m for m in metrics if "dynamic_sampling/coverage/rolled_out_prompts" in m][-1]
    c = {k.removeprefix("dynamic_sampling/coverage/"): v for k, v in last.items() if "/coverage/" in k}
    rows = dict(_summary_rows(run))
    pool = c["rolled_out_prompts"] + c["never_rolled_out"]
    assert (
        rows["prompts rolled out / trained"]
        == f"{c['rolled_out_prompts']:.0f} / {c['trained_prompts']:.0f} of {pool:.0f}"
    )
    assert rows["trained groups to the most-trained 10% of the pool"] == f"{c['top10_trained_share']:.0%}"
    against = sum(m.get("dynamic_sampling/coverage/skipped_with_spread", 0) for m in metrics)
    assert rows["skips of a prompt whose last group had spread"] == f"{against:.0f}"
    fig, why = fig_coverage(run)
    assert fig is not None and why is None
    assert fig_coverage(type(run)(run.run_dir, {}, {}, {}, {}))[1].startswith("no dynamic_sampling/coverage")
