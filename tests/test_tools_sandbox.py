"""The code interpreter's sandbox: limits, refusals, output, and escapes counted in a rollout.

Each test runs in the OS sandbox (bubblewrap) and, where it checks the in-process guard or the
limits, in the weak mode too. The adversarial suite is tests/test_tools_sandbox_escape.py.
"""

from __future__ import annotations

import os
import types
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo.rollout.hf import SamplingParams
from dapo.rollout.multiturn import MultiTurnRollout
from dapo.tools import CodeInterpreterTool, load_tool_config, sandbox
from dapo.tools.parser import format_hermes_call
from dapo.tools.sandbox import SandboxLimits, network_namespace_available, os_boundary_problem, run_python
from fixtures.config_helpers import config_problems
from fixtures.multiturn_helpers import TOK, ScriptedEngine, rows
from runs import tool_run_args

torch.set_num_threads(1)
NO_BWRAP = os_boundary_problem()
needs_bwrap = pytest.mark.skipif(NO_BWRAP is not None, reason=f"no OS sandbox here: {NO_BWRAP}")
MODES = [pytest.param(False, id="bwrap", marks=needs_bwrap), pytest.param(True, id="weak")]
# the wall limit is far from the CPU limit so the two never race, even at load 8 on 2 cores
FAST = SandboxLimits(cpu_seconds=1, memory_mb=256, wall_seconds=60.0, max_output_chars=200)
SHORT_WALL = SandboxLimits(cpu_seconds=30, memory_mb=256, wall_seconds=2.0, max_output_chars=200)
ESCAPE_FILE = "/tmp/dapo-sandbox-escape.txt"

ESCAPES = {
    "infinite loop": ("while True:\n    pass", "cpu_limit"),
    "sleep past the wall clock": ("import time\ntime.sleep(600)", "timeout"),
    "unbounded allocation": ("x = []\nwhile True:\n    x.append(bytearray(10**7))", "memory_limit"),
    "fork": ("import os\nos.fork()", "refused"),
    "subprocess": ("import subprocess\nsubprocess.run(['true'])", "refused"),
    "os.system": ("import os\nos.system('true')", "refused"),
    "write outside": (f"open('{ESCAPE_FILE}', 'w').write('x')", "refused"),
    "write via parent dir": ("open('../dapo-sandbox-escape.txt', 'w').write('x')", "refused"),
    "delete outside": ("import os\nos.remove('/etc/hostname')", "refused"),
    "socket": ("import socket\ns = socket.socket()\ns.connect(('127.0.0.1', 9))", "refused"),
    "ctypes": ("import ctypes", "refused"),
    "kill the parent": ("import os\nos.kill(os.getppid(), 9)", "refused"),
    "flood the output": ("while True:\n    print('y' * 10000)", "output_limit"),
}


@pytest.mark.parametrize("weak", MODES)
@pytest.mark.parametrize("name", list(ESCAPES))
def test_escape_attempt_is_stopped_or_refused(name, weak):
    code, want = ESCAPES[name]
    res = run_python(code, SHORT_WALL if want == "timeout" else FAST, weak=weak)
    assert res.status == want, (res.status, res.stdout, res.stderr)
    assert not os.path.exists(ESCAPE_FILE)
    if want == "refused":
        assert res.refused and "sandbox: not allowed" in res.stderr
    if want == "cpu_limit":
        assert res.cpu_seconds >= 0.5  # the parent's own account of the CPU time
    if want == "memory_limit":
        assert res.exception == "MemoryError" and "MemoryError" in res.stderr


@pytest.mark.parametrize("weak", MODES)
def test_ordinary_code_runs_in_an_empty_private_directory(weak):
    res = run_python(
        "import os\nprint(os.listdir('.'))\nopen('a.txt', 'w').write('hi')\nprint(open('a.txt').read())",
        FAST,
        weak=weak,
    )
    assert res.status == "ok" and res.stdout == "[]\nhi\n"
    res2 = run_python("import os\nprint(os.listdir('.'))", FAST, weak=weak)
    assert res2.stdout == "[]\n"  # nothing left over from the previous run


@pytest.mark.parametrize("weak", MODES)
def test_refusal_can_be_caught_and_the_code_continues(weak):
    res = run_python(
        "import os\ntry:\n    os.fork()\nexcept PermissionError:\n    print('no fork')\nprint(6*7)",
        FAST,
        weak=weak,
    )
    assert res.status == "refused" and res.refused == ["fork"] and res.stdout == "no fork\n42\n"


