"""Builds into the dapo cache (``dapo.tasks.cache.ensure_built``): a build killed part-way leaves
nothing the next build trips over, and two processes building one target build it once. Real
builder processes with a small fake build, killed with real signals."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dapo.tasks.cache import ensure_built, remove_stale_builds
from runs import subprocess_env

_BUILDER = """
import sys, time
from pathlib import Path
from dapo.tasks.cache import ensure_built

def build(tmp):
    (tmp / "weights").write_text("half")
    print("half built", flush=True)
    {wait}
    return {{"by": "first"}}

ensure_built(Path(sys.argv[1]), build, log=lambda line: print(line, flush=True))
print("built", flush=True)
"""


def _builder(target: Path, wait: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", _BUILDER.format(wait=wait), str(target)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=subprocess_env(), text=True,
    )  # fmt: skip


def _wait_for(p: subprocess.Popen, text: str) -> list[str]:
    """The lines ``p`` prints up to the first that starts with ``text``."""
    seen = []
    for line in p.stdout:
        seen.append(line.strip())
        if line.startswith(text):
            return seen
    raise AssertionError(f"the builder ended before {text!r}: {seen}")


def _temps(target: Path) -> list[str]:
    return sorted(p.name for p in target.parent.glob(f".{target.name}-*"))


def _quick_build(calls: list[Path]):
    def build(tmp: Path) -> dict:
        calls.append(tmp)
        (tmp / "weights").write_text("whole")
        return {"by": "second"}

    return build


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_build_killed_mid_way_leaves_nothing_the_next_build_trips_over(sig, tmp_path):
    target = tmp_path / "models" / "tiny-abc123"
    p = _builder(target, "time.sleep(120)")
    _wait_for(p, "half built")
    p.send_signal(sig)
    assert p.wait(timeout=60) == -sig, "the process ends as the signal ends it"
    if sig == signal.SIGTERM:
        assert _temps(target) == [], "SIGTERM removes the build's folder"
    else:
        assert len(_temps(target)) == 1  # SIGKILL runs nothing; the next build removes it
    calls: list[Path] = []
    assert ensure_built(target, _quick_build(calls), log=lambda line: None) == target
    assert len(calls) == 1 and (target / "weights").read_text() == "whole"
    assert json.loads((target / "dapo_warm_start.json").read_text()) == {"by": "second"}
    assert _temps(target) == []


def test_a_build_folder_of_a_running_builder_is_kept(tmp_path):
    target = tmp_path / "tiny-abc123"
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        gone = subprocess.run(
            [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
        )
        names = [f".tiny-abc123-{alive.pid}-abcd_123", f".tiny-abc123-{gone.stdout.strip()}-efgh4567",
                 ".tiny-abc123-other-12345678", ".tiny-abc123-9-x"]  # fmt: skip
        for n in names:
            (tmp_path / n).mkdir()
        # a target whose name extends this one's has folders of its own
        (tmp_path / f".tiny-abc123-4-{gone.stdout.strip()}-ijkl8901").mkdir()
        assert [p.name for p in remove_stale_builds(target)] == [names[1]]
    finally:
        alive.kill()
        alive.wait()


def test_a_second_builder_of_a_target_waits_for_the_first_and_uses_its_build(tmp_path):
    target = tmp_path / "tiny-abc123"
    first, second = _builder(target, "sys.stdin.readline()"), None
    try:
        _wait_for(first, "half built")
        second = _builder(target, "pass")
        # the second says it waits for the first (by pid) and builds nothing while it does
        seen = _wait_for(second, "waiting for process")
        assert seen == [f"waiting for process {first.pid}, which is building {target} ..."]
        assert first.poll() is None
        first.stdin.write("\n")
        first.stdin.flush()
        assert _wait_for(first, "built")[-1] == "built" and first.wait(timeout=60) == 0
        rest = [line.strip() for line in second.stdout]
        assert second.wait(timeout=60) == 0
        assert rest == ["built"], "the second used the first's build"
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    assert json.loads((target / "dapo_warm_start.json").read_text()) == {"by": "first"}
    assert _temps(target) == []
