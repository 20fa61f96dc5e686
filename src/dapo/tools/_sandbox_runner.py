"""Runs inside the sandbox (``python -I -S``): limits itself, installs the guard, runs the code.

argv: work_dir cpu_seconds memory_bytes file_bytes max_processes max_open_files code_fd status_fd
audit(0|1).
The code is read from ``code_fd``; a JSON status (refused operations, the exception raised) goes
to ``status_fd``. Every other descriptor is closed first. Not imported by the trainer: it only
uses the standard library.

The audit hook is the second layer, behind the OS sandbox: it turns the common forbidden
operations into a ``PermissionError`` the code (and the model) can read, and it is counted. It
is not a boundary: a determined program can get around it, which is why the parent decides
limit hits from its own observation and the OS sandbox holds the line.
"""

import json
import os
import resource
import signal
import sys
import traceback
import types

REFUSED_EVENTS = {
    "os.fork": "fork",
    "os.forkpty": "fork",
    "os.posix_spawn": "spawn a process",
    "os.spawn": "spawn a process",
    "os.exec": "exec a program",
    "os.system": "run a shell command",
    "subprocess.Popen": "spawn a process",
    "pty.spawn": "spawn a process",
    "os.kill": "send a signal",
    "os.killpg": "send a signal",
    "signal.pthread_kill": "send a signal",
    "socket.__new__": "open a socket",
    "socket.connect": "connect a socket",
    "socket.bind": "bind a socket",
    "socket.getaddrinfo": "resolve a host name",
    "ctypes.dlopen": "load a native library",
    "ctypes.dlsym": "load a native symbol",
    "ctypes.cdata": "read raw memory",
    "os.chroot": "chroot",
    "os.setuid": "change user",
    "resource.setrlimit": "change resource limits",
    "resource.prlimit": "change resource limits",
    # the guard function and its closure are reachable only through the heap
    "gc.get_objects": "walk the heap",
    "gc.get_referrers": "walk the heap",
    "gc.get_referents": "walk the heap",
}
REFUSED_IMPORTS = {"_posixsubprocess", "_ctypes", "ctypes", "multiprocessing", "_multiprocessing"}
# events whose arguments name paths that must stay inside the sandbox directory:
# event -> (how many leading path arguments, whether the last argument is a dir_fd)
PATH_EVENTS = {
    "os.remove": (1, True),
    "os.rename": (2, True),
    "os.rmdir": (1, True),
    "os.mkdir": (1, True),
    "os.mkfifo": (1, True),
    "os.mknod": (1, True),
    "os.chmod": (1, True),
    "os.chown": (1, True),
    "os.link": (2, True),
    "os.symlink": (2, True),
    "os.truncate": (1, False),
    "os.utime": (1, True),
    "os.chdir": (1, False),
    "shutil.rmtree": (1, True),
    "shutil.copyfile": (2, False),
    "shutil.move": (2, False),
    "sqlite3.connect": (1, False),
}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def make_guard(box: str, refused: list):
    """The audit hook; its tables are frozen into the closure, out of reach of ``__main__``."""
    events = types.MappingProxyType(dict(REFUSED_EVENTS))
    imports = frozenset(REFUSED_IMPORTS)
    path_events = types.MappingProxyType(dict(PATH_EVENTS))
    realpath, fsdecode, isdir, sep = os.path.realpath, os.fsdecode, os.path.isdir, os.sep

    def inside(path: object, relative_to_fd: bool = False) -> bool:
        if isinstance(path, int):
            return True  # an already-open descriptor
        if isinstance(path, bytes):
            path = fsdecode(path)
        if not isinstance(path, str):
            return False
        if path.startswith("file:") or (relative_to_fd and not path.startswith(sep)):
            return False  # a URI, or relative to a directory descriptor: cannot tell where it lands
        full = realpath(path)  # relative paths resolve against the current directory
        return full == box or full.startswith(box + sep)

    def refuse(what: str) -> None:
        refused.append(what)
        raise PermissionError(f"sandbox: not allowed to {what}")

    def guard(event: str, args: tuple) -> None:
        if event in events:
            refuse(events[event])
        elif event == "import":
            if args and str(args[0]).split(".")[0] in imports:
                refuse(f"import {args[0]}")
        elif event == "open":
            path, mode, flags = (list(args) + [None, None, None])[:3]
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & WRITE_FLAGS
            )
            if not inside(path):
                if writes:
                    refuse(f"write outside its directory ({path})")
                if isinstance(flags, int) and isinstance(path, (str, bytes)) and isdir(path):
                    refuse(f"open a directory outside its directory ({path})")  # a dir_fd for openat
        elif event in path_events:
            n, has_dir_fd = path_events[event]
            dir_fd = args[-1] if has_dir_fd and len(args) > n else None
            by_fd = isinstance(dir_fd, int) and not isinstance(dir_fd, bool)
            for path in args[:n]:
                if path != ":memory:" and not inside(path, by_fd):
                    refuse(f"{event} outside its directory ({path})")

    return guard


def main() -> None:
    box = sys.argv[1]
    cpu, mem, fsize, nproc, nofile = (int(a) for a in sys.argv[2:7])
    code_fd, status_fd, audit = int(sys.argv[7]), int(sys.argv[8]), sys.argv[9] == "1"
    with os.fdopen(code_fd, "rb") as f:
        code = f.read().decode("utf-8", errors="replace")
    os.closerange(3, status_fd)
    os.closerange(status_fd + 1, 1 << 16)
    box = os.path.realpath(box)
    os.chdir(box)
    # soft == hard: as PID 1 of its namespace the interpreter ignores SIGXCPU, so SIGKILL it is
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an over-long write fails instead of killing
    refused: list[str] = []
    # the code's __main__ is a fresh module, not this runner (whose globals hold the tables)
    module = types.ModuleType("__main__")
    sys.modules["__main__"] = module
    if audit:
        sys.addaudithook(make_guard(box, refused))
    exc_name = None
    try:
        exec(compile(code, "<code>", "exec"), module.__dict__)
    except SystemExit as exc:
        exc_name = None if exc.code in (None, 0) else "SystemExit"
    except BaseException as exc:  # report it like the interpreter would, then the status
        exc_name = type(exc).__name__
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == "<code>"]
        text = "".join(traceback.format_list(frames)) + "".join(traceback.format_exception_only(exc))
        sys.stderr.write("Traceback (most recent call last):\n" + text)
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except OSError:
            pass
        try:
            os.write(status_fd, json.dumps({"refused": refused, "exception": exc_name}).encode())
        except OSError:
            pass
    os._exit(1 if exc_name else 0)


if __name__ == "__main__":
    main()
