"""The shared window: one segment of memory that the ranks of a node map, its flags and data.

Layout: FLAGS lines of LINE int64s per rank (``kernels``), then 2 x p segments of ``capacity``
bytes (``data[buffer, rank]``, double-buffered by the parity of the sequence number). The
capacity is the size class of the vector (``size_class``: a power of two from MIN_BYTES to
CHUNK_BYTES); a longer vector goes through in chunks, and a call that needs a larger class
makes a new window (at the same call on every rank) and drops the old one. Memory: 2 x p x
capacity bytes, at most 2 x p x 4 MiB, in the node's tmpfs (``/dev/shm``), as MPICH's and
Open MPI's own shared-memory segments are.

Making one takes no MPI collective, so nothing here can block outside the call's deadline,
and freeing one is local (``free``: unmap), so it can't hang either -- not even after a failed
call, when another rank may never come to free its part (issue #22):

    Step 1  window rank 0 creates a file in /dev/shm (``O_EXCL``, mode 0600, its size
            reserved with ``posix_fallocate``, so a full tmpfs is an error here, not a SIGBUS
            later) and sends its name to the others: one small message each on the call's own
            tag (``Isend``/``Irecv``, polled under the deadline). A rank in another call (the
            tag carries the call's number and the hash of its arguments) never matches it;
    Step 2  each rank maps it, writes its pid and the address of a probe word into its line
            and publishes ``arrived = 1``; once every rank has, rank 0 unlinks the file (the
            memory lives on while mapped; nothing is left behind if a rank dies later);
    Step 3  the probe: each rank that wants single copy reads every other rank's probe word
            with ``process_vm_readv`` (``probe.read_word``), publishes its answer and
            ``reduced = 1``; single copy is on when every rank's answer is yes -- the node
            agrees, so every rank takes the same path. The call that made the window then
            starts at sequence number 2.

Each wait is ``kernels.missing`` on a flag, with the caller's ``overdue(window, which, seq, rank)``
run each time it outlasts a spin: the deadline, the roll call, a rank that died.
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import mmap
import os
import tempfile
import time

import numpy as np
from mpi4py import MPI

from .. import idle
from . import probe
from .kernels import (ABORTED, ANSWER, ARRIVED, BLOCK, FLAGS, LINE, PID, PROBE, REDUCED, missing,
                      publish)
from .probe import LIBC

__all__ = ["Window", "size_class", "make", "CHUNK_BYTES", "MIN_BYTES", "YIELD_AFTER",
           "SPIN_SECONDS", "CROWDED_SPIN_SECONDS", "Patience"]

CHUNK_BYTES = 4 << 20       # the largest segment: longer vectors go through in chunks
MIN_BYTES = 4 << 10         # the smallest size class
SPIN_SECONDS = 0.002        # a wait spins this long, then returns to Python (Watch, Ctrl-C)
NAP_SECONDS = 0.001         # a wait that outlasted its spin (a late rank) sleeps this long,
NAP_SHARE = 0.125           # ... or this share of how long it has been late,
NAP_MAX_SECONDS = 0.016     # ... up to this, unless a rank rings its bell (``Window.ring``)
NAP_SPIN_SECONDS = 20e-6    # between looks of this long (``Patience``)
BELL = REDUCED * LINE + 8   # in each rank's flags: its bell (a futex word), rung by the others
NAPPING = BELL + 1          # ... nonzero while it naps on the bell
YIELD_AFTER = 20e-6         # a wait spins this long, then yields the core between polls
CROWDED_SPIN_SECONDS = 20e-6    # a crowded process (``idle.crowded``: more ranks on the node
CROWDED_NAP_SECONDS = 50e-6     # than cores) yields at once, spins only this long and then
                                # naps from this long on (the rank it waits for needs the core)
NAME_BYTES = 512            # step 1's message: the file's path, or "!" and why it failed
_MAGIC = 0x6D7069636F6C6C00     # the probe word of rank j: _MAGIC + j
_made = itertools.count()


def size_class(nbytes: int) -> int:
    """Segment bytes for a vector of ``nbytes``: a power of two, MIN_BYTES to CHUNK_BYTES."""
    return min(CHUNK_BYTES, max(MIN_BYTES, 1 << max(0, nbytes - 1).bit_length()))


def _directory() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def footprint(size: int, capacity: int) -> int:
    """Bytes of a window of ``size`` ranks with segments of ``capacity`` bytes: the flags, then
    two segments per rank (the layout above)."""
    return FLAGS * size * LINE * 8 + 2 * size * capacity


def room() -> int:
    """The size in bytes of the file system the windows live in (its total, not what is free
    now: the same on every rank of a node, whenever each asks); 0 if it can't be read."""
    try:
        st = os.statvfs(_directory())
    except OSError:
        return 0
    return st.f_blocks * st.f_frsize


