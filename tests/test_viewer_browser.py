"""dapo view: the rollout browser driven headless with textual's pilot, and its lazy dump access."""

from __future__ import annotations

import argparse
import asyncio
import json

import pytest

from dapo.viewer.dump_reader import DumpDir, DumpError, find_dumps, row_matches, sort_order

# step -> rows (score, text); step 10 sorts after step 2 (integer stems)
STEPS = {
    1: [(0.5, "alpha apple"), (-1.0, "beta banana"), (1.0, "gamma apple"), (None, "delta")],
    2: [(1.0, "eps"), (0.0, "zeta apple")],
    10: [(-0.5, "eta"), (2.0, "theta"), (0.25, "iota")],
}


def write_dumps(d):
    d.mkdir(parents=True, exist_ok=True)
    for step, rows in STEPS.items():
        with (d / f"{step}.jsonl").open("w") as f:
            for i, (score, text) in enumerate(rows):
                row = {
                    "input": f"question {step}.{i}",
                    "output": text,
                    "gts": "x",
                    "step": step,
                    "acc": bool(i % 2),
                }
                if score is not None:
                    row["score"] = score
                f.write(json.dumps(row) + "\n")
            if step == 2:
                f.write("\n")  # a blank line is not a row
    (d / "notes.jsonl").write_text("{}\n")  # not a step file
    return d


# ------------------------------------------------------------------------ dumps (no textual)


def test_sort_order_hand_vector():
    s = [0.5, -1.0, 1.0, None, 1.0]
    assert sort_order(s, "original") == [0, 1, 2, 3, 4]
    assert sort_order(s, "score_asc") == [1, 0, 2, 4, 3]
    assert sort_order(s, "score_desc") == [2, 4, 0, 1, 3]


def test_dump_dir_steps_rows_and_scores(tmp_path):
    d = DumpDir(write_dumps(tmp_path / "r"))
    assert d.steps == [1, 2, 10]
    f = d.file(2)
    assert len(f) == 2 and f.row(1)["output"] == "zeta apple"
    assert d.file(1).scores() == [0.5, -1.0, 1.0, None]
    assert row_matches(f.row(1), "APPLE") and not row_matches(f.row(1), "apple", ["input"])


def test_find_dumps_in_a_run_dir(tmp_path):
    write_dumps(tmp_path / "run" / "validation_data")
    write_dumps(tmp_path / "elsewhere" / "rollouts")
    (tmp_path / "run" / "viewer.json").write_text(
        json.dumps({"rollout_data_dir": str(tmp_path / "elsewhere" / "rollouts")})
    )
    found = find_dumps(tmp_path / "run")
    assert [x.label for x in found] == ["rollout", "validation_data"]
    assert [x.label for x in find_dumps(tmp_path / "run" / "validation_data" / "2.jsonl")] == [
        "validation_data"
    ]
    (tmp_path / "empty_run").mkdir()
    with pytest.raises(DumpError, match="rollout_data_dir"):
        find_dumps(tmp_path / "empty_run")
    with pytest.raises(DumpError, match="no such"):
        find_dumps(tmp_path / "missing")


def test_large_dump_is_indexed_without_parsing(tmp_path):
    d = tmp_path / "big"
    d.mkdir()
    line = json.dumps({"input": "q" * 200, "output": "a" * 2000, "score": 1.0}) + "\n"
    (d / "1.jsonl").write_text(line * 20000)  # ~45 MB, written once
    f = DumpDir(d).file(1)
    assert not f.indexed  # opening a step's file does not read it
    assert len(f) == 20000
    assert f.indexed and f.rows_parsed == 0  # rows are counted by line offsets, none parsed
    assert f.row(19999)["score"] == 1.0 and f.rows_parsed == 1


# ------------------------------------------------------------------------ the TUI

textual = pytest.importorskip("textual", reason="the browser needs the 'viewer' extra (textual)")


def drive(path, script):
    from dapo.viewer.browser import make_app

    async def main():
        app = make_app(path)
        async with app.run_test(size=(120, 40)) as pilot:

            async def settle():
                for _ in range(3):
                    await pilot.pause()
                    await app.workers.wait_for_complete()
                await pilot.pause()

            await settle()
            await script(app, pilot, settle)

    asyncio.run(main())


def where(app):
    return app.step, app.current_index()


def test_move_between_samples_and_steps(tmp_path):
    path = write_dumps(tmp_path / "r")

    async def script(app, pilot, settle):
        assert where(app) == (1, 0)
        assert "output: alpha apple" in app.rendered_text
        await pilot.press("n", "n")
        assert where(app) == (1, 2) and "gamma apple" in app.rendered_text
        await pilot.press("p")
        assert where(app) == (1, 1)
        await pilot.press("N")
        await settle()
        assert where(app) == (2, 0)
        await pilot.press("N")
        await settle()
        assert where(app) == (10, 0)
        await pilot.press("N")  # last step: stays
        await settle()
        assert where(app) == (10, 0)
        await pilot.press("p")  # first sample of a step -> last sample of the previous step
        await settle()
        assert where(app) == (2, 1)
        await pilot.press("n")  # last sample -> next step
        await settle()
        assert where(app) == (10, 0)
        await pilot.press("P", "P")
        await settle()
        assert where(app) == (1, 0)
        await pilot.press("p")  # very first sample: stays
        await settle()
        assert where(app) == (1, 0)
        assert "step 1 (1/3)" in app.status_text and "sample 1/4" in app.status_text
        # the step selector jumps directly
        app.query_one("#step").value = 10
        await settle()
        assert where(app) == (10, 0)

    drive(path, script)


