"""``shm``'s compiled core: the flag protocol, the reduction in rank order, the single copy.

Everything here is a numba function compiled ``nogil`` (so tests can run p threads as p ranks,
tests/unit/test_shm.py) that returns to Python at least every ``spin_until`` of ``MPI_Wtime``
(so the caller can check the deadline, answer a roll call, or notice a dead rank). The
protocol and its memory-ordering argument are in ``mpicoll/shm/__init__.py``.

The reduction itself is ``mpicoll.kernels``' kernels, one per (op, dtype) -- the same bits as
numpy's ufuncs -- called through their addresses, ``kernel`` and ``combiner``
(``kernels.entry_points(op, dtype)``): so the loops are compiled once per storage dtype, with
no kernel inside them. float16 and bfloat16 travel as their uint16 bit patterns
(``kernels.as_storage``), so ``sum`` on uint16 storage is either an integer sum or a
half-precision one: the kernel, not the dtype, says which.

Flag layout. Each rank has FLAGS lines of LINE int64s (128 bytes: no two ranks' flags share a
cache line); the first int64 of line ARRIVED / REDUCED / GATHERED is that flag, and the rest of
the ARRIVED line holds what the rank publishes with it: SIGNATURE (the call's hash), PID, SRC
and DST (its buffers' addresses, single copy), WHOLE (single copy: it can reduce the whole
vector), PROBE (the address of a word the window's probe reads) and ANSWER (the probe's
answer), ABORTED (nonzero once the rank gave up on the window: a peer died, or its memory
became unreadable).
"""

from __future__ import annotations

import ctypes
import time

import llvmlite.binding as llvm
import numpy as np
from mpi4py import MPI

from .. import kernels
from .probe import HAVE_READV, LIBC, READV

__all__ = ["entry_points", "FLAGS", "LINE", "ARRIVED", "REDUCED", "GATHERED", "SIGNATURE",
           "PID", "SRC", "DST", "WHOLE", "PROBE", "ABORTED", "ANSWER", "DONE", "MISMATCH",
           "BETWEEN", "UNREADABLE", "BLOCK", "publish", "slice_of", "missing", "reduce_into",
           "combine", "window_copy", "single_copy", "warmup"]

BLOCK = 2048                # elements reduced per block (the block of out stays in L1)
LINE = 16                   # int64s per flag: each flag alone in 128 bytes (two cache lines)
ARRIVED, REDUCED, GATHERED = 0, 1, 2    # the flags of each rank (GATHERED: single copy only)
FLAGS = 3
SIGNATURE = 1               # where in its ARRIVED line a rank publishes the call's hash
PID, SRC, DST = 2, 3, 4     # ... its process id and its buffers' addresses (single copy)
WHOLE = 5                   # ... whether it can reduce the whole vector (single copy)
PROBE = 6                   # ... the probe's word, then its answer (window.py)
ABORTED = 7                 # ... nonzero once it gave up on the window
ANSWER = 8                  # ... the probe's answer (1: it read every other rank's word)
DONE = -1                   # returned: every chunk is complete
MISMATCH = -2               # returned: a rank published another call signature's hash
BETWEEN = -3                # returned: my slice is reduced; all-reduce it across the nodes
UNREADABLE = -4             # returned (single copy): reading rank j's memory failed
ROWS = -1                   # a kernel (no address): the caller sums my slice's rows itself

entry_points = kernels.entry_points     # (kernel, combiner) of (op, dtype), a pair MPI allows


def _register() -> None:
    """Make libc's ``sched_yield`` and ``process_vm_readv`` and libmpi's ``MPI_Wtime`` callable
    from compiled code by name (as ``executors.compiled`` does: the same names, the same
    addresses), so numba's disk cache holds no address."""
    llvm.add_symbol("mpicoll_sched_yield", ctypes.cast(LIBC.sched_yield, ctypes.c_void_p).value)
    llvm.add_symbol("mpicoll_process_vm_readv",
                    ctypes.cast(READV, ctypes.c_void_p).value if HAVE_READV else 0)
    llvm.add_symbol("mpicoll_MPI_Wtime",
                    ctypes.cast(ctypes.CDLL(MPI.__file__).MPI_Wtime, ctypes.c_void_p).value)


_register()

from numba import njit, types  # noqa: E402  (after the symbols exist)
from numba.core import cgutils  # noqa: E402
from numba.extending import intrinsic  # noqa: E402