class Window:
    """One node's shared window as this rank maps it: ``flags`` (int64, FLAGS x LINE per rank),
    ``data`` (the segments' bytes), ``seq`` (the last sequence number used), ``single_copy``
    (the node's probe said yes). ``members``: the window's ranks in the communicator, in
    window order; ``size``: how many; ``rank``: this rank's index among them."""

    def __init__(self, region: mmap.mmap, members: tuple, rank: int, capacity: int):
        size = len(members)
        self.members, self.size, self.rank, self.capacity = members, size, rank, capacity
        self.seq, self.single_copy, self._views, self._scratch, self._pieces = \
            0, False, {}, {}, {}
        self._region = region
        memory = np.frombuffer(region, np.uint8)
        header = FLAGS * size * LINE * 8
        self.flags = memory[:header].view(np.int64)
        self.data = memory[header:header + 2 * size * capacity]
        self.crowded = idle.crowded()   # the rank waited for may need this core (``Patience``)
        self.yield_after = 0.0 if self.crowded else YIELD_AFTER
        self.iov = np.zeros(4, np.int64)
        self._words = memoryview(self.flags)    # (faster than numpy for a word or two)
        self._address = self.flags.ctypes.data

    def pid(self, j: int) -> int:
        """Window rank ``j``'s process id."""
        return int(self.flags[FLAGS * j * LINE + PID])

    def wait(self, which: int, seq: int, overdue) -> None:
        """Until every rank's flag ``which`` reaches ``seq``; ``overdue(self, which, seq, j)``
        each time the wait outlasts a spin (j: a rank still short)."""
        patience = Patience(self)
        while True:
            j = missing(self.flags, which, seq, self.rank, self.size,
                        patience.until(0), self.yield_after)
            if j < 0:
                return
            patience.late(0)
            overdue(self, which, seq, j)

    def bell(self) -> int:
        """This rank's bell: a nap (``nap``) that began after it last changed ends at a ring."""
        return self._words[FLAGS * self.rank * LINE + BELL]

    def nap(self, seen: int, seconds: float) -> None:
        """Sleep up to ``seconds``, or until a rank rings (at once if one rang since this rank's
        bell read ``seen``): a futex wait on the bell, which takes no CPU."""
        line = FLAGS * self.rank * LINE
        self._words[line + NAPPING] = 1
        try:
            _futex(self._address + 8 * (line + BELL), _FUTEX_WAIT, seen, seconds)
        finally:
            self._words[line + NAPPING] = 0

    def ring(self) -> None:
        """Wake the ranks napping on this window (a rank came to the call, or finished a phase
        they may wait for): every bell changes, and each napping rank's futex is woken. A rank
        whose nap starts just as this reads its ``napping`` word sleeps to the end of its nap,
        at most ``NAP_MAX_SECONDS``: never longer. Costs ~0.1 us a rank, without a syscall
        when no rank naps."""
        words, napping, stride = self._words, 0, FLAGS * LINE
        for i in range(BELL, self.size * stride, stride):
            words[i] += 1
            napping |= words[i + 1]
        if napping:
            for i in range(BELL, self.size * stride, stride):
                if words[i + 1] and i // stride != self.rank:
                    _futex(self._address + 8 * i, _FUTEX_WAKE, 1 << 30, None)

    def views(self, dtype: np.dtype):
        """``(data, acc)``: the segments as ``data[buffer, rank, element]`` of ``dtype`` (a
        storage dtype: ``kernels.storage``), and BLOCK elements of scratch (made once per
        dtype)."""
        got = self._views.get(dtype)
        if got is None:
            got = self._views[dtype] = (
                self.data.view(dtype).reshape(2, self.size, self.capacity // dtype.itemsize),
                np.empty(BLOCK, dtype))
        return got

    def scratch(self, dtype: np.dtype, count: int, piece_bytes: int) -> tuple:
        """Single copy: ``(scratch, piece)``, room for ``piece`` elements of each other rank --
        as much of ``count`` as ``piece_bytes`` allows (kept per dtype, grown when a longer
        vector needs more; the answer kept per count, for the next call of the same size)."""
        got = self._pieces.get((dtype, count, piece_bytes))
        if got is not None:
            return got
        piece = max(1, min(count, piece_bytes // (self.size - 1) // dtype.itemsize))
        scratch = self._scratch.get(dtype)
        if scratch is None or scratch.size < piece * (self.size - 1):
            scratch = self._scratch[dtype] = np.empty(piece * (self.size - 1), dtype)
            self._pieces.clear()            # (they name the smaller one)
        if len(self._pieces) >= 64:
            self._pieces.clear()
        got = self._pieces[dtype, count, piece_bytes] = scratch, scratch.size // (self.size - 1)
        return got

    def free(self) -> None:
        """Unmap this rank's view of the window: local, never blocks (the memory goes when the
        last rank's mapping does)."""
        if self._words is not None:
            self._words.release()
        self.flags = self.data = self._words = None
        self._views, self._scratch, self._pieces = {}, {}, {}
        try:
            self._region.close()
        except BufferError:             # an array still points into it: unmapped when it goes
            pass


def make(comm: MPI.Intracomm, members: tuple, capacity: int, tag: int, wanted: bool,
         get_watch, overdue) -> Window:
    """Steps 1-3 (module doc) on the ranks ``members`` of ``comm`` (this rank among them):
    the new window. ``wanted``: this rank would read in place (``policy.single_copy_expected``);
    ``get_watch()``: the call's ``Watch`` or None; ``overdue``: as in ``Window.wait`` (with
    window None before this rank has mapped it)."""
    size, me = len(members), members.index(comm.Get_rank())
    total = footprint(size, capacity)
    path = None
    name = np.zeros(NAME_BYTES, np.uint8)
    if me == 0:                     # Step 1: create, reserve, map, tell the others
        path = os.path.join(_directory(), f"mpicoll-{os.getuid()}-{os.getpid()}-{next(_made)}")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                _reserve(fd, total)
                region = mmap.mmap(fd, total)
            finally:
                os.close(fd)
            text = path.encode()
        except OSError as exc:
            region, text = None, f"!{exc}".encode()[:NAME_BYTES]
        name[:len(text)] = np.frombuffer(text, np.uint8)
        _exchange(comm, [comm.Isend(name, peer, tag) for peer in members[1:]], get_watch,
                  members[1:])
        if region is None:
            _unlink(path)
            raise OSError(f"shm: could not make a shared window of {total} bytes in "
                          f"{_directory()}: {text[1:].decode()}")
    else:
        _exchange(comm, [comm.Irecv(name, members[0], tag)], get_watch, members[:1])
        text = name.tobytes().rstrip(b"\0").decode()
        if text.startswith("!"):
            raise OSError(f"shm: rank {members[0]} could not make the shared window: "
                          f"{text[1:]}")
        try:
            fd = os.open(text, os.O_RDWR)
        except FileNotFoundError:       # rank 0 gave up on this call before this rank came
            overdue(None, ARRIVED, 1, 0)
            raise RuntimeError(f"shm: rank {members[0]} gave up on this call before rank "
                               f"{comm.Get_rank()} came (its shared window is gone)") from None
        try:
            region = mmap.mmap(fd, total)
        finally:
            os.close(fd)
    window = Window(region, tuple(members), me, capacity)
    try:
        _attach_and_probe(window, wanted, overdue)
    except BaseException:
        publish(window.flags, FLAGS * me * LINE + ABORTED, 1)   # tell the ranks still waiting
        window.free()
        raise
    finally:
        if path is not None:
            _unlink(path)
    return window


def _attach_and_probe(window: Window, wanted: bool, overdue) -> None:
    """Steps 2 and 3 on a mapped window."""
    flags, me, size = window.flags, window.rank, window.size
    line = FLAGS * me * LINE
    word = np.array([_MAGIC + me], np.int64)       # kept alive until every rank has read it
    if wanted:
        probe.allow_reads_by_any()      # before the others may try to read
    flags[line + PID] = os.getpid()
    flags[line + PROBE] = word.ctypes.data
    publish(flags, line + ARRIVED * LINE, 1)
    window.wait(ARRIVED, 1, overdue)    # (then rank 0 may unlink the file: ``make``)
    ok = wanted and size > 1
    for j in range(size if ok else 0):
        if j != me:
            got = probe.read_word(window.pid(j), int(flags[FLAGS * j * LINE + PROBE]))
            ok = ok and got == _MAGIC + j
    flags[line + ANSWER] = 1 if ok else 0
    publish(flags, line + REDUCED * LINE, 1)
    window.wait(REDUCED, 1, overdue)
    window.single_copy = size > 1 and all(flags[FLAGS * j * LINE + ANSWER] == 1
                                          for j in range(size))
    window.seq = 1
    del word                            # every rank has read it (they published reduced)


def _exchange(comm, requests, get_watch, peers) -> None:
    """Complete Step 1's messages: under the call's deadline when there is one."""
    watch = get_watch()
    if watch is None:
        MPI.Request.Waitall(requests)
    else:
        watch.wait(requests, "making the shared window (its name, from its first rank)",
                   peers=list(peers))


def _reserve(fd: int, total: int) -> None:
    """Give the file ``total`` bytes of memory now (``posix_fallocate``: a full tmpfs raises
    here, ENOSPC), or only its size where the file system can't reserve."""
    try:
        os.posix_fallocate(fd, 0, total)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
        os.ftruncate(fd, total)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class Patience:
    """How long a flag wait spins before it returns to Python: ``SPIN_SECONDS``, then, while
    the rank waited for is late, a nap before each short look (``NAP_SPIN_SECONDS``): 1 ms at
    first, then ``NAP_SHARE`` of the time it has been late, up to ``NAP_MAX_SECONDS``, on this
    rank's bell (``Window.nap``), which a rank coming to the call rings (``Window.ring``). A
    wait for a late rank then takes well under 1 % of a core instead of all of it, from the
    computation beside it (issue 43; docs/training.md, "What waiting costs"), and sees a rank
    that came at once, one already in the call at most 1/8 of its lateness late.

    A crowded process (``idle.crowded``: this node's ranks outnumber its cores; the window's
    ``crowded``) spins only ``CROWDED_SPIN_SECONDS`` before it naps, and its first naps are
    ``CROWDED_NAP_SECONDS``: the rank it waits for is most often descheduled, waiting for this
    core (N = 4 on 2 cores), so a spin of 2 ms took the core from it on almost every call. As
    Open MPI's ``mpi_yield_when_idle``, which it sets itself on an oversubscribed node; a nap
    rather than a yield, as the phases' flags ring no bell, it ends by its timeout."""

    __slots__ = ("_late_at", "_since", "_window", "_seen", "_spin", "_nap")

    def __init__(self, window: Window | None = None):
        self._late_at, self._since, self._window, self._seen = None, 0.0, window, 0
        crowded = idle.crowded() if window is None else window.crowded
        self._spin = CROWDED_SPIN_SECONDS if crowded else SPIN_SECONDS
        self._nap = CROWDED_NAP_SECONDS if crowded else NAP_SECONDS

    def late(self, at) -> None:
        """The wait at ``at`` (where the kernel resumes) outlasted its spin."""
        if at != self._late_at:
            self._late_at, self._since = at, time.monotonic()

    def until(self, at) -> float:
        """The ``MPI_Wtime`` a wait at ``at`` spins to (after a nap, if it is late there)."""
        window = self._window
        if window is not None and window.flags is None:
            window = None
        if at == self._late_at:
            nap = min(NAP_MAX_SECONDS, max(self._nap,
                                           NAP_SHARE * (time.monotonic() - self._since)))
            if window is None:
                time.sleep(nap)
            else:
                window.nap(self._seen, nap)
        if window is not None:          # before the look: a ring after it ends the next nap
            self._seen = window.bell()
        return MPI.Wtime() + (NAP_SPIN_SECONDS if at == self._late_at else self._spin)


_FUTEX_WAIT, _FUTEX_WAKE = 0, 1         # (not FUTEX_PRIVATE: the word is in shared memory)
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98, "ppc64le": 221}.get(os.uname().machine)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _futex(address: int, operation: int, value: int, seconds) -> None:
    """``futex(2)`` on the int32 at ``address`` (the low half of a little-endian int64): wait
    while it equals ``value`` (up to ``seconds``), or wake up to ``value`` waiters. Where there
    is no futex (another CPU or OS), a wait is a sleep and a wake does nothing."""
    if _SYS_FUTEX is None or LIBC is None:
        if operation == _FUTEX_WAIT:
            time.sleep(seconds)
        return
    timeout = None if seconds is None else \
        ctypes.byref(_Timespec(int(seconds), int(seconds % 1 * 1e9)))
    LIBC.syscall(ctypes.c_long(_SYS_FUTEX), ctypes.c_void_p(address), ctypes.c_long(operation),
                 ctypes.c_long(value & 0xFFFFFFFF), timeout, None, ctypes.c_long(0))
