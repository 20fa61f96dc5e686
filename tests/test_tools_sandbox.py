"""The code interpreter's sandbox: each escape attempt fails, is counted, and the step goes on."""

from __future__ import annotations

import os

import pytest
import torch

from dapo.rollout.hf import SamplingParams
from dapo.rollout.multiturn import MultiTurnRollout
from dapo.tools import CodeInterpreterTool
from dapo.tools.parser import format_hermes_call
from dapo.tools.sandbox import SandboxLimits, network_namespace_available, run_python

torch.set_num_threads(1)
FAST = SandboxLimits(cpu_seconds=1, memory_mb=256, wall_seconds=3.0, max_output_chars=200)

ESCAPES = {
    "infinite loop": ("while True:\n    pass", "cpu_limit"),
    "sleep past the wall clock": ("import time\ntime.sleep(60)", "timeout"),
    "unbounded allocation": ("x = []\nwhile True:\n    x.append(bytearray(10**7))", "memory_limit"),
    "fork": ("import os\nos.fork()", "refused"),
    "subprocess": ("import subprocess\nsubprocess.run(['true'])", "refused"),
    "os.system": ("import os\nos.system('true')", "refused"),
    "write outside": ("open('/tmp/dapo-sandbox-escape.txt', 'w').write('x')", "refused"),
    "write via parent dir": ("open('../dapo-sandbox-escape.txt', 'w').write('x')", "refused"),
    "delete outside": ("import os\nos.remove('/etc/hostname')", "refused"),
    "socket": ("import socket\ns = socket.socket()\ns.connect(('127.0.0.1', 9))", "refused"),
    "ctypes": ("import ctypes", "refused"),
    "kill the parent": ("import os\nos.kill(os.getppid(), 9)", "refused"),
}


def _load_multiturn_helpers():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).with_name("test_multiturn_rollout.py")
    spec = importlib.util.spec_from_file_location("_multiturn_helpers", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("name", list(ESCAPES))
def test_escape_attempt_is_stopped_or_refused(name):
    code, want = ESCAPES[name]
    res = run_python(code, FAST)
    assert res.status == want, (res.status, res.stdout, res.stderr)
    assert not os.path.exists("/tmp/dapo-sandbox-escape.txt")
    if want == "refused":
        assert res.refused and "sandbox: not allowed" in res.stderr


def test_ordinary_code_runs_in_an_empty_private_directory():
    res = run_python(
        "import os\nprint(os.listdir('.'))\nopen('a.txt', 'w').write('hi')\nprint(open('a.txt').read())", FAST
    )
    assert res.status == "ok" and res.stdout == "[]\nhi\n"
    res2 = run_python("import os\nprint(os.listdir('.'))", FAST)
    assert res2.stdout == "[]\n"  # nothing left over from the previous run


def test_refusal_can_be_caught_and_the_code_continues():
    res = run_python(
        "import os\ntry:\n    os.fork()\nexcept PermissionError:\n    print('no fork')\nprint(6*7)", FAST
    )
    assert res.status == "refused" and res.refused == ["fork"] and res.stdout == "no fork\n42\n"


def test_output_is_truncated():
    res = run_python("print('x' * 100000)", FAST)
    assert res.status == "ok" and res.stdout.startswith("x" * 200) and "truncated at 200" in res.stdout
    assert len(res.stdout) < 300


def test_traceback_shows_only_the_users_code():
    res = run_python("def f():\n    return 1/0\nf()", FAST)
    assert res.status == "error" and res.exception == "ZeroDivisionError"
    assert "_sandbox_runner" not in res.stderr and 'File "<code>", line 2, in f' in res.stderr


@pytest.mark.skipif(not network_namespace_available(), reason="no user/network namespaces here")
def test_network_namespace_has_no_interfaces_up():
    # even with the audit hook bypassed at the OS level there is no route out: only a down loopback
    res = run_python("print(open('/proc/net/dev').read())", SandboxLimits(wall_seconds=5))
    lines = [ln.split(":")[0].strip() for ln in res.stdout.splitlines()[2:] if ":" in ln]
    assert lines == ["lo"]


def test_escapes_in_a_rollout_are_counted_and_the_step_goes_on():
    """A batch where every sample tries something forbidden still completes and counts each."""
    helpers = _load_multiturn_helpers()
    TOK, ScriptedEngine, rows = helpers.TOK, helpers.ScriptedEngine, helpers.rows

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
    tool = CodeInterpreterTool(config={"cpu_seconds": 1, "memory_mb": 256, "wall_seconds": 3})
    mt = MultiTurnRollout(ScriptedEngine(policy), TOK, [tool])
    out, info = mt.generate(batch, SamplingParams(n=1, response_length=1000), prompt_width=64)
    m = mt.last_metrics
    assert m["tools/sandbox_cpu_limit"] == 1
    assert m["tools/sandbox_memory_limit"] == 1
    assert m["tools/sandbox_refused"] == 3
    assert info["tool_errors"] == [1, 1, 1, 1, 1, 0]
    assert info["messages"][5][1]["content"] == "42"
    assert all(msgs[-1]["content"] == "Answer: done" for msgs in info["messages"])
    assert not os.path.exists("/tmp/dapo-sandbox-escape.txt")
