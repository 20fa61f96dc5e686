"""Runs a vLLM server as its child and takes its whole process group down with the trainer.

Started by :class:`dapo.rollout.vllm_server.VllmServerRollout` as
``python vllm_server_guard.py TRAINER_PID COMMAND...`` in a session of its own (run by path, so
it imports nothing of dapo, torch or vLLM). It asks the kernel for SIGTERM when its parent (the
trainer) dies, for any reason including SIGKILL; on SIGTERM or SIGINT, or when the server
exits, it SIGKILLs its process group:
the server and every process vLLM started (engine core, workers), which a parent-death signal
on the server alone would leave behind.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1


def _kill_group(*_: object) -> None:
    os.killpg(0, signal.SIGKILL)


def main(argv: list[str]) -> int:
    trainer_pid, command = int(argv[0]), argv[1:]
    signal.signal(signal.SIGTERM, _kill_group)
    signal.signal(signal.SIGINT, _kill_group)
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != trainer_pid:  # the trainer died before the signal was armed
        _kill_group()
    server = subprocess.Popen(command)
    server.wait()
    _kill_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
