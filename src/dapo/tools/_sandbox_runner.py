"""Runs inside the sandbox child (``python -I``): limits itself, installs the guard, runs the code.

argv: sandbox_dir cpu_seconds memory_bytes file_bytes status_fd. The code comes on stdin. A JSON
status (refused operations, the exception raised) goes to the descriptor ``status_fd``. Not imported by
the trainer: it only uses the standard library.
"""

import json
import os
import resource
import signal
import sys
import traceback

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
}
REFUSED_IMPORTS = {"_posixsubprocess", "_ctypes", "ctypes", "multiprocessing", "_multiprocessing"}
# events whose arguments name paths that must stay inside the sandbox directory
PATH_EVENTS = {
    "os.remove": 1,
    "os.rename": 2,
    "os.rmdir": 1,
    "os.mkdir": 1,
    "os.chmod": 1,
    "os.chown": 1,
    "os.link": 2,
    "os.symlink": 2,
    "os.truncate": 1,
    "os.utime": 1,
    "os.chdir": 1,
    "shutil.rmtree": 1,
    "shutil.copyfile": 2,
    "shutil.move": 2,
}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def main() -> None:
    box, cpu, mem, fsize = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    code = sys.stdin.read()
    box = os.path.realpath(box)
    os.chdir(box)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an over-long write fails instead of killing
    status_fd = int(sys.argv[5])
    refused: list[str] = []

    def inside(path: object) -> bool:
        if isinstance(path, int):
            return True  # an already-open descriptor
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if not isinstance(path, str):
            return False
        full = os.path.realpath(path)  # relative paths resolve against the current directory
        return full == box or full.startswith(box + os.sep)

    def refuse(what: str) -> None:
        refused.append(what)
        raise PermissionError(f"sandbox: not allowed to {what}")

    def guard(event: str, args: tuple) -> None:
        if event in REFUSED_EVENTS:
            refuse(REFUSED_EVENTS[event])
        elif event == "import":
            if args and str(args[0]).split(".")[0] in REFUSED_IMPORTS:
                refuse(f"import {args[0]}")
        elif event == "open":
            path, mode, flags = (list(args) + [None, None, None])[:3]
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & WRITE_FLAGS
            )
            if writes and not inside(path):
                refuse(f"write outside its directory ({path})")
        elif event in PATH_EVENTS:
            for path in args[: PATH_EVENTS[event]]:
                if not inside(path):
                    refuse(f"{event} outside its directory ({path})")

    sys.addaudithook(guard)
    exc_name = None
    try:
        exec(compile(code, "<code>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
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