def test_sort_by_score(tmp_path):
    path = write_dumps(tmp_path / "r")

    async def script(app, pilot, settle):
        app.query_one("#sort").value = "score_desc"
        await settle()
        assert app.order == [2, 0, 1, 3]  # missing score last
        assert where(app) == (1, 2) and "score +1" in app.status_text
        await pilot.press("n")
        assert where(app) == (1, 0)
        app.query_one("#sort").value = "score_asc"
        await settle()
        assert app.order == [1, 0, 2, 3]
        # the sort holds on the next step; p from its first sample lands on the last of step 1
        await pilot.press("N")
        await settle()
        assert app.step == 2 and app.order == [1, 0]
        await pilot.press("p")
        await settle()
        assert where(app) == (1, 3) and app.order == [1, 0, 2, 3]
        await pilot.press("n")
        await settle()
        assert where(app) == (2, 1)
        # the sample list shows the scores and the start of each response in the sorted order
        ol = app.query_one("#samples")
        assert [str(ol.get_option_at_index(i).prompt) for i in range(ol.option_count)] == [
            "#1  score +0  zeta apple",
            "#0  score +1  eps",
        ]

    drive(path, script)


def test_search_highlights_and_finds_next_across_steps(tmp_path):
    path = write_dumps(tmp_path / "r")

    async def script(app, pilot, settle):
        await pilot.press("f")
        assert app.focused.id == "search"
        await pilot.press(*"apple", "enter")
        await settle()
        # the current sample matches: stay, highlight
        assert where(app) == (1, 0) and app.match_count == 1
        assert "'apple': 1 in this sample" in app.status_text
        await pilot.press("enter")
        await settle()
        assert where(app) == (1, 2)
        await pilot.press("enter")
        await settle()
        assert where(app) == (2, 1)  # found in a later step
        await pilot.press("enter")
        await settle()
        assert where(app) == (1, 0)  # wraps around
        await pilot.press("escape")
        await settle()
        assert app.query_text == "" and app.match_count == 0 and app.focused.id == "content"
        # a query in a hidden field does not match; the field filter hides fields
        await pilot.press("f", *"question 2.1", "enter")
        await settle()
        assert where(app) == (2, 1)
        await pilot.press("escape")
        fields = app.query_one("#fields")
        fields.deselect("input")
        await settle()
        assert "input:" not in app.rendered_text and "output:" in app.rendered_text

    drive(path, script)


def test_sample_list_shows_score_and_preview_without_sorting(tmp_path):
    path = write_dumps(tmp_path / "r")

    async def script(app, pilot, settle):
        ol = app.query_one("#samples")
        labels = [str(ol.get_option_at_index(i).prompt) for i in range(ol.option_count)]
        assert labels == [
            "#0  score +0.5  alpha apple",
            "#1  score -1  beta banana",
            "#2  score +1  gamma apple",
            "#3  score -  delta",
        ]

    drive(path, script)


def test_row_preview_is_one_short_line():
    from dapo.viewer.dump_reader import row_preview

    assert row_preview({"output": "Answer:\n  42\tok"}) == "Answer: 42 ok"
    assert row_preview({"output": "x" * 30}, width=10) == "x" * 9 + "…"
    assert row_preview({"input": "no response"}) == ""


def test_render_switch_and_paging_keys(tmp_path):
    path = write_dumps(tmp_path / "r")

    async def script(app, pilot, settle):
        await pilot.press("s")
        assert app.render_mode == "table" and "render: table" in app.status_text
        await pilot.press("j", "k", "G", "g")
        await pilot.press("s")
        assert app.render_mode == "text"

    drive(path, script)


def test_opening_a_large_dump_parses_only_what_is_shown(tmp_path):
    d = tmp_path / "big"
    d.mkdir()
    line = json.dumps({"input": "q", "output": "a" * 500, "score": 1.0}) + "\n"
    (d / "1.jsonl").write_text(line * 5000)
    (d / "2.jsonl").write_text(line * 10)

    async def script(app, pilot, settle):
        f = app.dump.file(1)
        assert len(app.order) == 5000 and f.rows_parsed <= 2
        assert not app.dump.file(2).indexed  # other steps are not touched until visited
        await pilot.press("n")
        assert f.rows_parsed <= 3

    drive(d, script)


def test_cli_registers_view_and_report(tmp_path, capsys):
    from dapo.cli import build_parser, main
    from dapo.viewer import register

    parser = argparse.ArgumentParser(prog="dapo")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["view", str(tmp_path)])
    with pytest.raises(DumpError, match="no rollout dumps found"):
        args.func(args)
    assert parser.parse_args(["report", str(tmp_path)]).command == "report"
    # through dapo itself: one line naming the directory and what to point at instead
    assert main(["view", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"dapo: {tmp_path}: no rollout dumps found. Point dapo view at trainer.rollout_data_dir or "
        "trainer.validation_data_dir (a directory of <step>.jsonl files), or at a run directory "
        "that has them\n"
    )
    assert build_parser().parse_args(["report", str(tmp_path)]).run_dir == str(tmp_path)
