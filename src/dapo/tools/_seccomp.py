"""A seccomp filter (classic BPF, built here without libseccomp) for the code sandbox.

bubblewrap installs it on the sandboxed interpreter before ``exec``. It refuses:

* new processes: ``fork``/``vfork``, ``clone`` without ``CLONE_THREAD`` (``EAGAIN``, as a process
  limit would) and ``clone3`` (``ENOSYS``, so the C library falls back to ``clone`` for threads).
  ``RLIMIT_NPROC`` does not hold when the trainer runs as root (the sandbox user maps to root
  outside), so this is the process-count limit: one process, any number of threads within
  ``RLIMIT_AS``;
* tracing and other processes' memory (``ptrace``, ``process_vm_*``, ``pidfd_getfd``);
* mounts, namespaces, ``chroot``, keyrings, ``bpf``, ``perf_event_open``, ``userfaultfd``,
  ``io_uring``, kernel modules, ``kexec`` and the like: kernel surface the code has no use for;
* ``prctl(PR_SET_PDEATHSIG)`` (``EPERM``): bubblewrap sets the parent-death signal (SIGKILL)
  just before it installs this filter, and that signal is what kills the sandbox when the
  trainer dies without a chance to kill it (SIGKILL, the out-of-memory killer). A program that
  cleared it would outlive the trainer as an orphan;
* sockets of any family but ``AF_UNIX``, ``AF_INET`` and ``AF_INET6`` (``EAFNOSUPPORT``, as on a
  kernel without that family). The network namespace isolates only those; ``AF_VSOCK`` reaches
  the hypervisor of a VM, ``AF_NETLINK``, ``AF_PACKET``, ``AF_BLUETOOTH``, ``AF_ALG`` and the
  rest are kernel surface or devices the code has no use for.

Anything else is allowed. An architecture other than x86-64 or AArch64 gets no filter, and the
sandbox reports that it cannot start (``filter_program`` returns None).
"""

from __future__ import annotations

import errno
import platform
import struct

# seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6]; _ARG0 is args[0]'s low
# 32 bits on these (little-endian) machines
_NR, _ARCH, _ARG0 = 0, 4, 16
_LD_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW, _ERRNO, _KILL = 0x7FFF0000, 0x00050000, 0x80000000
_CLONE_THREAD = 0x00010000
_PR_SET_PDEATHSIG = 1
# socket families the sandbox may create: AF_UNIX, AF_INET, AF_INET6
ALLOWED_FAMILIES = (1, 2, 10)
_X32_BIT = 0x40000000

_DENIED = (
    "ptrace process_vm_readv process_vm_writev pidfd_getfd mount umount2 pivot_root chroot unshare "
    "setns open_tree move_mount fsopen fsconfig fsmount fspick mount_setattr keyctl add_key request_key "
    "bpf perf_event_open userfaultfd io_uring_setup io_uring_enter io_uring_register kexec_load "
    "kexec_file_load init_module finit_module delete_module open_by_handle_at name_to_handle_at "
    "acct swapon swapoff reboot quotactl syslog personality"
).split()

