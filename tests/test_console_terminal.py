"""`dapo train` of the demo preset on a real terminal (tmux at 80x24 and 200x50): step lines sit
above the progress bar, never glued to it, no word is split by the terminal, third-party bars
stay quiet; and `dapo view` opens the demo run's rollouts."""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from runs import subprocess_env

TMUX = shutil.which("tmux")
SIZES = ((80, 24), (200, 50))
BAR = "━"
# a short demo: the default preset's model, data and batches, two steps, a small held-out set
DEMO = (
    "trainer.total_training_steps=2",
    "data.val_max_samples=4",
    "trainer.report_freq=0",
    "trainer.torch_threads=1",
)


def _tmux(sock: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([TMUX, "-L", sock, "-f", "/dev/null", *args], capture_output=True, text=True)


@pytest.fixture(scope="module")
def captures(tmp_path_factory):
    """Both terminals' whole screens (scrollback included) after the run, and the exit codes."""
    if TMUX is None:
        pytest.skip("tmux is not installed (apt-get install tmux)")
    tmp = tmp_path_factory.mktemp("tmux")
    sock = f"dapo-test-{uuid.uuid4().hex[:8]}"
    env = subprocess_env()
    started = []
    for w, h in SIZES:
        run_dir, done = tmp / f"run{w}", tmp / f"rc{w}"
        cmd = [sys.executable, "-m", "dapo.cli", "train", f"trainer.default_local_dir={run_dir}", *DEMO]
        script = tmp / f"run{w}.sh"
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items() if k in ("PYTHONPATH", "HOME"))
        script.write_text(
            # the terminal's size, not an inherited COLUMNS / LINES, sets the width
            f"unset COLUMNS LINES\nexport {exports} OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false\n"
            f"{shlex.join(cmd)}\necho $? > {done}\nsleep 600\n"
        )
        session = f"s{w}"
        r = _tmux(
            sock,
            *("start-server", ";", "set-option", "-g", "history-limit", "5000", ";"),
            *("new-session", "-d", "-x", str(w), "-y", str(h), "-s", session, f"bash {script}"),
        )
        assert r.returncode == 0, r.stderr
        started.append((w, session, done))
    try:
        out = {}
        deadline = time.monotonic() + 900
        for w, session, done in started:
            while not done.exists() and time.monotonic() < deadline:
                time.sleep(0.5)
            assert done.exists(), f"the {w}-column run did not finish in 900 s (a hang guard)"
            time.sleep(0.5)  # the last lines reach the pane
            screen = _tmux(sock, "capture-pane", "-p", "-S", "-", "-t", session).stdout
            out[w] = (int(done.read_text()), screen.rstrip("\n").splitlines())
            if os.environ.get("DAPO_SAVE_CAPTURES"):  # refreshes the figures in docs/console.md
                Path(os.environ["DAPO_SAVE_CAPTURES"], f"console-{w}.txt").write_text(screen)
        return out
    finally:
        _tmux(sock, "kill-server")


@pytest.mark.parametrize("width", [w for w, _ in SIZES])
def test_step_lines_sit_above_the_bar_and_fit_the_terminal(captures, width):
    rc, lines = captures[width]
    text = "\n".join(lines)
    assert rc == 0, text
    # the legend, both accuracies, readable validation, step lines 1 and 2, the bar, the end
    assert "acc(all)" in text and "acc(kept)" in text and "each step line:" in text
    assert "validation arithmetic: accuracy" in text and "val-core/" not in text
    assert any(x.startswith("step 1 | rounds") for x in lines) and any(
        x.startswith("step 2 | rounds") for x in lines
    )
    assert "done in" in text
    bars = [x for x in lines if BAR in x]
    # one bar, redrawn in place: a line printed into the bar's place leaves a stale copy behind
    assert len(bars) == 1, text
    for x in bars:  # the bar line holds the bar alone: nothing of a step line is glued to it
        assert x.startswith("train ") and "step " not in x and " | " not in x and "acc(" not in x, x
    # transformers' own bars ("Loading weights", "Writing model shards") are off
    assert "Loading weights" not in text and "Writing model shards" not in text and "it/s" not in text
    for a, b in zip(lines, lines[1:]):
        # a line that fills the terminal and runs on into the next one split a word there
        assert not (len(a) >= width and not a[-1].isspace() and b[:1].strip()), (a, b)
    # step lines break between fields before the last column; a wide terminal keeps each on one
    step1 = next(i for i, x in enumerate(lines) if x.startswith("step 1 | rounds"))
    assert ("time " in lines[step1]) == (width >= 200), lines[step1 : step1 + 3]
    assert all(len(x) < width for x in lines if BAR not in x), [x for x in lines if len(x) >= width]


def test_view_opens_the_demo_runs_rollouts(tmp_path):
    pytest.importorskip("textual", reason="dapo view needs the 'viewer' extra (textual)")
    from dapo.cli import main
    from dapo.viewer.browser import make_app

    run_dir = tmp_path / "run"
    args = ["train", f"trainer.default_local_dir={run_dir}", *DEMO, "trainer.total_training_steps=1"]
    quiet = ["trainer.val_before_train=false", "trainer.logger=[jsonl]", "trainer.save_final_model=false"]
    assert main([*args, *quiet]) == 0
    assert (run_dir / "rollout_dumps" / "1.jsonl").is_file()

    async def run():
        app = make_app(run_dir)
        async with app.run_test(size=(120, 40)) as pilot:
            for _ in range(4):
                await pilot.pause()
                await app.workers.wait_for_complete()
            assert app.dump.label == "rollout" and app.step == 1
            ol = app.query_one("#samples")
            labels = [str(ol.get_option_at_index(i).prompt) for i in range(ol.option_count)]
            # 16 prompts x 8 responses, each listed with its score and the start of its response
            assert len(labels) == 128
            scores = app.dump.file(1).scores()
            for i, label in enumerate(labels):
                assert label.startswith(f"#{i}  score {scores[i]:+.3g}"), label
            assert all(s is not None for s in scores)
            assert "output:" in app.rendered_text

    asyncio.run(run())
