"""What the operating system lets ``shm`` do: read another rank's memory, and see it die.

``single copy`` reads the other ranks' buffers where they are with Linux's cross-memory attach,
``process_vm_readv(2)``: the kernel copies from the other process's pages, as MPICH's and Open
MPI's single-copy transports do for large messages. The kernel allows it when the reader may
``ptrace`` the target: same user, and with Yama's ``ptrace_scope`` of 1 (Ubuntu's default) only
an ancestor -- so sibling ranks may not. ``allow_reads_by_any`` widens that for this process
with ``prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY)``, as Open MPI's CMA component does
(``opal/mca/smsc/cma``); it is called only when single copy is wanted
(``policy.single_copy_expected``: ``MPICOLL_SHM_SINGLE_COPY=off`` never calls it), once per
process, and only with a Yama scope other than 0. docs/reliability.md says what that means.
A seccomp profile may still refuse the call: ``readable`` is the probe that finds out.

``alive(pid)`` tells a wait in shared memory that the rank it waits for has died (no message
would ever say so).
"""

from __future__ import annotations

import ctypes
import os

import numpy as np

__all__ = ["LIBC", "READV", "HAVE_READV", "allow_reads_by_any", "widened", "read_word",
           "alive"]

LIBC = ctypes.CDLL(None)
READV = getattr(LIBC, "process_vm_readv", None)        # Linux (glibc >= 2.15, musl)
HAVE_READV = READV is not None

_PR_SET_PTRACER, _PR_SET_PTRACER_ANY = 0x59616D61, ctypes.c_ulong(-1)
_asked = False
widened = False             # whether this process called prctl(PR_SET_PTRACER_ANY)


def allow_reads_by_any() -> None:
    """Let any process of this user read this one's memory (Yama scope 1: only ancestors may):
    ``prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY)``, once; nothing without Yama or at scope 0,
    where the same-user rule already allows it (scopes 2 and 3 are not widened by it)."""
    global _asked, widened
    if _asked:
        return
    _asked = True
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            scope = f.read().strip()
    except OSError:
        return                      # no Yama: the usual same-user rule applies
    if scope != "0":
        widened = LIBC.prctl(_PR_SET_PTRACER, _PR_SET_PTRACER_ANY, 0, 0, 0) == 0


def read_word(pid: int, address: int) -> int | None:
    """The int64 at ``address`` in process ``pid`` (``process_vm_readv``), None if refused."""
    got = np.zeros(1, np.int64)
    iov = np.array([got.ctypes.data, 8, address, 8], np.int64)      # two struct iovec
    moved = READV(int(pid), ctypes.c_void_p(iov.ctypes.data), 1,
                  ctypes.c_void_p(iov.ctypes.data + 16), 1, 0)
    return int(got[0]) if moved == 8 else None


def alive(pid: int, started: int = -1) -> bool:
    """Whether process ``pid`` (a rank on this node) still runs: it exists and is not a zombie
    (a dead rank its launcher has not reaped yet) -- and, with ``started`` (its start time,
    ``/proc/PID/stat`` field 22, as the failure detector keeps it), is still that process, not
    another under a recycled pid. Cheap enough for every 1 ms nap of a wait, and allocates next
    to nothing (no buffered file, no list: a persistent call must not, and allocation tests
    trace the detector's thread too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    except OSError:                     # gone meanwhile, or no /proc: kill() had the word
        return not os.path.isdir("/proc")
    try:
        # "pid (comm) S ...": comm is at most 16 bytes; field 22 comes later
        head = os.read(fd, 128 if started < 0 else 1024)
    finally:
        os.close(fd)
    i = head.rfind(b")") + 2
    if head[i:i + 1] in (b"Z", b"X", b""):
        return False
    if started < 0:
        return True
    for _ in range(19):                 # from field 3 (the state) to field 22
        i = head.find(b" ", i) + 1
    end = head.find(b" ", i)
    return i <= 0 or end < 0 or int(head[i:end]) == started
