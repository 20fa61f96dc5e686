"""Runs inside the sandbox (``python -I -S``): limits itself, installs the guard, runs the code.

argv: work_dir cpu_seconds memory_bytes file_bytes max_processes max_open_files code_fd status_fd
audit(0|1).
The code is read from ``code_fd``. The status goes to ``status_fd``, one line each: ``refused
TEXT`` for every refused operation as it happens (``TEXT`` in Python's ``unicode_escape``, so it is
one ASCII line), then ``end NAME`` (the exception the code ended with, ``-`` for none). Every other descriptor is closed first. Not imported by the trainer: it only
uses the standard library.

The audit hook is the second layer, behind the OS sandbox: it turns the common forbidden
operations into a ``PermissionError`` the code (and the model) can read, and it is counted. It
is not a boundary: a determined program can get around it, which is why the parent decides
limit hits from its own observation and the OS sandbox holds the line.
"""

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
# CPython's test modules (_testcapi, _testinternalcapi, ...) poke at raw memory and internals
REFUSED_IMPORT_PREFIXES = ("_test", "_xxtest", "_ctypes")
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


def make_guard(box: str, status_fd: int):
    """The audit hook. It records each refusal on the status pipe as it happens (a program cannot
    take one back) and raises ``PermissionError``.

    A refusal's traceback holds the hook's frame, and through it the frame's locals and globals.
    So the hook has no closure (cells can be rewritten) and reads no global or builtin name
    (``builtins`` and this module can be patched): everything it uses is bound as a keyword
    default when it is made, and every such default is immutable (frozensets, tuples, strings,
    numbers and functions; a frame's locals are those very objects, and a mapping proxy would
    hand out its dict to an ``__eq__`` it is compared with). The function object is referenced
    only by the interpreter's hook list, and replacing any function's ``__code__``,
    ``__defaults__`` or ``__kwdefaults__`` (the helpers it calls are ordinary library functions)
    is itself refused, as is walking the heap to find it."""

    event_what, path_args = tuple(REFUSED_EVENTS.items()), tuple(PATH_EVENTS.items())

    def guard(
        event,
        args,
        *,
        _events=frozenset(REFUSED_EVENTS),
        _event_what=event_what,
        _imports=frozenset(REFUSED_IMPORTS),
        _import_prefixes=REFUSED_IMPORT_PREFIXES,
        _path_events=frozenset(PATH_EVENTS),
        _path_args=path_args,
        _func_slots=frozenset(("__code__", "__defaults__", "__kwdefaults__")),
        _box=box,
        _sep=os.sep,
        _fd=status_fd,
        _write_flags=WRITE_FLAGS,
        _realpath=os.path.realpath,
        _fsdecode=os.fsdecode,
        _isdir=os.path.isdir,
        _write=os.write,
        _str=str,
        _exact_str=str.__str__,
        _bytes=bytes,
        _int=int,
        _bool=bool,
        _len=len,
        _isinstance=isinstance,
        _refusal=PermissionError,
        _oserror=OSError,
    ):
        what = None
        if event in _events:
            for e, w in _event_what:
                if e == event:
                    what = w
        elif event == "import":
            top = _str(args[0]).split(".")[0] if args else ""
            if top in _imports or top.startswith(_import_prefixes):
                what = f"import {args[0]}"
        elif event == "object.__setattr__":
            if _len(args) > 1 and args[1] in _func_slots:
                what = f"replace a function's {args[1]}"
        elif event == "open" or event in _path_events:
            if event == "open":
                path, mode, flags = (args + (None, None, None))[:3]
                paths, by_fd = args[:1], False
                writes = (
                    _isinstance(mode, _str) and ("w" in mode or "a" in mode or "x" in mode or "+" in mode)
                ) or (_isinstance(flags, _int) and flags & _write_flags)
            else:
                n, has_dir_fd = 1, False
                for e, spec in _path_args:
                    if e == event:
                        n, has_dir_fd = spec
                dir_fd = args[-1] if has_dir_fd and _len(args) > n else None
                paths, by_fd = args[:n], _isinstance(dir_fd, _int) and not _isinstance(dir_fd, _bool)
            for given in paths:
                path = _fsdecode(given) if _isinstance(given, _bytes) else given
                if _isinstance(path, _str):
                    path = _exact_str(path)  # a str subclass's own __eq__ would answer the checks below
                if _isinstance(path, _int) or path == ":memory:":
                    continue  # an already-open descriptor; sqlite's in-memory database
                if (
                    not _isinstance(path, _str)
                    or path.startswith("file:")
                    or (by_fd and not path.startswith(_sep))
                ):
                    inside = False  # a URI, or relative to a directory descriptor: cannot tell where it lands
                else:
                    full = _realpath(path)  # relative paths resolve against the current directory
                    inside = full == _box or full.startswith(_box + _sep)
                if inside:
                    continue
                if event != "open":
                    what = f"{event} outside its directory ({given})"
                elif writes:
                    what = f"write outside its directory ({given})"
                elif _isinstance(flags, _int) and _isinstance(given, (_str, _bytes)) and _isdir(given):
                    what = f"open a directory outside its directory ({given})"  # a dir_fd for openat
                if what is not None:
                    break
        if what is None:
            return
        try:
            _write(_fd, b"refused " + what.encode("unicode_escape") + b"\n")
        except _oserror:
            pass  # the program closed its status pipe: the refusal still stands
        raise _refusal(f"sandbox: not allowed to {what}")

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
    # the code's __main__ is a fresh module, not this runner (whose globals hold the tables)
    module = types.ModuleType("__main__")
    sys.modules["__main__"] = module
    if audit:
        sys.addaudithook(make_guard(box, status_fd))
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
        if exc_name is not None and not (exc_name.isascii() and exc_name.isidentifier()):
            exc_name = "Exception"  # a class name the status line could not carry
        try:
            os.write(status_fd, b"end " + (exc_name or "-").encode() + b"\n")
        except OSError:
            pass
    os._exit(1 if exc_name else 0)


if __name__ == "__main__":
    main()