_sched_yield = types.ExternalFunction("mpicoll_sched_yield", types.int32())
_wtime = types.ExternalFunction("mpicoll_MPI_Wtime", types.float64())
# ssize_t process_vm_readv(pid_t, const struct iovec *local, unsigned long liovcnt,
#                          const struct iovec *remote, unsigned long riovcnt, unsigned long flags)
_process_vm_readv = types.ExternalFunction("mpicoll_process_vm_readv", types.int64(
    types.int32, types.intp, types.uint64, types.intp, types.uint64, types.uint64))


# ----------------------------------------------------------------------------- atomics

def _flag_pointer(context, builder, sig, args):
    array = context.make_array(sig.args[0])(context, builder, args[0])
    index = context.cast(builder, args[1], sig.args[1], types.intp)
    return cgutils.get_item_pointer(context, builder, sig.args[0], array, [index])


@intrinsic
def load_acquire(typingctx, flags, index):
    """``flags[index]`` read with an atomic load, acquire ordering (C11
    ``atomic_load_explicit(p, memory_order_acquire)``)."""
    if not (isinstance(flags, types.Array) and flags.dtype == types.int64):
        return None

    def codegen(context, builder, sig, args):
        return builder.load_atomic(_flag_pointer(context, builder, sig, args), "acquire", 8)
    return types.int64(flags, index), codegen


@intrinsic
def store_release(typingctx, flags, index, value):
    """``flags[index] = value`` with an atomic store, release ordering (C11
    ``atomic_store_explicit(p, v, memory_order_release)``)."""
    if not (isinstance(flags, types.Array) and flags.dtype == types.int64):
        return None

    def codegen(context, builder, sig, args):
        value = context.cast(builder, args[2], sig.args[2], types.int64)
        builder.store_atomic(value, _flag_pointer(context, builder, sig, args), "release", 8)
        return context.get_dummy_value()
    return types.void(flags, index, value), codegen


@njit(cache=True, nogil=True)
def publish(flags, index, value):
    """``flags[index] = value``, a release store (what this rank wrote before is seen first)."""
    store_release(flags, index, value)


# ----------------------------------------------------------------------------- reduction

reduce_into = kernels.reduce_at     # acc = op(acc, x), by the kernel's address


combine = kernels.combine_at        # out = op(a, b), by the kernels' addresses


# ----------------------------------------------------------------------------- the protocol
@njit(cache=True, nogil=True)
def slice_of(n, size, rank):
    """Slice ``rank`` of ``n`` elements cut in ``size`` (``schedule.block_displs``)."""
    base, extra = divmod(n, size)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


@njit(cache=True, nogil=True)
def missing(flags, which, seq, rank, size, spin_until, yield_after):
    """Wait until every other rank's flag ``which`` reaches ``seq``; -1, or the first rank whose
    flag is still short when ``MPI_Wtime`` passes ``spin_until``. Spins, then (after
    ``yield_after`` seconds) yields the core between polls."""
    yield_from = 0.0
    for j in range(size):
        if j == rank:
            continue
        polls = 0
        while load_acquire(flags, (FLAGS * j + which) * LINE) < seq:
            polls += 1
            if polls % 64 == 0:
                now = _wtime()
                if now > spin_until:
                    return j
                if yield_from == 0.0:
                    yield_from = now + yield_after
                if now > yield_from:
                    _sched_yield()  # let the rank we wait for run, if it shares our core
    return -1