def test_output_is_truncated():
    res = run_python("print('x' * 100000)", FAST, weak=NO_BWRAP is not None)
    assert res.status == "ok" and res.stdout.startswith("x" * 200) and "truncated at 200" in res.stdout
    assert len(res.stdout) < 300


def test_traceback_shows_only_the_users_code():
    res = run_python("def f():\n    return 1/0\nf()", FAST, weak=NO_BWRAP is not None)
    assert res.status == "error" and res.exception == "ZeroDivisionError"
    assert "_sandbox_runner" not in res.stderr and "runner.py" not in res.stderr
    assert 'File "<code>", line 2, in f' in res.stderr


@pytest.mark.skipif(not network_namespace_available(), reason="no user/network namespaces here")
def test_weak_mode_network_namespace_has_no_interfaces_up():
    res = run_python("print(open('/proc/net/dev').read())", SandboxLimits(wall_seconds=60.0), weak=True)
    lines = [ln.split(":")[0].strip() for ln in res.stdout.splitlines()[2:] if ":" in ln]
    assert lines == ["lo"]


@pytest.fixture
def no_bwrap_on_path(tmp_path, monkeypatch):
    """PATH without bubblewrap (or unshare), with the cached probes forgotten before and after."""
    caches = (sandbox._bwrap_features, sandbox.os_boundary_problem, sandbox.network_namespace_available)
    for c in caches:
        c.cache_clear()
    monkeypatch.setenv("PATH", str(tmp_path))
    yield
    monkeypatch.undo()
    for c in caches:
        c.cache_clear()


def test_without_bubblewrap_the_code_tool_refuses_to_start_unless_weak_is_chosen(no_bwrap_on_path, tmp_path):
    """Config validation with no bwrap on PATH: one problem naming the key that opts in; with the key,
    the tool starts, runs code under the in-process guard, and has a warning for every step's log."""
    key = "actor_rollout_ref.rollout.multi_turn.tool_config_path"
    (problem,) = config_problems(f"{key}=code_interpreter", preset="tools")
    assert problem.startswith(f"{key}: ") and "code_interpreter.yaml: tools[0]" in problem
    assert "bubblewrap (bwrap) is not installed" in problem and "allow_weak_sandbox: true" in problem
    weak_cfg = tmp_path / "weak.yaml"
    weak_cfg.write_text("tools:\n  - class_name: code_interpreter\n    config: {allow_weak_sandbox: true}\n")
    assert config_problems(f"{key}={weak_cfg}", preset="tools") == []
    (tool,) = load_tool_config(weak_cfg)
    mt = MultiTurnRollout(ScriptedEngine(lambda ctx: ""), TOK, [tool])
    (warning,) = mt.step_warnings()
    assert warning.startswith("warning: code_interpreter runs model-written code WITHOUT an OS sandbox")
    assert "allow_weak_sandbox: true" in warning
    r = tool.execute(tool.create(), {"code": "import os\nprint(6*7)\nos.fork()"})
    assert r.text.startswith("42\nTraceback") and "not allowed to fork" in r.text
    assert r.metrics["status"] == "refused"


@needs_bwrap
def test_with_bubblewrap_the_code_tool_has_no_step_warning():
    tool = CodeInterpreterTool(config={"allow_weak_sandbox": True})
    assert tool.step_warning() is None and not tool.weak


def test_escapes_in_a_rollout_are_counted_and_the_step_goes_on():
    """A batch where every sample tries something forbidden still completes and counts each."""

    attempts = [
        ESCAPES[k][0] for k in ("infinite loop", "unbounded allocation", "fork", "write outside", "socket")
    ]
    attempts.append("print(6*7)")

    def policy(ctx: str) -> str:
        if "<|tool|>" in ctx:
            return "Answer: done"
        i = int(ctx.split("<|user|>")[1].split("<|end|>")[0].split("#")[1])
        return format_hermes_call("code_interpreter", {"code": attempts[i]})

    batch = rows(len(attempts))
    for i, r in enumerate(batch):
        r["raw_prompt"] = [{"role": "user", "content": f"task #{i}"}]
    tool = CodeInterpreterTool(
        config={"cpu_seconds": 1, "memory_mb": 256, "wall_seconds": 60, "allow_weak_sandbox": True}
    )
    mt = MultiTurnRollout(ScriptedEngine(policy), TOK, [tool])
    out, info = mt.generate(batch, SamplingParams(n=1, response_length=1000), prompt_width=64)
    m = mt.last_metrics
    # the infinite loop ends on whichever limit the kernel and the clock reach first
    assert m["tools/sandbox_cpu_limit"] + m["tools/sandbox_timeout"] == 1
    assert m["tools/sandbox_memory_limit"] == 1
    assert m["tools/sandbox_refused"] == 3
    assert info["tool_errors"] == [1, 1, 1, 1, 1, 0]
    assert info["messages"][5][1]["content"] == "42"
    assert all(msgs[-1]["content"] == "Answer: done" for msgs in info["messages"])
    assert not os.path.exists(ESCAPE_FILE)