# numbers from the table every architecture shares since Linux 5.1
_UNIFIED = {
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "clone3": 435,
    "pidfd_getfd": 438,
    "mount_setattr": 442,
}
# audit arch, syscall numbers
_TABLES: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (
        0xC000003E,
        {
            "fork": 57,
            "vfork": 58,
            "clone": 56,
            "prctl": 157,
            "socket": 41,
            "socketpair": 53,
            "ptrace": 101,
            "process_vm_readv": 310,
            "process_vm_writev": 311,
            "mount": 165,
            "umount2": 166,
            "pivot_root": 155,
            "chroot": 161,
            "unshare": 272,
            "setns": 308,
            "keyctl": 250,
            "add_key": 248,
            "request_key": 249,
            "bpf": 321,
            "perf_event_open": 298,
            "userfaultfd": 323,
            "kexec_load": 246,
            "kexec_file_load": 320,
            "init_module": 175,
            "finit_module": 313,
            "delete_module": 176,
            "open_by_handle_at": 304,
            "name_to_handle_at": 303,
            "acct": 163,
            "swapon": 167,
            "swapoff": 168,
            "reboot": 169,
            "quotactl": 179,
            "syslog": 103,
            "personality": 135,
        },
    ),
    "aarch64": (
        0xC00000B7,
        {
            "clone": 220,
            "prctl": 167,
            "socket": 198,
            "socketpair": 199,
            "ptrace": 117,
            "process_vm_readv": 270,
            "process_vm_writev": 271,
            "mount": 40,
            "umount2": 39,
            "pivot_root": 41,
            "chroot": 51,
            "unshare": 97,
            "setns": 268,
            "keyctl": 219,
            "add_key": 217,
            "request_key": 218,
            "bpf": 280,
            "perf_event_open": 241,
            "userfaultfd": 282,
            "kexec_load": 104,
            "kexec_file_load": 294,
            "init_module": 105,
            "finit_module": 273,
            "delete_module": 106,
            "open_by_handle_at": 265,
            "name_to_handle_at": 264,
            "acct": 89,
            "swapon": 224,
            "swapoff": 225,
            "reboot": 142,
            "quotactl": 60,
            "syslog": 116,
            "personality": 92,
        },
    ),
}
_ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}


def filter_program(machine: str | None = None) -> bytes | None:
    """The filter as ``struct sock_filter[]`` bytes for ``bwrap --seccomp``; None on other machines."""
    machine = (machine or platform.machine()).lower()
    table = _TABLES.get(_ALIASES.get(machine, machine))
    if table is None:
        return None
    arch, nr = table[0], {**_UNIFIED, **table[1]}
    # instructions as (code, jt, jf, k) where jt/jf are labels resolved below
    prog: list[tuple[int, object, object, int]] = [
        (_LD_ABS, 0, 0, _ARCH),
        (_JEQ, 0, "kill", arch),
        (_LD_ABS, 0, 0, _NR),
    ]
    if arch == _TABLES["x86_64"][0]:
        prog.append((_JGE, "eperm", 0, _X32_BIT))  # the x32 ABI's numbers would bypass the table
    for name in ("fork", "vfork"):
        if name in nr:
            prog.append((_JEQ, "eagain", 0, nr[name]))
    prog.append((_JEQ, "clone", 0, nr["clone"]))
    prog.append((_JEQ, "enosys", 0, nr["clone3"]))
    prog.append((_JEQ, "prctl", 0, nr["prctl"]))
    prog.append((_JEQ, "socket", 0, nr["socket"]))
    prog.append((_JEQ, "socket", 0, nr["socketpair"]))
    for name in _DENIED:
        prog.append((_JEQ, "eperm", 0, nr[name]))
    labels: dict[str, int] = {}

    def label(name: str, *insns: tuple[int, object, object, int]) -> None:
        labels[name] = len(prog)
        prog.extend(insns)

    prog.append((_RET, 0, 0, _ALLOW))
    label("clone", (_LD_ABS, 0, 0, _ARG0), (_JSET, "allow", 0, _CLONE_THREAD))
    label("eagain", (_RET, 0, 0, _ERRNO | errno.EAGAIN))
    # the kernel reads prctl's option and socket's family as an int: the low 32 bits of the argument
    label("prctl", (_LD_ABS, 0, 0, _ARG0), (_JEQ, "eperm", "allow", _PR_SET_PDEATHSIG))
    label("socket", (_LD_ABS, 0, 0, _ARG0))
    prog.extend((_JEQ, "allow", 0, fam) for fam in ALLOWED_FAMILIES)
    prog.append((_RET, 0, 0, _ERRNO | errno.EAFNOSUPPORT))
    label("allow", (_RET, 0, 0, _ALLOW))
    label("eperm", (_RET, 0, 0, _ERRNO | errno.EPERM))
    label("enosys", (_RET, 0, 0, _ERRNO | errno.ENOSYS))
    label("kill", (_RET, 0, 0, _KILL))
    out = bytearray()
    for i, (code, jt, jf, k) in enumerate(prog):
        offs = [labels[j] - i - 1 if isinstance(j, str) else j for j in (jt, jf)]
        assert all(0 <= o < 256 for o in offs)
        out += struct.pack("=HBBI", code, offs[0], offs[1], k)
    return bytes(out)