@njit(cache=True, nogil=True)
def window_copy(src, dst, data, flags, rank, seq0, resume, kernel, acc, spin_until,
                yield_after, signature, between):
    """Phases 1-3 of every chunk of ``src`` (may be ``dst``: in place) into ``dst``, from
    ``resume`` (chunk * 4 + phase) on. ``data[b, j]`` is rank j's segment in buffer b, ``acc``
    BLOCK elements of scratch. Returns (DONE, -1), or (where to resume, the rank waited for)
    when a wait outlasts ``spin_until``, or (MISMATCH, j) when rank j's inputs carry another
    ``signature`` (the hash of the call's arguments: published with them, checked before any
    of them is read). ``between`` (hierarchical's node phases): after Phase 2, return (where
    to resume, BETWEEN) with my reduced slice in ``dst`` only; the caller all-reduces it
    across the nodes, writes it into my segment and resumes, and Phase 3 publishes it. With
    ``kernel`` ROWS (and ``between``) Phase 2 reduces nothing: the caller reduces my slice of
    the chunk's inputs (the other ranks' in their segments) itself, then as ``between``."""
    count, size, chunk = dst.shape[0], data.shape[1], data.shape[2]
    k, phase = resume // 4, resume % 4
    while k * chunk < count:
        seq = seq0 + k
        buf = data[seq % 2]
        at = k * chunk
        n = min(chunk, count - at)
        lo, hi = slice_of(n, size, rank)
        if phase == 0:      # Phase 1: copy in all but my slice, publish
            mine = buf[rank]
            mine[:lo] = src[at:at + lo]
            mine[hi:n] = src[at + hi:at + n]
            flags[(FLAGS * rank + ARRIVED) * LINE + SIGNATURE] = signature   # released with arrived
            store_release(flags, (FLAGS * rank + ARRIVED) * LINE, seq)
            phase = 1
        if phase == 1:      # wait for every input
            j = missing(flags, ARRIVED, seq, rank, size, spin_until, yield_after)
            if j >= 0:
                return k * 4 + 1, j
            for j in range(size):   # read after the acquire loads of the flags
                if flags[(FLAGS * j + ARRIVED) * LINE + SIGNATURE] != signature:
                    return MISMATCH, j
            phase = 2
        if phase == 2:      # Phase 2: reduce my slice of all inputs, in rank order; publish
            if kernel == ROWS:  # (with between) the caller reduces my slice's rows instead
                return k * 4 + 3, BETWEEN
            for b in range(lo, hi, BLOCK):
                e = min(b + BLOCK, hi)
                out = acc[:e - b]
                if rank == 0:
                    out[:] = src[at + b:at + e]
                else:
                    out[:] = buf[0, b:e]
                for j in range(1, size):
                    if j == rank:
                        reduce_into(kernel, out, src[at + b:at + e])
                    else:
                        reduce_into(kernel, out, buf[j, b:e])
                if not between:
                    buf[rank, b:e] = out
                dst[at + b:at + e] = out
            if between:
                return k * 4 + 3, BETWEEN
            store_release(flags, (FLAGS * rank + REDUCED) * LINE, seq)
            phase = 3
        if phase == 3:      # Phase 3: copy out every other rank's reduced slice
            if between:     # publish the slice the caller wrote (again, on a resume: harmless)
                store_release(flags, (FLAGS * rank + REDUCED) * LINE, seq)
            j = missing(flags, REDUCED, seq, rank, size, spin_until, yield_after)
            if j >= 0:
                return k * 4 + 3, j
            for j in range(size):
                if j != rank:
                    jlo, jhi = slice_of(n, size, j)
                    dst[at + jlo:at + jhi] = buf[j, jlo:jhi]
        k, phase = k + 1, 0
    return DONE, -1


@njit(cache=True, nogil=True)
def _read(pid, address, into, iov):
    """Copy ``into.size`` elements from ``address`` in process ``pid`` into ``into``: one
    ``process_vm_readv`` (Linux's cross-memory attach: the kernel copies from the other
    process's pages, no shared mapping needed). ``iov``: 4 int64s of scratch, two ``struct
    iovec``. False when the kernel moved fewer bytes (EPERM, EFAULT, ESRCH)."""
    nbytes = into.size * into.itemsize
    if nbytes == 0:
        return True
    iov[0], iov[1], iov[2], iov[3] = into.ctypes.data, nbytes, address, nbytes
    base = iov.ctypes.data
    return _process_vm_readv(pid, base, 1, base + 16, 1, 0) == nbytes