def test_weak_mode_warning_is_repeated_in_the_train_log_every_step(
    no_bwrap_on_path, tmp_path, tiny_random_model_dir, capsys
):
    from dapo.cli import main

    weak_cfg = tmp_path / "weak.yaml"
    weak_cfg.write_text("tools:\n  - class_name: code_interpreter\n    config: {allow_weak_sandbox: true}\n")
    run_dir = tmp_path / "run"
    rc = main(
        tool_run_args(
            run_dir,
            tiny_random_model_dir,
            2,
            f"actor_rollout_ref.rollout.multi_turn.tool_config_path={weak_cfg}",
            "trainer.logger=[console]",
            "trainer.test_freq=0",
            "trainer.save_freq=0",
            "data.max_response_length=32",
            "reward_model.overlong_buffer.len=8",
        )
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert out.count("WITHOUT an OS sandbox (allow_weak_sandbox: true") == 2, out


HEADERS = {
    "x86_64": "/usr/include/x86_64-linux-gnu/asm/unistd_64.h",
    "aarch64": "/usr/include/asm-generic/unistd.h",  # AArch64 uses the generic table
}


@pytest.mark.parametrize("arch", list(HEADERS))
def test_seccomp_syscall_numbers_match_the_kernel_headers(arch):
    import re

    from dapo.tools import _seccomp

    header = Path(HEADERS[arch])
    if not header.exists():
        pytest.skip(f"{header} not installed (linux-libc-dev)")
    defined = {
        m[0]: int(m[1]) for m in re.findall(r"#define __NR(?:3264)?_(\w+)\s+(\d+)\b", header.read_text())
    }
    ours = {**_seccomp._UNIFIED, **_seccomp._TABLES[arch][1]}
    assert {k: defined.get(k) for k in ours} == ours


# A refusal's traceback holds the audit hook's frames: swap the code of every function they show
# (the hook's helpers once sat there in its closure), rewrite their cells, clear their globals
# (the runner's), patch builtins and os, then try what the hook exists to refuse.
HOOK_ATTACK = """\
import builtins, os, sys
Refusal, Base, leave, out = PermissionError, BaseException, os._exit, sys.stdout
def refusal():
    try:
        os.fork()
    except PermissionError as e:
        return e
tb = refusal().__traceback__
frames = []
while tb is not None:
    frames.append(tb.tb_frame)
    tb = tb.tb_next
def make_noop():
    refused = None
    def refuse(what):
        return refused
    return refuse
noop = make_noop()
names, swaps = set(), 0
for frame in frames[1:]:
    names.update(frame.f_locals)
    for value in list(frame.f_locals.values()) + list(frame.f_globals.values()):
        if callable(value) and hasattr(value, '__code__'):
            try:
                value.__code__ = noop.__code__
                swaps += 1
            except (Refusal, ValueError):
                pass
        for cell in getattr(value, '__closure__', None) or ():
            cell.cell_contents = None
    for name in list(frame.f_globals):
        frame.f_globals[name] = None
    frame.f_locals.clear()
print('hook frames:', len(frames) - 1, 'functions among their locals:', sorted(
    k for f in frames[1:] for k, v in f.f_locals.items() if hasattr(v, '__code__')))
print('code swaps that worked:', swaps)
for name in ('isinstance', 'str', 'len', 'PermissionError', 'OSError'):
    setattr(builtins, name, lambda *a, **k: 'x')
os.write = lambda *a: 0
for what, act in [('fork', lambda: os.fork()), ('import ctypes', lambda: __import__('ctypes')),
                  ('import _testcapi', lambda: __import__('_testcapi')),
                  ('write /usr', lambda: open('/usr/dapo-hook-test', 'w'))]:
    try:
        act()
        print(what, 'ALLOWED')
    except Refusal as e:
        print(what, 'refused:', e)
    except Base as e:
        print(what, 'failed:', type(e).__name__)
out.flush()
leave(0)  # the runner's globals are gone: it cannot report its end, only what was refused
"""


@pytest.mark.parametrize("weak", MODES)
def test_the_audit_hook_stays_on_after_its_frames_are_taken_apart(weak):
    res = run_python(HOOK_ATTACK, SandboxLimits(cpu_seconds=10, memory_mb=256, wall_seconds=60.0), weak=weak)
    lines = res.stdout.splitlines()
    # the hook is one frame, and no function of its own is among its locals to be rewritten
    assert lines[0].startswith(
        "hook frames: 1 functions among their locals: ['_fsdecode', '_isdir', '_realpath']"
    )
    assert lines[1] == "code swaps that worked: 0", res.stdout
    assert lines[2:5] == [
        "fork refused: sandbox: not allowed to fork",
        "import ctypes refused: sandbox: not allowed to import ctypes",
        "import _testcapi refused: sandbox: not allowed to import _testcapi",
    ], res.stdout
    # the path check calls library code the patched builtins break: it fails closed
    assert lines[5].startswith("write /usr ") and "ALLOWED" not in lines[5], res.stdout
    assert not os.path.exists("/usr/dapo-hook-test")
    # each refusal reached the parent as it happened, though the runner never reported its end
    swaps = ["replace a function's __code__"] * res.refused.count("replace a function's __code__")
    assert len(swaps) >= 3 and res.refused == ["fork", *swaps, "fork", "import ctypes", "import _testcapi"]
    assert res.status == "refused" and res.status_problem is None


EQ_ATTACK = """\
import sys
try:
    import ctypes
except PermissionError as e:
    tb = e.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    loc = tb.tb_frame.f_locals
class Grab:
    got = []
    def __eq__(self, other):
        Grab.got.append(other)
        return False
for name, value in loc.items():
    try:
        value == Grab()
    except Exception:
        pass
cleared = 0
for other in Grab.got:
    for method in ("clear", "pop", "popitem"):
        try:
            getattr(other, method)()
            cleared += 1
        except Exception:
            pass
print("cleared:", cleared)
def f(*, a=1):
    return a
try:
    f.__kwdefaults__ = {"a": 2}
    print("kwdefaults set")
except PermissionError as e:
    print("kwdefaults:", e)
try:
    import gc
    gc.get_objects()
    print("heap walked")
except PermissionError as e:
    print("heap:", e)
try:
    import ctypes
    print("ctypes imported")
except PermissionError as e:
    print("ctypes:", e)
"""


@pytest.mark.parametrize("weak", MODES)
def test_the_audit_hook_hands_out_nothing_it_reads_through_a_comparison(weak):
    # a frame's locals compared with an object whose __eq__ keeps its argument: a mapping proxy
    # would pass its dict on, which cleared would switch off every refusal by event
    res = run_python(EQ_ATTACK, SandboxLimits(cpu_seconds=10, memory_mb=256, wall_seconds=60.0), weak=weak)
    assert res.stdout.splitlines() == [
        "cleared: 0",
        "kwdefaults: sandbox: not allowed to replace a function's __kwdefaults__",
        "heap: sandbox: not allowed to walk the heap",
        "ctypes: sandbox: not allowed to import ctypes",
    ], res.stdout + res.stderr
    assert res.refused == [
        "import ctypes",
        "replace a function's __kwdefaults__",
        "walk the heap",
        "import ctypes",
    ]


@pytest.mark.parametrize("weak", MODES)
def test_a_path_whose_str_subclass_answers_every_comparison_is_still_checked(weak, tmp_path):
    target = tmp_path / "outside.txt"
    code = (
        "class S(str):\n"
        "    __eq__ = lambda self, other: True\n"
        "    __hash__ = str.__hash__\n"
        "    def startswith(self, *a):\n"
        "        return True\n"
        "try:\n"
        f"    open(S({str(target)!r}), 'w').write('x')\n"
        "    print('written')\n"
        "except PermissionError as e:\n"
        "    print(e)\n"
    )
    res = run_python(code, SandboxLimits(cpu_seconds=10, memory_mb=256, wall_seconds=60.0), weak=weak)
    assert res.stdout.strip() == f"sandbox: not allowed to write outside its directory ({target})", res.stdout
    assert not target.exists()


def test_the_audit_hook_reads_no_global_builtin_or_closure_name():
    """What a frame of the hook exposes is that call's copy of its defaults; nothing it looks up
    by name can be patched from outside it (``builtins``, the runner's globals, closure cells)."""
    import dis

    from dapo.tools._sandbox_runner import make_guard

    guard = make_guard("/box", 99)
    ops = {i.opname for i in dis.get_instructions(guard)}
    assert guard.__closure__ is None and guard.__code__.co_freevars == ()
    assert not ops & {"LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF", "LOAD_CLOSURE", "LOAD_CLASSDEREF"}, ops
    for slot in ("__code__", "__defaults__", "__kwdefaults__"):
        with pytest.raises(PermissionError, match=f"not allowed to replace a function's {slot}"):
            guard("object.__setattr__", (len, slot, None))
    # every default is immutable: a frame's locals are the very objects the next call uses
    mutable = [
        k for k, v in guard.__kwdefaults__.items() if isinstance(v, (dict, list, set, types.MappingProxyType))
    ]
    assert mutable == []


def _runner_line(text: str) -> bytes:
    return b"refused " + text.encode("unicode_escape") + b"\n"  # as the runner writes it


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_any_status_bytes_parse_without_raising(raw):
    refused, exception, problem = sandbox.parse_status(raw)
    if problem is not None:
        assert refused == [] and exception is None
    else:
        assert all(isinstance(r, str) for r in refused) and (exception is None or exception.isidentifier())


def test_an_invalid_escape_in_the_status_parses_with_warnings_as_errors():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # python -W error: the decoder's warning would raise
        assert sandbox.parse_status(b"refused \\q\nend -\n") == (["\\q"], None, None)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.text(min_size=1, max_size=40), max_size=8),
    st.sampled_from([None, "MemoryError", "ValueError"]),
)
def test_the_runners_status_lines_round_trip(texts, exception):
    raw = b"".join(map(_runner_line, texts)) + b"end " + (exception or "-").encode() + b"\n"
    assert sandbox.parse_status(raw) == (texts, exception, None)


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (b"[" * 60000, "a cut-off last line"),
        (b'{"refused": 1}\n', "line 1 is not a status line"),
        (b"end -\nend MemoryError\n", "line 2 is not a status line"),  # a second end: someone forged one
        (b"refused fork\nend Memory Error\n", "line 2 is not a status line"),
        (b"refused \\x\n", "line 1 is not a status line"),  # a bad escape
        (b"refused caf\xc3\xa9\n", "line 1 is not a status line"),  # not ASCII
        (b"refused fork\n" * 6000, "longer than 65536 bytes"),
    ],
)
def test_a_malformed_status_is_set_aside_and_named(raw, problem):
    refused, exception, said = sandbox.parse_status(raw)
    assert (refused, exception) == ([], None) and said.startswith(problem), said


