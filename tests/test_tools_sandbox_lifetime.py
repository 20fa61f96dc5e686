"""No process a sandboxed program starts outlives its call, or the trainer that made it.

The hostile program clears its parent-death signal (``prctl(PR_SET_PDEATHSIG, 0)``: the only
tie between it and bwrap), names itself with a marker the host can find in ``/proc``, closes
every pipe it holds and sleeps for an hour. Each test runs with the seccomp filter (which
refuses that ``prctl``) and, where the supervisor alone must hold, without it (the ``prctl``
works). The audit hook is off throughout: it would refuse ``ctypes`` before anything happens.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from dapo.tools.sandbox import SandboxLimits, os_boundary_problem, run_python
from fixtures.sandbox_helpers import ORPHAN, marked

NO_BWRAP = os_boundary_problem()
pytestmark = pytest.mark.skipif(NO_BWRAP is not None, reason=f"no OS sandbox here: {NO_BWRAP}")
FILTER = [pytest.param(True, id="filter"), pytest.param(False, id="filter-off")]

THEN = {
    "timeout": "",
    # write until the parent stops reading (it kills at the output limit), then hang on
    "output_limit": textwrap.dedent("""\
        try:
            while True:
                os.write(1, b'y' * 65536)
        except OSError:
            pass
    """),
}


def kill_leftovers(marker: str) -> None:
    """A failing test must not leave its orphans behind."""
    for pid in marked(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _watch(marker: str, done: threading.Event) -> None:
    """Tell the program once the host sees it by its marker: the check after the call then
    proves something."""
    while not done.is_set():
        for pid in marked(marker):
            os.kill(pid, signal.SIGUSR1)
            return
        time.sleep(0.02)


@pytest.mark.parametrize("syscall_filter", FILTER)
@pytest.mark.parametrize("ends_in", list(THEN))
def test_an_orphan_does_not_outlive_its_call(ends_in, syscall_filter):
    marker = "do" + uuid.uuid4().hex[:12]
    code = ORPHAN.format(marker=marker, then=THEN[ends_in])
    lim = SandboxLimits(
        cpu_seconds=30, memory_mb=256, wall_seconds=4.0, audit_hook=False, syscall_filter=syscall_filter
    )
    done = threading.Event()
    watcher = threading.Thread(target=_watch, args=(marker, done))
    watcher.start()
    try:
        res = run_python(code, lim)
        done.set()
        watcher.join()
        assert "seen by the host" in res.stdout, (res.status, res.stdout, res.stderr)
        assert res.status == ends_in, (res.status, res.stdout, res.stderr)
        if syscall_filter:  # the filter keeps the tie: prctl fails with EPERM
            assert res.stdout.startswith("pdeathsig kept: errno 1\npdeathsig now 9\n"), res.stdout
        else:  # the tie is cut; only the supervisor's own kill of the sandbox's PID 1 is left
            assert res.stdout.startswith("pdeathsig now 0\n"), res.stdout
        assert marked(marker) == [], "the sandboxed program outlived run_python"
    finally:
        done.set()
        watcher.join()
        kill_leftovers(marker)


# A trainer stand-in: runs the orphan through the tool and says when the host can see it.
TRAINER = """\
import os, signal, sys, threading, time
sys.path[:0] = [{tests!r}]
from dapo.tools.sandbox import SandboxLimits, run_python
from fixtures.sandbox_helpers import ORPHAN, marked
marker, syscall_filter = sys.argv[1], sys.argv[2] == '1'
# Ctrl-C raises here even when the test runs in a background job, whose SIGINT is ignored and
# inherited so (Python then installs no handler, and the interrupt would never arrive)
signal.signal(signal.SIGINT, signal.default_int_handler)
def announce():
    while not marked(marker):
        time.sleep(0.02)
    os.kill(marked(marker)[0], signal.SIGUSR1)
    print('running', marked(marker)[0], flush=True)
threading.Thread(target=announce, daemon=True).start()
lim = SandboxLimits(cpu_seconds=30, wall_seconds=600.0, audit_hook=False, syscall_filter=syscall_filter)
try:
    res = run_python(ORPHAN.format(marker=marker, then=''), lim)
    print('returned', res.status, flush=True)
except KeyboardInterrupt:
    print('interrupted; left alive:', marked(marker, zombies=False), flush=True)
"""

# how the trainer ends while the call runs, and whether the test needs the filter for it to hold
ENDINGS = [
    pytest.param("sigkill", True, id="killed"),  # no chance to clean up: bwrap's death must do it
    pytest.param("exit", True, id="exits"),  # another thread ends the process (os._exit)
    pytest.param("interrupt", True, id="interrupted"),  # Ctrl-C in the supervisor's poll
    pytest.param("interrupt", False, id="interrupted-filter-off"),  # the supervisor's kill alone
]


@pytest.mark.parametrize(("ending", "syscall_filter"), ENDINGS)
def test_a_trainer_that_ends_leaves_no_sandbox_behind(ending, syscall_filter):
    marker = "dt" + uuid.uuid4().hex[:12]
    tests = str(Path(__file__).parent)
    script = TRAINER.format(tests=tests)
    if ending == "exit":
        script = script.replace("flush=True)\nthreading", "flush=True)\n    os._exit(0)\nthreading", 1)
    child = subprocess.Popen(
        [sys.executable, "-c", script, marker, "1" if syscall_filter else "0"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(tests).parent / "src"), tests])},
    )
    held: list[int] = []
    try:
        line = child.stdout.readline()
        assert line.startswith("running "), line
        try:  # hold the sandbox by a pidfd: its pid cannot be reused under the test
            held.append(os.pidfd_open(int(line.split()[1])))
        except ProcessLookupError:
            pass  # gone already
        if ending == "sigkill":
            child.kill()
        elif ending == "interrupt":
            child.send_signal(signal.SIGINT)
        rest = child.stdout.read()
        child.wait()
        if ending == "interrupt":
            assert rest == "interrupted; left alive: []\n", rest
        # the kill is on its way once the trainer is gone; a sandbox that is never killed keeps
        # sleeping for an hour, so a generous bound tells the two apart without timing anything
        for fd in held:
            assert select.select([fd], [], [], 120)[0], "the sandbox outlived the trainer"
        assert marked(marker, zombies=False) == []
    finally:
        child.kill()
        child.wait()
        for fd in held:
            os.close(fd)
        kill_leftovers(marker)
