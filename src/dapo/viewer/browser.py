"""``dapo view``: a terminal browser for rollout and validation dumps (needs textual: the
``viewer`` extra).

Pick a step and a sample, sort by score, choose the fields shown, search with highlights.
Keys (as in verl's rollout viewer): n / p next / previous sample, N / P next / previous step,
j / k page down / up, g / G top / bottom, f find (enter: next match, esc: cancel), s switch
between text and table rendering, tab moves focus. Files are indexed and parsed lazily in worker
threads, so a large dump opens at once.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from dapo.viewer.dump_reader import (
    DEFAULT_MASK,
    DumpDir,
    find_dumps,
    format_value,
    row_matches,
    row_score,
    sort_order,
)

# a step with more rows lists them without score and preview until a sort by score is chosen
PREVIEW_MAX_ROWS = 2048
SORTS = (("original order", "original"), ("score ascending", "score_asc"), ("score descending", "score_desc"))
MATCH_STYLE = "bold black on yellow"


def _app_class():
    """Build the App class on first use, so importing this module does not need textual."""
    from rich.table import Table
    from rich.text import Text
    from textual import on, work
    from textual.app import App, ComposeResult
    from textual.binding import Binding
    from textual.containers import Horizontal, Vertical, VerticalScroll
    from textual.widgets import Footer, Header, Input, Label, OptionList, Select, SelectionList, Static
    from textual.widgets.option_list import Option

    class RolloutViewer(App):
        TITLE = "dapo view"
        CSS = """
        #bar { height: 3; }
        #bar Select { width: 26; }
        #bar #dump { width: 22; }
        #search { width: 1fr; }
        #status { height: 1; padding: 0 1; background: $boost; }
        #side { width: 44; }
        #samples { height: 1fr; border: round $primary-darken-2; }
        #fields { height: 14; border: round $primary-darken-2; }
        #content { border: round $primary; padding: 0 1; }
        """
        BINDINGS = [
            Binding("n", "next_sample", "next sample"),
            Binding("p", "prev_sample", "prev sample"),
            Binding("N", "next_step", "next step"),
            Binding("P", "prev_step", "prev step"),
            Binding("j", "page_down", "page down", show=False),
            Binding("k", "page_up", "page up", show=False),
            Binding("g", "top", "top", show=False),
            Binding("G", "bottom", "bottom", show=False),
            Binding("f", "find", "find"),
            Binding("escape", "cancel_find", "cancel", show=False),
            Binding("s", "switch_render", "text/table"),
            Binding("q", "quit", "quit"),
        ]

        def __init__(self, dumps: list[DumpDir], mask: str | None = DEFAULT_MASK) -> None:
            super().__init__()
            self.dumps = dumps
            self.dump = dumps[0]
            self.mask = re.compile(mask) if mask else None
            self.step_pos = 0
            self.order: list[int] = []
            self.cur = 0
            self.sort_mode = "original"
            self.render_mode = "text"
            self.query_text = ""
            self.fields: list[str] = []
            self.hidden: set[str] = set()
            self.loading = False
            self.match_count = 0
            self.rendered_text = ""  # plain text of what the content pane shows (for tests)
            self.status_text = ""

        # ------------------------------------------------------------------ layout

        def compose(self) -> ComposeResult:
            yield Header()
            with Horizontal(id="bar"):
                if len(self.dumps) > 1:
                    yield Select(
                        [(d.label, i) for i, d in enumerate(self.dumps)],
                        value=0,
                        allow_blank=False,
                        id="dump",
                    )
                yield Select(self._step_options(), value=self.dump.steps[0], allow_blank=False, id="step")
                yield Select([(a, b) for a, b in SORTS], value="original", allow_blank=False, id="sort")
                yield Input(placeholder="find (f) - enter: next match, esc: cancel", id="search")
            yield Label("", id="status")
            with Horizontal():
                with Vertical(id="side"):
                    yield OptionList(id="samples")
                    yield SelectionList(id="fields")
                with VerticalScroll(id="content"):
                    yield Static("", id="body")
            yield Footer()

        def on_mount(self) -> None:
            self.query_one("#samples").border_title = "samples"
            self.query_one("#fields").border_title = "fields"
            self.sub_title = str(self.dump.path)
            self.load_step(0)
            self.query_one("#content").focus()

        def _step_options(self) -> list[tuple[str, int]]:
            return [(f"step: {s}", s) for s in self.dump.steps]

        # ------------------------------------------------------------------ loading

        @property
        def step(self) -> int:
            return self.dump.steps[self.step_pos]

        def load_step(self, pos: int, at: str = "first") -> None:
            self.step_pos = max(0, min(pos, len(self.dump.steps) - 1))
            self.loading = True
            self._set_status(f"loading step {self.step} ...")
            sel = self.query_one("#step", Select)
            if sel.value != self.step:
                with sel.prevent(Select.Changed):
                    sel.value = self.step
            self._index_worker(self.dump, self.step_pos, at)

        @work(thread=True, exclusive=True, group="index")
        def _index_worker(self, dump: DumpDir, pos: int, at: str) -> None:
            f = dump.file(dump.steps[pos])
            f.index()
            self.call_from_thread(self._step_indexed, dump, pos, at)

        def _step_indexed(self, dump: DumpDir, pos: int, at: str) -> None:
            if dump is not self.dump or pos != self.step_pos:
                return  # the user moved on
            f = self.dump.file(self.step)
            self.order = list(range(len(f)))
            self.cur = 0 if at == "first" else max(0, len(self.order) - 1)
            self.loading = False
            # scores and previews for the sample list: every row is parsed once, so a very large
            # step waits for a sort to ask for them
            if self.sort_mode != "original" or f.scores_ready or len(f) <= PREVIEW_MAX_ROWS:
                self._scores_worker(dump, pos, at)
            self._fill_samples()
            self.show()

        @work(thread=True, exclusive=True, group="scores")
        def _scores_worker(self, dump: DumpDir, pos: int, at: str = "first") -> None:
            dump.file(dump.steps[pos]).scores()
            self.call_from_thread(self._scores_ready, dump, pos, at)

        def _scores_ready(self, dump: DumpDir, pos: int, at: str) -> None:
            if dump is not self.dump or pos != self.step_pos:
                return
            f = self.dump.file(self.step)
            row = self.order[self.cur] if self.order else 0
            self.order = sort_order(f.scores(), self.sort_mode)
            if self.sort_mode == "original":
                self.cur = row
            else:
                self.cur = 0 if at == "first" else max(0, len(self.order) - 1)
            self._fill_samples()
            self.show()

        def _fill_samples(self) -> None:
            f = self.dump.file(self.step)
            scores = f.scores() if f.scores_ready else None
            previews = f.previews() if scores is not None else None
            opts = []
            for i in self.order:
                label = f"#{i}"
                if scores is not None and previews is not None:
                    s = scores[i]
                    label += "  score " + ("-" if s is None else f"{s:+.3g}")
                    if previews[i]:
                        label += "  " + previews[i]
                opts.append(Option(label))
            ol = self.query_one("#samples", OptionList)
            with ol.prevent(OptionList.OptionHighlighted):
                ol.set_options(opts)
                if opts:
                    ol.highlighted = self.cur

        # ------------------------------------------------------------------ rendering

        def current_row(self) -> dict[str, Any] | None:
            if self.loading or not self.order:
                return None
            return self.dump.file(self.step).row(self.order[self.cur])

        def current_index(self) -> int | None:
            return None if not self.order else self.order[self.cur]

        def _sync_fields(self, row: dict[str, Any]) -> None:
            new = [k for k in row if k not in self.fields]
            if not new:
                return
            self.fields.extend(new)
            sl = self.query_one("#fields", SelectionList)
            with sl.prevent(SelectionList.SelectedChanged):
                sl.add_options([(k, k, k not in self.hidden) for k in new])

        def visible_fields(self, row: dict[str, Any]) -> list[str]:
            return [k for k in row if k not in self.hidden]

        def show(self, scroll: str = "top") -> None:
            body = self.query_one("#body", Static)
            row = self.current_row()
            if row is None:
                body.update("(empty step)" if not self.loading else "loading ...")
                self.rendered_text = ""
                self._set_status()
                return
            self._sync_fields(row)
            keys = self.visible_fields(row)
            texts: list[tuple[str, Text]] = []
            self.match_count = 0
            for k in keys:
                t = Text(format_value(row[k], self.mask))
                if self.query_text:
                    self.match_count += t.highlight_words(
                        [self.query_text], MATCH_STYLE, case_sensitive=False
                    )
                texts.append((k, t))
            if self.render_mode == "table":
                table = Table(show_header=True, header_style="bold", expand=True, show_lines=True)
                table.add_column("field", style="bold cyan", no_wrap=True)
                table.add_column("value", ratio=1)
                for k, t in texts:
                    table.add_row(k, t)
                body.update(table)
            else:
                out = Text()
                for k, t in texts:
                    out.append(f"── {k} ", style="bold cyan")
                    out.append("─" * max(0, 40 - len(k)) + "\n", style="cyan")
                    out.append_text(t)
                    out.append("\n\n")
                body.update(out)
            self.rendered_text = "\n".join(f"{k}: {t.plain}" for k, t in texts)
            self._set_status()
            content = self.query_one("#content", VerticalScroll)
            if scroll == "match" and self.query_text:
                line = self._first_match_line(texts)
                content.scroll_to(y=max(0, line - 2), animate=False)
            else:
                content.scroll_home(animate=False)
            ol = self.query_one("#samples", OptionList)
            if ol.option_count and ol.highlighted != self.cur:
                with ol.prevent(OptionList.OptionHighlighted):
                    ol.highlighted = self.cur

        def _first_match_line(self, texts: list[tuple[str, Text]]) -> int:
            q = self.query_text.lower()
            line = 0
            for _k, t in texts:
                line += 1  # the field header
                p = t.plain.lower().find(q)
                if p >= 0:
                    return line + t.plain[:p].count("\n")
                line += t.plain.count("\n") + 2
            return 0

        def _set_status(self, text: str | None = None) -> None:
            if text is None:
                f = self.dump.file(self.step)
                n = len(f) if f.indexed else 0
                parts = [
                    f"{self.dump.label}",
                    f"step {self.step} ({self.step_pos + 1}/{len(self.dump.steps)})",
                ]
                if self.order:
                    i = self.order[self.cur]
                    parts.append(f"sample {self.cur + 1}/{n} (row #{i})")
                    row = f.row(i)
                    s = row_score(row)
                    if s is not None:
                        parts.append(f"score {s:+.4g}")
                else:
                    parts.append("no samples")
                if self.sort_mode != "original":
                    parts.append(dict((b, a) for a, b in SORTS)[self.sort_mode])
                if self.query_text:
                    parts.append(f"{self.query_text!r}: {self.match_count} in this sample")
                parts.append(f"render: {self.render_mode}")
                text = "  ·  ".join(parts)
            self.status_text = text
            self.query_one("#status", Label).update(text)

        # ------------------------------------------------------------------ events

        @on(Select.Changed, "#step")
        def _step_chosen(self, event: Select.Changed) -> None:
            if event.value != Select.NULL and event.value in self.dump.steps and event.value != self.step:
                self.load_step(self.dump.steps.index(event.value))

        @on(Select.Changed, "#dump")
        def _dump_chosen(self, event: Select.Changed) -> None:
            d = self.dumps[int(event.value)]
            if d is self.dump:
                return
            self.dump = d
            self.sub_title = str(d.path)
            sel = self.query_one("#step", Select)
            with sel.prevent(Select.Changed):
                sel.set_options(self._step_options())
                sel.value = d.steps[0]
            self.load_step(0)

        @on(Select.Changed, "#sort")
        def _sort_chosen(self, event: Select.Changed) -> None:
            self.set_sort(str(event.value))

        def set_sort(self, mode: str) -> None:
            if mode == self.sort_mode:
                return
            self.sort_mode = mode
            sel = self.query_one("#sort", Select)
            if sel.value != mode:
                with sel.prevent(Select.Changed):
                    sel.value = mode
            if not self.loading:
                self._scores_worker(self.dump, self.step_pos)

        @on(OptionList.OptionHighlighted, "#samples")
        def _sample_chosen(self, event: OptionList.OptionHighlighted) -> None:
            if event.option_index != self.cur and 0 <= event.option_index < len(self.order):
                self.cur = event.option_index
                self.show()

        @on(SelectionList.SelectedChanged, "#fields")
        def _fields_chosen(self, event: SelectionList.SelectedChanged) -> None:
            selected = set(event.selection_list.selected)
            self.hidden = {k for k in self.fields if k not in selected}
            self.show()

        @on(Input.Submitted, "#search")
        def _search(self, event: Input.Submitted) -> None:
            q = event.value.strip()
            if not q:
                self.action_cancel_find()
                return
            if q != self.query_text:
                self.query_text = q
                row = self.current_row()
                if row is not None and row_matches(row, q, self.visible_fields(row)):
                    self.show(scroll="match")
                    return
            self.find_next()

        # ------------------------------------------------------------------ search

        def find_next(self) -> None:
            if not self.query_text or self.loading:
                return
            self._set_status(f"searching for {self.query_text!r} ...")
            self._find_worker(self.dump, self.step_pos, self.cur, list(self.order), self.query_text)

        @work(thread=True, exclusive=True, group="find")
        def _find_worker(self, dump: DumpDir, pos: int, cur: int, order: list[int], q: str) -> None:
            hidden = set(self.hidden)
            # the rest of this step in the current order, then later steps in file order, then wrap
            f = dump.file(dump.steps[pos])
            for j in range(cur + 1, len(order)):
                row = f.row(order[j])
                if row_matches(row, q, [k for k in row if k not in hidden]):
                    self.call_from_thread(self._found, dump, pos, j, None)
                    return
            n = len(dump.steps)
            for d in range(1, n + 1):
                p = (pos + d) % n
                g = dump.file(dump.steps[p])
                for i in range(len(g)):
                    row = g.row(i)
                    if row_matches(row, q, [k for k in row if k not in hidden]):
                        self.call_from_thread(self._found, dump, p, None, i)
                        return
            self.call_from_thread(self._not_found, q)

        def _found(self, dump: DumpDir, pos: int, j: int | None, row_index: int | None) -> None:
            if dump is not self.dump:
                return
            if pos == self.step_pos and j is not None:
                self.cur = j
                self.show(scroll="match")
                return
            # another step: show it in file order at the matching row
            self.step_pos = pos
            sel = self.query_one("#step", Select)
            with sel.prevent(Select.Changed):
                sel.value = self.step
            f = dump.file(self.step)
            self.order = list(range(len(f)))
            if self.sort_mode != "original":
                self.sort_mode = "original"
                srt = self.query_one("#sort", Select)
                with srt.prevent(Select.Changed):
                    srt.value = "original"
            self.cur = row_index or 0
            self.loading = False
            self._fill_samples()
            self.show(scroll="match")

        def _not_found(self, q: str) -> None:
            self._set_status()
            self.notify(f"{q!r} not found in {self.dump.label}", severity="warning")

        # ------------------------------------------------------------------ actions

        def _move_sample(self, d: int) -> None:
            if self.loading or not self.order:
                return
            nxt = self.cur + d
            if 0 <= nxt < len(self.order):
                self.cur = nxt
                self.show()
            elif nxt >= len(self.order) and self.step_pos + 1 < len(self.dump.steps):
                self.load_step(self.step_pos + 1, "first")
            elif nxt < 0 and self.step_pos > 0:
                self.load_step(self.step_pos - 1, "last")

        def action_next_sample(self) -> None:
            self._move_sample(1)

        def action_prev_sample(self) -> None:
            self._move_sample(-1)

        def action_next_step(self) -> None:
            if self.step_pos + 1 < len(self.dump.steps):
                self.load_step(self.step_pos + 1)

        def action_prev_step(self) -> None:
            if self.step_pos > 0:
                self.load_step(self.step_pos - 1)

        def action_page_down(self) -> None:
            self.query_one("#content", VerticalScroll).scroll_page_down(animate=False)

        def action_page_up(self) -> None:
            self.query_one("#content", VerticalScroll).scroll_page_up(animate=False)

        def action_top(self) -> None:
            self.query_one("#content", VerticalScroll).scroll_home(animate=False)

        def action_bottom(self) -> None:
            self.query_one("#content", VerticalScroll).scroll_end(animate=False)

        def action_find(self) -> None:
            self.query_one("#search", Input).focus()

        def action_cancel_find(self) -> None:
            inp = self.query_one("#search", Input)
            inp.value = ""
            self.query_text = ""
            self.query_one("#content").focus()
            self.show()

        def action_switch_render(self) -> None:
            self.render_mode = "table" if self.render_mode == "text" else "text"
            self.show()

    return RolloutViewer


_APP = None


def app_class():
    global _APP
    if _APP is None:
        _APP = _app_class()
    return _APP


def make_app(path: str | Path, mask: str | None = DEFAULT_MASK):
    return app_class()(find_dumps(path), mask=mask)


# -------------------------------------------------------------------------------------- CLI


def cmd_view(args: argparse.Namespace) -> int:
    dumps = find_dumps(args.path)
    try:
        cls = app_class()
    except ModuleNotFoundError as e:
        print(f"dapo view: {e.name} is missing; install it with pip install 'dapo[viewer]'", file=sys.stderr)
        return 2
    cls(dumps, mask=args.mask_str or None).run()
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "view",
        help="browse rollout / validation dumps in the terminal",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "path",
        metavar="RUN_DIR_OR_DUMP_DIR",
        help="a directory of <step>.jsonl dumps (trainer.rollout_data_dir / validation_data_dir) or a run directory",
    )
    p.add_argument(
        "--mask-str",
        default=DEFAULT_MASK,
        help="regex whose matches are shown as '*' (default: image pad tokens); '' to show everything",
    )
    p.set_defaults(func=cmd_view)
