"""Run untrusted Python in a separate, limited process behind an OS boundary.

The boundary is bubblewrap (``bwrap``): each run is a fresh interpreter in new user, PID,
network, IPC and UTS namespaces, as an unprivileged user with no capabilities, that sees
only a read-only view of the interpreter (its prefix without site-packages, ``/usr``) and an
empty size-limited tmpfs work directory ``/box``; with a cleared environment, no inherited
descriptors, ``/proc`` of its own PID namespace, a seccomp filter (no new processes, no
ptrace, no mounts or namespaces, no clearing of the parent-death signal, no sockets but unix
and IP ones; :mod:`dapo.tools._seccomp`) and CPU, memory and file-size limits. The parent
supervises it with a deadline: it reads the output pipes without blocking, caps what it
keeps, and at the deadline (or when the output passes its cap) kills the program, PID 1 of
its namespace, through a pidfd (its death kills every process in the namespace), and returns
only once it is gone. If the trainer dies first, bwrap dies with it and the program with
bwrap (parent-death signals the filter does not let the program clear).

Timeouts, CPU and output limits are decided here, from what the parent observed (its own
clock, the bytes it read, the CPU time the kernel reports for the process tree), never from
what the program printed; the runner's report (refusals, the exception it ended with) is
parsed as untrusted input. When the trainer runs as root, bwrap runs as ``nobody``: the
sandbox's user maps to the user that starts bwrap, and root outside would pass every
permission check on what the sandbox can see (``/proc/sys`` is root-writable). Refusals come from the in-process audit hook
(:mod:`dapo.tools._sandbox_runner`), a second layer that turns common forbidden calls into a
``PermissionError`` the model can read.

Where bubblewrap is missing or cannot run, :func:`os_boundary_problem` says why and the code
tool refuses to start unless its config opts in to the weak mode: the same runner and
supervision without the namespaces, mounts and filter (then only the audit hook, the limits
and, where available, a network namespace from ``unshare -rn`` stand between the code and
the machine).
"""

from __future__ import annotations

import glob
import os
import platform
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from dapo.tools._sandbox_supervise import STATUS_CAP, Observed, supervise
from dapo.tools._seccomp import filter_program

RUNNER = Path(__file__).with_name("_sandbox_runner.py")
BOX = "/box"  # the work directory inside the sandbox
INNER_RUNNER = "/sandbox/runner.py"
NOBODY = 65534
# installed packages under an interpreter's prefix, hidden behind an empty directory
_SITE_DIRS = (
    "lib/python3*/site-packages",
    "lib/python3*/dist-packages",
    "lib/python3/dist-packages",
    "local/lib/python3*/dist-packages",
)
_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}


@dataclass
class SandboxLimits:
    cpu_seconds: int = 5
    memory_mb: int = 512
    wall_seconds: float = 10.0
    max_output_chars: int = 4096  # kept for the model, per stream
    max_output_bytes: int = 1 << 20  # read from the program, both streams; past it the program is killed
    max_file_bytes: int = 1 << 20  # RLIMIT_FSIZE
    disk_mb: int = 16  # size of the tmpfs work directory
    max_processes: int = 16  # RLIMIT_NPROC (threads count too; the OS sandbox allows one process)
    # RLIMIT_NOFILE: memfds, pipes and socket buffers hold memory outside RLIMIT_AS and the tmpfs
    # quota; the number of descriptors (each memfd at most max_file_bytes) is what bounds it
    max_open_files: int = 64
    network_namespace: str = "auto"  # weak mode only: auto | always | never (unshare -rn)
    # off only in tests, to check each layer on its own: the in-process guard and the seccomp filter
    audit_hook: bool = True
    syscall_filter: bool = True


@dataclass
class SandboxResult:
    # ok | error | refused | timeout | cpu_limit | memory_limit | output_limit | killed
    status: str
    stdout: str
    stderr: str
    returncode: int | None
    refused: list[str] = field(default_factory=list)
    exception: str | None = None
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    # what was wrong with the runner's status report, which was then set aside (None: nothing)
    status_problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