@njit(cache=True, nogil=True)
def single_copy(src, dst, flags, rank, seq, resume, kernel, combiner, acc, scratch, piece, iov,
                spin_until, yield_after, signature, whole, between):
    """Single copy: all-reduce ``src`` into ``dst`` reading the other ranks' buffers where they
    are, from phase ``resume``; returns as ``window_copy`` does (resume = the phase; also
    (UNREADABLE, j)). ``whole``: every rank reduces the whole vector (needs ``src`` apart from
    ``dst`` on every rank: nobody writes what the others read); else rank r reduces slice r
    and reads the others' from their outputs. ``scratch`` holds ``piece`` elements per other
    rank, ``acc`` BLOCK elements; the window carries only the flags. Returns (DONE, whole):
    whether the whole vector was reduced here."""
    count, size, item = dst.shape[0], flags.shape[0] // (FLAGS * LINE), dst.itemsize
    me = FLAGS * rank * LINE
    apart = src.ctypes.data != dst.ctypes.data
    phase = resume
    if phase == 0:      # Phase 1: publish where my input and output are
        flags[me + SIGNATURE] = signature           # (released with arrived)
        flags[me + SRC] = src.ctypes.data
        flags[me + DST] = dst.ctypes.data
        flags[me + WHOLE] = 1 if whole and apart and not between else 0
        store_release(flags, me + ARRIVED * LINE, seq)
        phase = 1
    if phase == 1:
        j = missing(flags, ARRIVED, seq, rank, size, spin_until, yield_after)
        if j >= 0:
            return 1, j
        for j in range(size):   # read after the acquire loads of the flags
            if flags[FLAGS * j * LINE + SIGNATURE] != signature:
                return MISMATCH, j
        # whole only if every rank can (were one in place, the others would read what it
        # writes). My slot keeps the decision for a resume: the others' AND of the slots is
        # the same with it (it is that AND), and nobody else writes it
        for j in range(size):
            whole = whole and flags[FLAGS * j * LINE + WHOLE] == 1
        flags[me + WHOLE] = 1 if whole else 0
        phase = 2
    else:
        whole = flags[me + WHOLE] == 1
    lo, hi = (0, count) if whole else slice_of(count, size, rank)
    if phase == 2:      # Phase 2: read my part of every other input, reduce in rank order
        for b in range(lo, hi, piece):
            e = min(b + piece, hi)
            for j in range(size):
                if j != rank:
                    t = (j - (j > rank)) * piece
                    if not _read(flags[FLAGS * j * LINE + PID],
                                 flags[FLAGS * j * LINE + SRC] + b * item, scratch[t:t + e - b],
                                 iov):
                        return UNREADABLE, j
            for c in range(b, e, BLOCK):
                f = min(c + BLOCK, e)
                # x_0 op x_1 in one pass, then x_2 ... x_(p-1); into dst itself unless dst is
                # my input (in place: then through acc, my input is still to be read)
                out = dst[c:f] if apart else acc[:f - c]
                if size == 1:
                    out[:] = src[c:f]
                elif rank == 0:
                    combine(kernel, combiner, out, src[c:f], scratch[c - b:f - b])
                elif rank == 1:
                    combine(kernel, combiner, out, scratch[c - b:f - b], src[c:f])
                else:
                    combine(kernel, combiner, out, scratch[c - b:f - b],
                            scratch[piece + c - b:piece + f - b])
                for j in range(2, size):
                    if j == rank:
                        reduce_into(kernel, out, src[c:f])
                    else:
                        t = (j - (j > rank)) * piece
                        reduce_into(kernel, out, scratch[t + c - b:t + f - b])
                if not apart:
                    dst[c:f] = out
        if between:
            return 3, BETWEEN
        phase = 4 if whole else 3
    if phase == 3:      # Phase 3: read every other rank's reduced slice from its output
        store_release(flags, me + REDUCED * LINE, seq)     # (again on a resume: harmless)
        j = missing(flags, REDUCED, seq, rank, size, spin_until, yield_after)
        if j >= 0:
            return 3, j
        for j in range(size):
            if j != rank:
                jlo, jhi = slice_of(count, size, j)
                if not _read(flags[FLAGS * j * LINE + PID],
                             flags[FLAGS * j * LINE + DST] + jlo * item, dst[jlo:jhi], iov):
                    return UNREADABLE, j
        phase = 4
    if phase == 4:      # nobody reads my buffers any more: the caller may have them back
        store_release(flags, me + GATHERED * LINE, seq)    # (again on a resume: harmless)
        j = missing(flags, GATHERED, seq, rank, size, spin_until, yield_after)
        if j >= 0:
            return 4, j
    return DONE, 1 if whole else 0




_ready: set = set()


def warmup(dtype, functions: tuple = ("window_copy", "single_copy")) -> float:
    """Compile (or load from numba's disk cache) ``window_copy`` and ``single_copy`` (or those
    of them ``functions`` names) for arrays of ``kernels.storage(dtype)``, under
    ``kernels.file_lock``; the seconds spent (0.0 when ready)."""
    if kernels.storage(dtype) in _ready:
        return 0.0
    started = time.perf_counter()     # (not MPI.Wtime: warm runs it before MPI_Init)
    kernel, combiner = entry_points(kernels.ops_for(dtype)[0], dtype)
    dtype = kernels.storage(dtype)
    with kernels.file_lock(f"shm's loops for {dtype}"):
        src, dst = np.zeros(4, dtype), np.zeros(4, dtype)
        flags = np.zeros(FLAGS * LINE, np.int64)
        if "window_copy" in functions:
            window_copy(src, dst, np.zeros((2, 1, 4), dtype), flags, 0, 1, 0, kernel,
                        np.empty(BLOCK, dtype), 0.0, 0.0, 0, False)
        if "single_copy" in functions:
            single_copy(src, dst, flags, 0, 1, 0, kernel, combiner, np.empty(BLOCK, dtype),
                        np.empty(1, dtype), 1, np.zeros(4, np.int64), 0.0, 0.0, 0, True, False)
    if {"window_copy", "single_copy"} <= set(functions):
        _ready.add(dtype)
    return time.perf_counter() - started