# --- the seccomp filter, run by a classic-BPF interpreter over seccomp_data as the kernel builds it
def _run_filter(prog: bytes, arch: int, nr: int, args: tuple[int, ...] = ()) -> int:
    import struct

    data = struct.pack("=iIQ6Q", nr, arch, 0, *(list(args) + [0] * 6)[:6])
    insns = [struct.unpack_from("=HBBI", prog, i) for i in range(0, len(prog), 8)]
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == 0x20:  # BPF_LD | BPF_W | BPF_ABS
            acc = struct.unpack_from("=I", data, k)[0]
            pc += 1
        elif code == 0x06:  # BPF_RET | BPF_K
            return k
        else:
            taken = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]  # JEQ, JGE, JSET
            pc += 1 + (jt if taken else jf)


ALLOW, ERRNO = 0x7FFF0000, 0x00050000


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_seccomp_refuses_clearing_the_parent_death_signal_and_foreign_socket_families(arch):
    import errno

    from dapo.tools import _seccomp

    audit_arch, table = _seccomp._TABLES[arch]
    prog = _seccomp.filter_program(arch)

    def verdict(name: str, *args: int) -> int:
        return _run_filter(prog, audit_arch, table[name], args)

    assert verdict("prctl", 1, 0) == ERRNO | errno.EPERM  # PR_SET_PDEATHSIG, to anything
    assert verdict("prctl", 1, 9) == ERRNO | errno.EPERM
    assert verdict("prctl", 0x1_00000001, 0) == ERRNO | errno.EPERM  # the kernel reads an int
    for option in (2, 15, 16, 38):  # PR_GET_PDEATHSIG, PR_SET_NAME, PR_GET_NAME, PR_SET_NO_NEW_PRIVS
        assert verdict("prctl", option, 0) == ALLOW
    for call in ("socket", "socketpair"):
        for family in (1, 2, 10):  # AF_UNIX, AF_INET, AF_INET6
            assert verdict(call, family, 1, 0) == ALLOW
        for family in (0, 3, 16, 17, 31, 38, 40, 44, 255, 0x1_00000028):  # ..., AF_VSOCK as an int
            assert verdict(call, family, 1, 0) == ERRNO | errno.EAFNOSUPPORT
    assert verdict("clone", 0x00010000) == ALLOW and verdict("clone", 17) == ERRNO | errno.EAGAIN
    assert _run_filter(prog, audit_arch, 0) == ALLOW  # read / io_setup: everything else runs
    assert _run_filter(prog, audit_arch ^ 1, 0) == 0x80000000  # another architecture: killed
