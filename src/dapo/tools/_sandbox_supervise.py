"""The sandbox's supervisor: reads its pipes under a deadline and makes sure it ends with its call.

Used by :func:`dapo.tools.sandbox.run_python`; knows processes and pipes, not limits or results.
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

GRACE_SECONDS = 2.0  # after a kill, how long to wait for the pipes to close and the processes to go
STATUS_CAP = 1 << 16  # bytes of the runner's status report kept


@dataclass
class Observed:
    """What the parent saw of one run."""

    out: bytes = b""
    err: bytes = b""
    status: bytes = b""
    wait_status: int | None = None
    cpu: float = 0.0
    reason: str | None = None  # timeout | output_limit: the parent killed it


# How the sandbox is made to end with its call. The program is PID 1 of its namespace
# (--as-pid-1): when it dies the kernel kills everything else in the namespace, and its death is
# complete only once they are gone. So killing it, and waiting for it, is enough. bwrap reports
# its host pid on --info-fd; the supervisor holds a pidfd on it (no pid reuse can redirect the
# kill) and SIGKILLs it through that pidfd; bwrap reaps it and exits (and is killed too only if
# it lingers). This needs no privilege beyond the sandbox's own user (root's child runs as
# nobody, a non-root trainer's as itself, and a setuid bwrap drops to the caller before the
# program runs), unlike a cgroup, which a non-root trainer usually cannot create. Killing bwrap
# alone is not enough: the program's parent-death signal (set by --die-with-parent) is all that
# ties it to bwrap, and the program could clear it if the seccomp filter did not refuse that.
# That signal is still the way the sandbox dies with a trainer killed outright (SIGKILL, the OOM
# killer): the trainer's death kills bwrap (--die-with-parent), and bwrap's death the program.
_CHILD_PID = re.compile(rb'"child-pid"\s*:\s*(\d+)\D')


def _open_init(info: bytes, bwrap_pid: int) -> int | None:
    """A pidfd on the sandbox's PID 1, from bwrap's ``--info-fd`` report, or None if it is gone.

    The pid is checked to be bwrap's child while the pidfd is held: had it exited and been
    reaped (its namespace gone with it) and the pid been reused, the check fails."""
    m = _CHILD_PID.search(info)
    if m is None:
        return None
    pid = int(m[1])
    try:
        fd = os.pidfd_open(pid)
    except OSError:  # gone already, or a kernel without pidfds (< 5.3): bwrap's death kills it
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
        ppid = int(stat.rsplit(b")", 1)[1].split()[1])  # the name before ")" may hold anything
        try:
            signal.pidfd_send_signal(fd, 0)  # still alive, so /proc described this process
        except PermissionError:
            pass  # a setuid bwrap's child before it drops to the caller: alive all the same
        if ppid == bwrap_pid:
            return fd
    except (OSError, ValueError, IndexError):
        pass
    os.close(fd)
    return None


def _kill(proc: subprocess.Popen, init_fd: int | None, bwrap: bool) -> None:
    """SIGKILL the sandbox's PID 1 (and so its namespace), and with ``bwrap`` bwrap's process group.

    Left alone, bwrap reaps its dead child and exits; killed with it, the child is left to the
    host's init to reap, a zombie for a while."""
    kills = [lambda: os.killpg(proc.pid, signal.SIGKILL), lambda: os.kill(proc.pid, signal.SIGKILL)]
    if init_fd is not None:
        try:
            signal.pidfd_send_signal(init_fd, signal.SIGKILL)
        except OSError:  # gone already; or not ours to signal yet (setuid bwrap): bwrap's death kills it
            bwrap = True
    for kill in kills if bwrap or init_fd is None else ():
        try:
            kill()
        except OSError:
            pass