# ------------------------------------------------------------------ the OS boundary
@lru_cache(maxsize=1)
def _bwrap_features() -> frozenset[str] | None:
    exe = shutil.which("bwrap")
    if not exe:
        return None
    try:
        done = subprocess.run([exe, "--help"], capture_output=True, timeout=30, env=_ENV)
    except (OSError, subprocess.SubprocessError):
        return None
    text = (done.stdout + done.stderr).decode(errors="replace")
    return frozenset(f for f in ("--size", "--disable-userns", "--perms") if f in text)


def _runs_as() -> tuple[int, int] | None:
    """The (uid, gid) bwrap runs as: ``nobody`` when the trainer is root, else the trainer's own.

    The sandbox's user maps to the user that started bwrap. Started by root it would be root
    outside for every permission check on what it can see, and a read-only view does not cover
    everything (``/proc/sys`` is root-writable, not a mount of its own)."""
    return (NOBODY, NOBODY) if os.geteuid() == 0 else None


def _others_can_read(path: str) -> bool:
    """Every directory on the way is searchable by others and the path itself readable by them."""
    full = os.path.realpath(path)
    try:
        if not os.stat(full).st_mode & stat.S_IROTH:
            return False
        parent = os.path.dirname(full)
        while True:
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return False
            if parent == os.path.dirname(parent):
                return True
            parent = os.path.dirname(parent)
    except OSError:
        return False


@lru_cache(maxsize=2)
def _interpreter(as_other_user: bool) -> tuple[str, list[str], list[str]] | None:
    """The interpreter to run in the sandbox, the directories it needs, and its site dirs to hide.

    The trainer's base interpreter (not a venv's) when the sandbox user can read it, else the
    system's ``/usr/bin/python3``; only the standard library is used."""
    exe = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    prefixes = {os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix)}
    if not any(exe.startswith(p + os.sep) for p in prefixes):
        prefixes.add(os.path.dirname(exe))
    for cand, dirs in ((exe, sorted(prefixes)), (os.path.realpath("/usr/bin/python3"), ["/usr"])):
        if not os.path.isfile(cand) or (as_other_user and not all(map(_others_can_read, [cand, *dirs]))):
            continue
        found = (glob.glob(os.path.join(d, pat)) for d in dirs for pat in _SITE_DIRS)
        hide = sorted({os.path.realpath(p) for paths in found for p in paths if os.path.isdir(p)})
        return cand, dirs, hide
    return None