def supervise(
    proc: subprocess.Popen,
    out_r: int,
    err_r: int,
    status_r: int,
    info_r: int | None,
    deadline: float,
    keep_bytes: int,
    max_output_bytes: int,
) -> Observed:
    """Read the pipes and wait for bwrap (or the weak mode's runner, ``proc``) and the sandbox's
    PID 1 to be gone, never blocking past the deadline (+ grace). Keeps ``keep_bytes`` of each
    output stream; past ``max_output_bytes`` read in all, the program is killed."""
    seen = Observed()
    keep = {
        out_r: keep_bytes,
        err_r: keep_bytes,
        status_r: STATUS_CAP + 1,  # one more byte: to tell a status at the cap from a longer one
    }
    bufs = {out_r: bytearray(), err_r: bytearray(), status_r: bytearray()}
    if info_r is not None:
        keep[info_r], bufs[info_r] = 4096, bytearray()
    read_total = 0
    try:
        pidfd: int | None = os.pidfd_open(proc.pid)  # readable when the process exits
    except OSError:  # Linux < 5.3: poll the process every 50 ms instead
        pidfd = None
    init_fd: int | None = None  # the sandbox's PID 1, once bwrap has said which it is
    poller = select.poll()
    for fd in (out_r, err_r, status_r, info_r, pidfd):
        if fd is not None:
            poller.register(fd, select.POLLIN)
    open_fds = set(bufs)
    exited, init_gone, give_up = False, False, None

    def reap(flags: int) -> bool:
        pid, wait_status, usage = os.wait4(proc.pid, flags)
        if pid:
            seen.wait_status = wait_status
            seen.cpu = usage.ru_utime + usage.ru_stime
        return bool(pid)

    try:
        while open_fds or not exited or (init_fd is not None and not init_gone):
            now = time.monotonic()
            if seen.reason is None and now >= deadline:
                seen.reason = "timeout"
            if seen.reason is not None and give_up is None:
                _kill(proc, init_fd, bwrap=False)
                give_up = now + GRACE_SECONDS
            if give_up is not None and now >= give_up:
                break
            wait_s = (give_up if give_up is not None else deadline) - now
            if pidfd is None and not exited:
                wait_s = min(wait_s, 0.05)
                exited = reap(os.WNOHANG)
            for fd, _ in poller.poll(max(0.0, wait_s) * 1000 + 1):
                if fd == pidfd:
                    exited = reap(0)
                    poller.unregister(pidfd)
                    continue
                if fd == init_fd:
                    init_gone = True
                    poller.unregister(init_fd)
                    continue
                data = os.read(fd, 65536)
                if not data:
                    poller.unregister(fd)
                    open_fds.discard(fd)
                    continue
                room = keep[fd] - len(bufs[fd])
                if room > 0:
                    bufs[fd] += data[:room]
                if fd == info_r:
                    if init_fd is None and (init_fd := _open_init(bytes(bufs[fd]), proc.pid)) is not None:
                        poller.register(init_fd, select.POLLIN)
                        if give_up is not None:  # killed before bwrap said who its child was
                            _kill(proc, init_fd, bwrap=False)
                    continue
                read_total += len(data)  # the status pipe counts too: it is the program's to write
                if read_total > max_output_bytes and seen.reason is None:
                    seen.reason = "output_limit"
    finally:
        # also on the way out of an exception (an interrupt in the trainer): nothing may outlive the call
        if not exited or (init_fd is not None and not init_gone):
            _kill(proc, init_fd, bwrap=True)
        if init_fd is not None:
            if not init_gone:  # SIGKILLed; its namespace is empty when it is gone
                select.select([init_fd], [], [], GRACE_SECONDS)
            os.close(init_fd)
        if pidfd is not None:
            os.close(pidfd)
        if not exited:
            try:  # SIGKILLed: it is gone or going; reap it if it is, never wait on it
                reap(os.WNOHANG)
            except ChildProcessError:
                pass
    if seen.wait_status is not None:
        proc.returncode = os.waitstatus_to_exitcode(seen.wait_status)
    seen.out, seen.err, seen.status = bytes(bufs[out_r]), bytes(bufs[err_r]), bytes(bufs[status_r])
    return seen