def bwrap_argv(
    lim: SandboxLimits, code_fd: int, status_fd: int, seccomp_fd: int, runner_fd: int, info_fd: int
) -> list[str] | None:
    """The bwrap command line, or None when no interpreter is readable by the sandbox user.

    ``info_fd`` gets bwrap's report of the sandbox's pid (see :mod:`dapo.tools._sandbox_supervise`)."""
    feats = _bwrap_features() or frozenset()
    interp = _interpreter(_runs_as() is not None)
    if interp is None:
        return None
    exe, prefixes, hide = interp
    argv = [shutil.which("bwrap") or "bwrap"]
    argv += ["--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"]
    argv += ["--unshare-cgroup-try", "--die-with-parent", "--new-session", "--as-pid-1"]
    argv += ["--info-fd", str(info_fd)]
    argv += ["--uid", "65534", "--gid", "65534", "--hostname", "sandbox", "--cap-drop", "ALL"]
    if "--disable-userns" in feats:
        argv.append("--disable-userns")
    argv += ["--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "LANG", "C.UTF-8"]
    argv += ["--setenv", "HOME", BOX, "--setenv", "TMPDIR", BOX]
    argv += ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    if os.path.isfile("/etc/ld.so.cache"):
        argv += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    for p in prefixes:
        if p != "/usr" and not p.startswith("/usr/"):
            argv += ["--ro-bind", p, p]
    for d in hide:  # the interpreter's own site-packages: an empty read-only directory
        argv += ["--tmpfs", d, "--remount-ro", d]
    argv += ["--ro-bind-data", str(runner_fd), INNER_RUNNER]  # a copy: the package may be unreadable
    argv += ["--proc", "/proc", "--dev", "/dev"]
    if "--size" in feats:
        argv += ["--size", str(int(lim.disk_mb) << 20)]
    if "--perms" in feats:
        argv += ["--perms", "0700"]
    argv += ["--tmpfs", BOX, "--chdir", BOX, "--remount-ro", "/dev", "--remount-ro", "/"]
    if seccomp_fd >= 0:
        argv += ["--seccomp", str(seccomp_fd)]
    argv += ["--", exe, "-I", "-S", "-B", INNER_RUNNER]
    return argv + _runner_args(BOX, lim, code_fd, status_fd)


def _runner_args(box: str, lim: SandboxLimits, code_fd: int, status_fd: int) -> list[str]:
    return [
        box,
        str(int(lim.cpu_seconds)),
        str(int(lim.memory_mb) << 20),
        str(int(lim.max_file_bytes)),
        str(int(lim.max_processes)),
        str(int(lim.max_open_files)),
        str(code_fd),
        str(status_fd),
        "1" if lim.audit_hook else "0",
    ]


@lru_cache(maxsize=1)
def network_namespace_available() -> bool:
    exe = shutil.which("unshare")
    if not exe:
        return False
    try:
        done = subprocess.run([exe, "-rn", "true"], capture_output=True, timeout=10, env=_ENV)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def _weak_argv(box: str, lim: SandboxLimits, code_fd: int, status_fd: int) -> list[str]:
    argv = [os.path.realpath(sys.executable), "-I", "-S", "-B", str(RUNNER)]
    argv += _runner_args(box, lim, code_fd, status_fd)
    use_ns = lim.network_namespace == "always" or (
        lim.network_namespace == "auto" and network_namespace_available()
    )
    return [shutil.which("unshare") or "unshare", "-rn", *argv] if use_ns else argv


@lru_cache(maxsize=1)
def os_boundary_problem() -> str | None:
    """None when bubblewrap runs a probe program in the full sandbox here; otherwise why not."""
    if _bwrap_features() is None:
        return "bubblewrap (bwrap) is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    if filter_program() is None:
        return f"no seccomp filter for this machine ({platform.machine()}); x86_64 and aarch64 only"
    if _interpreter(_runs_as() is not None) is None:
        return (
            f"no Python interpreter the sandbox user (uid {NOBODY}) can read: {sys.executable}'s "
            "directories are private and there is no /usr/bin/python3 (install the system python3)"
        )
    res = run_python("print(6 * 7)", SandboxLimits(cpu_seconds=10, wall_seconds=60.0))
    if res.status != "ok" or res.stdout != "42\n":
        why = (res.stderr.strip().splitlines() or [res.status])[0]
        return f"bubblewrap cannot start the sandbox here: {why}"
    return None


# ------------------------------------------------------------------ running
def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, 0)  # no MFD_CLOEXEC: the child inherits it through pass_fds
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def run_python(code: str, limits: SandboxLimits | None = None, *, weak: bool = False) -> SandboxResult:
    """Run ``code`` under ``limits`` (in the OS sandbox unless ``weak``); never raises for what it does."""
    lim = limits or SandboxLimits()
    t0 = time.monotonic()
    fds: list[int] = []
    box = tempfile.mkdtemp(prefix="dapo-sandbox-") if weak else None
    try:
        code_fd = _memfd("code", code.encode("utf-8", errors="replace"))
        fds.append(code_fd)
        status_r, status_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        fds += [status_r, status_w, out_r, out_w, err_r, err_w]
        passed = [code_fd, status_w]
        info_r = None
        user: dict = {}
        if weak:
            argv = _weak_argv(box, lim, code_fd, status_w)
        else:
            program = filter_program() if lim.syscall_filter else b""
            runner_fd = _memfd("runner", RUNNER.read_bytes())
            fds.append(runner_fd)
            passed.append(runner_fd)
            seccomp_fd = -1
            if program:
                seccomp_fd = _memfd("seccomp", program)
                fds.append(seccomp_fd)
                passed.append(seccomp_fd)
            info_r, info_w = os.pipe()
            fds += [info_r, info_w]
            passed.append(info_w)
            argv = bwrap_argv(lim, code_fd, status_w, seccomp_fd, runner_fd, info_w)
            if argv is None or program is None:
                why = "no interpreter the sandbox user can read" if argv is None else "no seccomp filter here"
                return SandboxResult("error", "", f"sandbox: cannot start: {why}", None)
            if _runs_as() is not None:
                uid, gid = _runs_as()
                user = {"user": uid, "group": gid, "extra_groups": []}
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out_w,
                stderr=err_w,
                cwd=box or "/",
                env=dict(_ENV),
                pass_fds=passed,
                close_fds=True,
                start_new_session=True,
                **user,
            )
        except OSError as exc:
            return SandboxResult("error", "", f"sandbox: could not start: {exc}", None)
        for fd in (*passed, out_w, err_w):  # the child holds the only write ends now
            os.close(fd)
            fds.remove(fd)
        caps = (int(lim.max_output_chars) * 4 + 4, int(lim.max_output_bytes))
        seen = supervise(proc, out_r, err_r, status_r, info_r, t0 + float(lim.wall_seconds), *caps)
    finally:
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
        if box:
            shutil.rmtree(box, ignore_errors=True)
    return _result(seen, lim, time.monotonic() - t0)


def _text(data: bytes, limit: int) -> str:
    text = data.decode("utf-8", errors="replace")
    if len(text) > limit:
        text = text[:limit] + f"\n...[output truncated at {limit} characters]"
    return text


def parse_status(raw: bytes) -> tuple[list[str], str | None, str | None]:
    """The runner's status report: (refused operations, the exception the code ended with, None),
    or ([], None, what is wrong with it) when it is not the runner's format.

    The program can write this pipe too, so the parse trusts nothing: every line must be
    ``refused TEXT`` (``TEXT`` one ASCII line in ``unicode_escape``) or one final ``end NAME``
    (an identifier, or ``-``); there is no nesting and no type to confuse. A report may stop
    short of ``end`` (the program was killed, or left by ``os._exit``)."""
    if len(raw) > STATUS_CAP:
        return [], None, f"longer than {STATUS_CAP} bytes"
    refused: list[str] = []
    exception, ended = None, False
    lines = raw.split(b"\n")
    if lines[-1]:
        return [], None, f"a cut-off last line {bytes(lines[-1][:40])!r}"
    for n, line in enumerate(lines[:-1], 1):
        kind, _, rest = line.partition(b" ")
        ok = not ended and rest.isascii() and rest != b""
        if ok and kind == b"refused":
            try:
                with warnings.catch_warnings():  # an invalid escape warns; under -W error it raises
                    warnings.simplefilter("ignore")
                    text = rest.decode("unicode_escape")
            except ValueError:
                ok = False
            else:
                refused.append(text)
        elif ok and kind == b"end" and (rest == b"-" or rest.decode().isidentifier()):
            exception, ended = (None if rest == b"-" else rest.decode()), True
        else:
            ok = False
        if not ok:
            return [], None, f"line {n} is not a status line: {bytes(line[:40])!r}"
    return refused[:100], exception, None


def _result(seen: Observed, lim: SandboxLimits, seconds: float) -> SandboxResult:
    """The run's status. Timeouts, CPU and output limits and the exit code come from the parent's
    own observation (its clock, the kernel's CPU account of the process tree, the bytes it read,
    bwrap's exit status). Refusals and a ``MemoryError`` (how ``RLIMIT_AS`` shows) come from the
    runner's report on its own pipe, never from the program's output; a program that takes over
    its interpreter can write that pipe too, so it can claim those (a count in the metrics), never
    a limit the parent did not see, and a report that is not the runner's format is set aside
    (``status_problem`` says why)."""
    refused, exception, problem = parse_status(seen.status)
    ws = seen.wait_status
    rc = None if ws is None else os.waitstatus_to_exitcode(ws)
    # bwrap exits 128+N when the program dies of signal N
    signalled = rc is not None and (rc < 0 or rc > 128)
    if seen.reason is not None:
        kind = seen.reason
    # RLIMIT_CPU's SIGKILL; the kernel checks the limit on tick samples and reports a scaled
    # figure, which can fall short of the limit by several percent
    elif signalled and seen.cpu >= 0.5 * lim.cpu_seconds:
        kind = "cpu_limit"
    elif exception == "MemoryError" and rc != 0:
        kind = "memory_limit"
    elif refused:
        kind = "refused"
    elif rc == 0:
        kind = "ok"
    elif signalled:
        kind = "killed"
    else:
        kind = "error"
    return SandboxResult(
        kind,
        _text(seen.out, lim.max_output_chars),
        _text(seen.err, lim.max_output_chars),
        rc,
        refused,
        exception,
        seconds,
        seen.cpu,
        problem,
    )
