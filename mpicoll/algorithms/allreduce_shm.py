"""Shared-memory all-reduce: ranks on one node reduce straight from each other's memory.

No message is sent. The ranks share an MPI-3 window (``MPI_Win_allocate_shared`` on the node
communicator, the ``COMM_TYPE_SHARED`` split of mpicoll's private duplicate) that holds, for
each rank, a *segment* as long as the vector (a chunk of it, for long vectors) and three
flags (the third for the single copy below). The vector is cut into p slices
(``schedule.block_displs``: the first count % p one element longer); rank r owns slice r.
Per chunk, with a sequence number ``seq`` that every rank counts alike (one per chunk, per
window):

    Phase 1 (copy in)  rank r copies its input into its segment -- all but slice r, which
                       only r reads -- and publishes ``arrived[r] = seq``;
    Phase 2 (reduce)   once ``arrived[j] >= seq`` for every j, rank r reduces slice r of all p
                       inputs in one pass, its own straight from its buffer, in rank order
                           out = op(...op(op(x_0, x_1), x_2)..., x_(p-1))
                       (cache-sized blocks: the block of ``out`` stays in L1 while the p inputs
                       stream through), writes the result into slice r of its segment and of
                       its output, and publishes ``reduced[r] = seq``;
    Phase 3 (copy out) once ``reduced[j] >= seq`` for every j, rank r copies slice j of rank
                       j's segment into its output, for every j != r.

Each slice is reduced once, by one rank, in the fixed order 0..p-1, and then copied: every
rank ends with the same bits, and they are the bits of numpy's ufunc applied left to right
in rank order (``acc = x_0; np.add(acc, x_j, out=acc)`` for j = 1 .. p-1 -- not
``np.add.reduce``, which sums 8 or more inputs pairwise; tests/mpi/test_shm.py checks exactly
that). A schedule cannot express it
(a received vector is always reduced into the rank's own, see ``allreduce_naive``), so ``shm``
has no schedule: restriction ``shared-memory``. It is MPICH's POSIX "release_gather" and
Open MPI's ``coll/sm`` idea cut down to one level: Intel MPI's ``I_MPI_ADJUST_ALLREDUCE`` 15
("N-reduce"), each rank reducing its 1/p of the vector from all p buffers.

Single copy (from ``SINGLE_COPY_MIN_BYTES``, 16 KiB). Phase 1 copies every input once more
than a message would need, and Phases 2 and 3 then read what another core has just written.
Where the node allows it, each rank instead publishes the addresses of its input and output
(and its pid, once) and the others read them *where they are*, with Linux's cross-memory
attach (``process_vm_readv``: the kernel copies from the other process's pages, as MPICH's
and Open MPI's single-copy transports do for large messages). One sequence number per call:

    Phase 1 (publish)  rank r writes its buffers' addresses beside its flag, ``arrived[r]``;
    Phase 2 (reduce)   rank r reads its slice of every other input, a piece of PIECE_BYTES at
                       a time, into scratch, and reduces it in rank order into its output
                       (``x_0 op x_1`` in one pass, ``_combine``; the same bits as above);
                       publishes ``reduced[r]``;
    Phase 3 (gather)   rank r reads slice j of rank j's output into its own, every j != r;
    Phase 4 (release)  publishes ``gathered[r]`` and waits for every rank's: until then another
                       rank may still be reading r's buffers, which the caller owns again on
                       return.

At 2 ranks and up to WHOLE_MAX_BYTES, each rank reads the other's whole input and reduces the
whole vector (no Phase 3): nobody then reads what another core wrote in this call. Measured
here, a core's write to a line the other core has just read costs 4x a plain write (the line
must be taken back from the other cache), which is what Phase 3 leaves for the next call; the
whole vector's extra reduction costs less than that up to a few hundred KiB. Whole needs every
rank's input apart from its output (each rank publishes whether it is; one in-place rank puts
all on slices). In place, a rank reduces through ``acc`` (its input is still to be read), and
the other ranks read only slices it does not write before they are done.

When is it used: ``MPICOLL_SHM_SINGLE_COPY`` (``single_copy_expected``): ``auto`` when the node
has a core per rank (its fourth phase costs a wait, and waits cost a context switch when ranks
take turns on a core), ``on``, ``off``; and only if a probe when the window is made (each rank
reads a word from every other) works on every rank: a Yama ptrace scope of 1 is widened with
``prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY)`` as Open MPI's CMA component does; a seccomp
profile may still refuse, and then ``shm`` copies through the window. The node agrees on the
answer (``MPI_Allreduce``), so every rank takes the same path.

Synchronisation and memory ordering. Two counters per rank (a third for the single copy), each
alone in a 128-byte line, and no barrier: a rank waits only for the flags it needs. The
segments are double-buffered by the parity of ``seq``, which makes a third wait unnecessary:
before rank r writes buffer ``seq % 2`` again (chunk seq), every rank j must have finished
reading it in chunk seq - 2.
Rank j published ``arrived[j] = seq - 1`` after it finished chunk seq - 2 (in program order),
and rank r waited for that flag in chunk seq - 1: its reads happen before r's writes.
MPI-3's unified memory model (MPI 4.1, 12.7) leaves the order in which another process sees
stores to a shared window to the hardware unless the program synchronises. MPICH's own
shared-memory collectives wait on ``MPL_atomic_uint64_t`` flags with acquire loads
(``src/mpid/ch4/shm/posix/release_gather/release_gather.h``), and so does this code: a flag is stored with a C11 *release* store (LLVM ``store
atomic release``) after the data it covers, and read with an *acquire* load (``load atomic
acquire``) before the data: whatever a rank wrote before publishing a flag is visible to a
rank that has read that flag's value. These are real atomic instructions to the compiler too,
so LLVM neither hoists the spinning load out of its loop nor moves the data stores after the
flag store. On x86-64 (TSO) both are plain ``mov``s -- stores are not reordered with stores,
loads not with loads -- and on weaker processors LLVM emits the barriers (``dmb``). The window
is opened once with ``MPI_Win_lock_all(MPI_MODE_NOCHECK)`` (a passive-target epoch for its
lifetime, as MPI requires for load/store access) and the flags are zeroed before a
``MPI_Win_sync``-barrier-``MPI_Win_sync`` (MPI's own idiom for that one-off publication).

Waiting. A wait spins on the flag for ``YIELD_AFTER`` (20 us), so that a short wait keeps the
core, then calls ``sched_yield`` between polls, so that a rank sharing a core with the one it
waits for gives it the core (with more ranks than cores: after 64 polls). It returns to
Python every 10 ms of ``MPI_Wtime``; with a deadline (``timeout=``) the call's ``Watch`` then checks it and answers a
roll call, and raises ``CollectiveTimeout`` naming the ranks whose flags are missing; without
one the wait goes on, as MPI's would. The first call of a size class is collective on the node
(``MPI_Win_allocate_shared``): with a deadline an ``MPI_Ibarrier``, polled under it, first
makes sure every rank has come.

Windows. One per communicator, kept in its state and freed with it (``MPI_Win_free``; not after
a failed call, when a rank may never come to free it): its segments hold ``capacity`` bytes, the
size class (a power of two from 4 KiB to ``CHUNK_BYTES``); a longer vector goes through it in
chunks, and a call that needs a larger class frees the window and allocates the next one
(collectively, at the same call on every rank). Memory: 2 x p x capacity bytes, at most 2 x p x
4 MiB.

Restrictions: every rank on one node (``shared-memory``; the MPI library's ``COMM_TYPE_SHARED``
split decides, not ``MPICOLL_RANKS_PER_NODE``); the ops of ``OPS``, the dtypes of ``DTYPES``;
blocking calls and persistent ones (no nonblocking form). Traffic: no byte crosses the
network; the byte counters count 0 bytes sent and add the bytes written into the window
(``shared_bytes``), or with the single copy the bytes read from the other ranks' memory.

Cost, n bytes, p ranks on one node -- alpha is the time for a flag store to reach a waiting
core (a cache-line transfer), beta the time to copy a byte through memory, gamma to reduce one;
a phase ends when its slowest rank does, so each wait costs one alpha:
    T = 2.alpha + ((p-1)/p).n.beta + n.beta + ((p-1)/p).n.gamma + ((p-1)/p).n.beta
      = 2.alpha + (3p-2)/p.n.beta + ((p-1)/p).n.gamma
(copy in (p-1)/p of the vector, read n/p from each of p inputs, copy out (p-1)/p). The cost
model (``mpicoll.model``) evaluates it with the intra-node link's alpha and beta, an upper
bound: MPI's intra-node beta includes MPI's own two copies through its shared-memory cells.
With the single copy: T = 3.alpha + ((p-1)/p).n.beta + ((p-1)/p).n.gamma + ((p-1)/p).n.beta
(read (p-1) slices of n/p, reduce, read (p-1)/p of the outputs; the whole vector at 2 ranks:
2.alpha + n.beta + n.gamma); ``cost`` keeps the window's formula, the upper bound.
Bytes each rank sends: 0.
"""

from __future__ import annotations

import ctypes
import os

import numpy as np
from mpi4py import MPI

from .. import kernels, settings

__all__ = ["cost", "bytes_sent", "OPS", "DTYPES", "CHUNK_BYTES", "check", "allreduce",
           "Window", "warmup", "window_rank", "single_copy_expected"]

OPS = ("sum", "prod", "max", "min")             # the op codes of _allreduce, in this order
DTYPES = tuple(d for d in kernels.DTYPES if d.kind in "iuf" and d.itemsize >= 4)
CHUNK_BYTES = 4 << 20       # the largest segment: longer vectors go through in chunks
MIN_BYTES = 4 << 10         # the smallest size class
BLOCK = 2048                # elements reduced per block (the block of out stays in L1)
LINE = 16                   # int64s per flag: each flag alone in 128 bytes (two cache lines)
ARRIVED, REDUCED, GATHERED = 0, 1, 2    # the flags of each rank (GATHERED: single copy only)
FLAGS = 3
DONE = -1                   # _allreduce: every chunk is complete
MISMATCH = -2               # _allreduce: a rank published another call signature's hash
BETWEEN = -3                # _allreduce: my slice is reduced; all-reduce it across the nodes
SIGNATURE = 1               # where in its ARRIVED line a rank publishes that hash
PID, SRC, DST = 2, 3, 4     # ... its process id and its buffers' addresses (single copy)
WHOLE = 5                   # ... and whether it can reduce the whole vector (single copy)
UNREADABLE = -4             # _allreduce_single: reading rank j's memory failed
SINGLE_COPY_MIN_BYTES = 16 << 10    # single copy from this size (when the node allows it)
PIECE_BYTES = 256 << 10     # single copy: scratch for the other ranks' pieces of my slice
WHOLE_MAX_BYTES = 256 << 10     # single copy, 2 ranks: each reduces the whole vector up to this
SPIN_SECONDS = 0.01         # a wait returns to Python this often (the Watch, or Ctrl-C)
YIELD_AFTER = 20e-6         # a wait spins this long, then yields the core between polls
                            # (at once when the node has more ranks than this rank has cores)


def cost(p: int, n: float, alpha: float, beta: float, gamma: float) -> float:
    if p <= 1:
        return 0.0
    return 2 * alpha + (3 * p - 2) / p * n * beta + (p - 1) / p * n * gamma


def bytes_sent(rank: int, p: int, n: float) -> float:
    return 0.0


# ----------------------------------------------------------------------------- atomics, libc

_LIBC = ctypes.CDLL(None)
_READV = getattr(_LIBC, "process_vm_readv", None)      # Linux (glibc >= 2.15, musl)
_HAVE_READV = _READV is not None


def _register() -> None:
    """Make libc's ``sched_yield`` and libmpi's ``MPI_Wtime`` callable from compiled code by
    name (as ``executors.compiled`` does: the same names, the same addresses), so numba's disk
    cache holds no address."""
    import llvmlite.binding as llvm
    llvm.add_symbol("mpicoll_sched_yield", ctypes.cast(_LIBC.sched_yield, ctypes.c_void_p).value)
    llvm.add_symbol("mpicoll_process_vm_readv",
                    ctypes.cast(_READV, ctypes.c_void_p).value if _HAVE_READV else 0)
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
sum_into, prod_into = kernels.sum_into, kernels.prod_into
max_into, min_into = kernels.max_into, kernels.min_into


def _flag_pointer(context, builder, sig, args):
    array = context.make_array(sig.args[0])(context, builder, args[0])
    index = context.cast(builder, args[1], sig.args[1], types.intp)
    return cgutils.get_item_pointer(context, builder, sig.args[0], array, [index])


@intrinsic
def _load_acquire(typingctx, flags, index):
    """``flags[index]`` read with an atomic load, acquire ordering (C11
    ``atomic_load_explicit(p, memory_order_acquire)``)."""
    if not (isinstance(flags, types.Array) and flags.dtype == types.int64):
        return None

    def codegen(context, builder, sig, args):
        return builder.load_atomic(_flag_pointer(context, builder, sig, args), "acquire", 8)
    return types.int64(flags, index), codegen


@intrinsic
def _store_release(typingctx, flags, index, value):
    """``flags[index] = value`` with an atomic store, release ordering (C11
    ``atomic_store_explicit(p, v, memory_order_release)``)."""
    if not (isinstance(flags, types.Array) and flags.dtype == types.int64):
        return None

    def codegen(context, builder, sig, args):
        value = context.cast(builder, args[2], sig.args[2], types.int64)
        builder.store_atomic(value, _flag_pointer(context, builder, sig, args), "release", 8)
        return context.get_dummy_value()
    return types.void(flags, index, value), codegen


# ----------------------------------------------------------------------------- the call

@njit(cache=True, nogil=True)
def _slice(n, size, rank):
    """Slice ``rank`` of ``n`` elements cut in ``size`` (``schedule.block_displs``)."""
    base, extra = divmod(n, size)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


@njit(cache=True, nogil=True)
def _missing(flags, which, seq, rank, size, spin_until, yield_after):
    """Wait until every other rank's flag ``which`` reaches ``seq``; -1, or the first rank whose
    flag is still short when ``MPI_Wtime`` passes ``spin_until``. Spins, then (after
    ``yield_after`` seconds) yields the core between polls."""
    yield_from = 0.0
    for j in range(size):
        if j == rank:
            continue
        polls = 0
        while _load_acquire(flags, (FLAGS * j + which) * LINE) < seq:
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
def _reduce_into(op, acc, x):
    if op == 0:
        sum_into(acc, x)
    elif op == 1:
        prod_into(acc, x)
    elif op == 2:
        max_into(acc, x)
    else:
        min_into(acc, x)


@njit(cache=True, nogil=True)
def _allreduce(src, dst, data, flags, rank, seq0, resume, op, acc, spin_until, yield_after,
               signature, between):
    """Phases 1-3 of every chunk of ``src`` (may be ``dst``: in place) into ``dst``, from
    ``resume`` (chunk * 4 + phase) on. ``data[b, j]`` is rank j's segment in buffer b, ``acc``
    BLOCK elements of scratch. Returns (DONE, -1), or (where to resume, the rank waited for)
    when a wait outlasts ``spin_until``, or (MISMATCH, j) when rank j's inputs carry another
    ``signature`` (the hash of the call's arguments: published with them, checked before any
    of them is read). ``between`` (hierarchical's node phases): after Phase 2, return (where
    to resume, BETWEEN) with my reduced slice in ``dst`` only; the caller all-reduces it
    across the nodes, writes it into my segment and resumes, and Phase 3 publishes it."""
    count, size, chunk = dst.shape[0], data.shape[1], data.shape[2]
    k, phase = resume // 4, resume % 4
    while k * chunk < count:
        seq = seq0 + k
        buf = data[seq % 2]
        at = k * chunk
        n = min(chunk, count - at)
        lo, hi = _slice(n, size, rank)
        if phase == 0:      # Phase 1: copy in all but my slice, publish
            mine = buf[rank]
            mine[:lo] = src[at:at + lo]
            mine[hi:n] = src[at + hi:at + n]
            flags[(FLAGS * rank + ARRIVED) * LINE + SIGNATURE] = signature   # released with arrived
            _store_release(flags, (FLAGS * rank + ARRIVED) * LINE, seq)
            phase = 1
        if phase == 1:      # wait for every input
            j = _missing(flags, ARRIVED, seq, rank, size, spin_until, yield_after)
            if j >= 0:
                return k * 4 + 1, j
            for j in range(size):   # read after the acquire loads of the flags
                if flags[(FLAGS * j + ARRIVED) * LINE + SIGNATURE] != signature:
                    return MISMATCH, j
            phase = 2
        if phase == 2:      # Phase 2: reduce my slice of all inputs, in rank order; publish
            for b in range(lo, hi, BLOCK):
                e = min(b + BLOCK, hi)
                out = acc[:e - b]
                if rank == 0:
                    out[:] = src[at + b:at + e]
                else:
                    out[:] = buf[0, b:e]
                for j in range(1, size):
                    if j == rank:
                        _reduce_into(op, out, src[at + b:at + e])
                    else:
                        _reduce_into(op, out, buf[j, b:e])
                if not between:
                    buf[rank, b:e] = out
                dst[at + b:at + e] = out
            if between:
                return k * 4 + 3, BETWEEN
            _store_release(flags, (FLAGS * rank + REDUCED) * LINE, seq)
            phase = 3
        if phase == 3:      # Phase 3: copy out every other rank's reduced slice
            if between:     # publish the slice the caller wrote (again, on a resume: harmless)
                _store_release(flags, (FLAGS * rank + REDUCED) * LINE, seq)
            j = _missing(flags, REDUCED, seq, rank, size, spin_until, yield_after)
            if j >= 0:
                return k * 4 + 3, j
            for j in range(size):
                if j != rank:
                    jlo, jhi = _slice(n, size, j)
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
def _combine(op, out, a, b):
    """``out = op(a, b)`` in one pass: the bits of ``out[:] = a`` then ``_reduce_into(op, out,
    b)`` (the kernels' NaN rule for max and min), without the second pass over ``out``."""
    if op == 0:
        for i in range(out.shape[0]):
            out[i] = a[i] + b[i]
    elif op == 1:
        for i in range(out.shape[0]):
            out[i] = a[i] * b[i]
    elif op == 2:
        for i in range(out.shape[0]):
            x, y = a[i], b[i]
            out[i] = x if (x > y or x != x) else y
    else:
        for i in range(out.shape[0]):
            x, y = a[i], b[i]
            out[i] = x if (x < y or x != x) else y


@njit(cache=True, nogil=True)
def _allreduce_single(src, dst, flags, rank, seq, resume, op, acc, scratch, piece, iov,
                      spin_until, yield_after, signature, whole, between):
    """Single copy: all-reduce ``src`` into ``dst`` reading the other ranks' buffers where they
    are, from phase ``resume``; returns as ``_allreduce`` does (resume = the phase; also
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
        _store_release(flags, me + ARRIVED * LINE, seq)
        phase = 1
    if phase == 1:
        j = _missing(flags, ARRIVED, seq, rank, size, spin_until, yield_after)
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
    lo, hi = (0, count) if whole else _slice(count, size, rank)
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
                    _combine(op, out, src[c:f], scratch[c - b:f - b])
                elif rank == 1:
                    _combine(op, out, scratch[c - b:f - b], src[c:f])
                else:
                    _combine(op, out, scratch[c - b:f - b], scratch[piece + c - b:piece + f - b])
                for j in range(2, size):
                    if j == rank:
                        _reduce_into(op, out, src[c:f])
                    else:
                        t = (j - (j > rank)) * piece
                        _reduce_into(op, out, scratch[t + c - b:t + f - b])
                if not apart:
                    dst[c:f] = out
        if between:
            return 3, BETWEEN
        phase = 4 if whole else 3
    if phase == 3:      # Phase 3: read every other rank's reduced slice from its output
        _store_release(flags, me + REDUCED * LINE, seq)     # (again on a resume: harmless)
        j = _missing(flags, REDUCED, seq, rank, size, spin_until, yield_after)
        if j >= 0:
            return 3, j
        for j in range(size):
            if j != rank:
                jlo, jhi = _slice(count, size, j)
                if not _read(flags[FLAGS * j * LINE + PID],
                             flags[FLAGS * j * LINE + DST] + jlo * item, dst[jlo:jhi], iov):
                    return UNREADABLE, j
        phase = 4
    if phase == 4:      # nobody reads my buffers any more: the caller may have them back
        _store_release(flags, me + GATHERED * LINE, seq)    # (again on a resume: harmless)
        j = _missing(flags, GATHERED, seq, rank, size, spin_until, yield_after)
        if j >= 0:
            return 4, j
    return DONE, 1 if whole else 0


# ----------------------------------------------------------------------------- Python side

class Window:
    """The shared window of one communicator: 2 x size segments of ``capacity`` bytes and three
    flags per rank, ``seq`` the last sequence number used. ``sharing``: the ranks on this real
    node (0: the window's), against its cores for ``single_copy``."""

    def __init__(self, node: MPI.Intracomm, capacity: int, sharing: int = 0):
        size, rank = node.Get_size(), node.Get_rank()
        self.capacity, self.seq, self._views, self._scratch = capacity, 0, {}, {}
        # more ranks than cores: the rank waited for may need this core, yield at once
        self.yield_after = 0.0 if size > len(os.sched_getaffinity(0)) else YIELD_AFTER
        header = FLAGS * size * LINE * 8
        total = header + 2 * size * capacity
        # rank 0 allocates it all (one contiguous region), the others nothing
        self.win = MPI.Win.Allocate_shared(total if node.Get_rank() == 0 else 0, 1, comm=node)
        self.win.Lock_all(MPI.MODE_NOCHECK)
        memory, _ = self.win.Shared_query(0)
        region = np.frombuffer(memory, np.uint8, total)
        self.flags = region[:header].view(np.int64)
        self.data = region[header:]
        if rank == 0:
            self.flags[:] = 0
        self.win.Sync()             # MPI-3's idiom: publish the zeroed flags to every rank
        node.Barrier()
        self.win.Sync()
        self.flags[FLAGS * rank * LINE + PID] = os.getpid()
        self.single_copy = size > 1 and _can_read_each_other(
            node, self, single_copy_expected(max(size, sharing)))
        self.iov = np.zeros(4, np.int64)

    def views(self, dtype: np.dtype):
        """``(data, acc)``: the segments as ``data[buffer, rank, element]`` of ``dtype``, and
        BLOCK elements of scratch (made once per dtype)."""
        got = self._views.get(dtype)
        if got is None:
            size = self.flags.size // (FLAGS * LINE)
            got = self._views[dtype] = (
                self.data.view(dtype).reshape(2, size, self.capacity // dtype.itemsize),
                np.empty(BLOCK, dtype))
        return got

    def scratch(self, dtype: np.dtype, count: int) -> tuple:
        """Single copy: ``(scratch, piece)``, room for ``piece`` elements of each other rank --
        as much of ``count`` as PIECE_BYTES allows (kept per dtype, grown when a longer vector
        needs more)."""
        size = self.flags.size // (FLAGS * LINE)
        piece = max(1, min(count, PIECE_BYTES // (size - 1) // dtype.itemsize))
        got = self._scratch.get(dtype)
        if got is None or got.size < piece * (size - 1):
            got = self._scratch[dtype] = np.empty(piece * (size - 1), dtype)
        return got, got.size // (size - 1)

    def free(self) -> None:
        """Collective on the node communicator."""
        self.win.Unlock_all()
        self.win.Free()


def single_copy_expected(ranks: int, cores: int | None = None) -> bool:
    """Whether ``shm`` on a node of ``ranks`` ranks and ``cores`` cores (None: the machine's)
    reads in place (``Window.single_copy``; a probe when the window is made has the last
    word): ``MPICOLL_SHM_SINGLE_COPY=on``, or ``auto`` with a core per rank -- its third wait
    costs more than the copy saves when ranks take turns on a core -- and a libc with
    ``process_vm_readv``. ``select`` asks it too, for ``auto``'s band."""
    mode = settings.get("MPICOLL_SHM_SINGLE_COPY")
    return _HAVE_READV and ranks > 1 and (
        mode == "on" or (mode == "auto" and ranks <= (cores or os.cpu_count() or 1)))


_PR_SET_PTRACER, _PR_SET_PTRACER_ANY = 0x59616D61, ctypes.c_ulong(-1)
_ptracer_set = False


def _allow_reads_by_any() -> None:
    """With Yama's ptrace_scope 1 (Ubuntu's default) only a process's ancestors may read its
    memory, so sibling ranks may not: allow any process of this user, as Open MPI's CMA
    component does (``opal/mca/smsc/cma``: ``prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY)``)."""
    global _ptracer_set
    if _ptracer_set:
        return
    _ptracer_set = True
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            scope = f.read().strip()
    except OSError:
        return                      # no Yama: the usual same-user rule applies
    if scope != "0":
        _LIBC.prctl(_PR_SET_PTRACER, _PR_SET_PTRACER_ANY, 0, 0, 0)


def _can_read_each_other(node: MPI.Intracomm, window: "Window", wanted: bool) -> bool:
    """Whether every rank of ``node`` wants single copy and can read every other's memory with
    process_vm_readv (Linux, same user, a ptrace scope and seccomp profile that allow it): each
    rank reads a word the others published, and the node agrees (one answer everywhere: the
    ranks must all take the same path)."""
    size, rank = node.Get_size(), node.Get_rank()
    word = np.array([0x6D7069636F6C6C00 + rank], np.int64)     # kept alive until all have read
    if wanted:
        _allow_reads_by_any()
    window.flags[FLAGS * rank * LINE + SRC] = word.ctypes.data
    window.win.Sync()
    node.Barrier()
    window.win.Sync()
    ok = wanted                     # (wanted: single_copy_expected, which needs _READV)
    got = np.zeros(1, np.int64)
    iov = np.array([got.ctypes.data, 8, 0, 8], np.int64)     # two struct iovec
    for j in range(size if ok else 0):
        if j != rank:
            got[0], iov[2] = 0, window.flags[FLAGS * j * LINE + SRC]
            moved = _READV(int(window.flags[FLAGS * j * LINE + PID]),
                           ctypes.c_void_p(iov.ctypes.data), 1,
                           ctypes.c_void_p(iov.ctypes.data + 16), 1, 0)
            ok = ok and moved == 8 and got[0] == 0x6D7069636F6C6C00 + j
    return bool(node.allreduce(ok, op=MPI.LAND))


class Shared:
    """What ``shm`` keeps in a communicator's state: the node communicator and the window."""

    def __init__(self, node: MPI.Intracomm):
        self.node, self.window = node, None

    def free(self) -> None:
        if self.window is not None:
            self.window.free()
        self.node.Free()


def size_class(nbytes: int) -> int:
    """Segment bytes for a vector of ``nbytes``: a power of two, MIN_BYTES to CHUNK_BYTES."""
    return min(CHUNK_BYTES, max(MIN_BYTES, 1 << max(0, nbytes - 1).bit_length()))


def supports(op: str, dtype) -> bool:
    """Whether ``shm`` reduces ``op`` on ``dtype`` (``check`` refuses the others)."""
    return op in OPS and np.dtype(dtype) in DTYPES


def check(st, op: str, dtype: np.dtype) -> None:
    """Raise ``ValueError`` unless ``shm`` can run on ``st``'s communicator with ``op`` and
    ``dtype`` (every rank gets the same answer: the layout is the same everywhere)."""
    nodes = st.real_nodes
    if len(nodes) > 1:
        raise ValueError(f"algorithm='shm' needs every rank on one node (it reduces in a "
                         f"shared-memory window); the ranks span {len(nodes)} nodes: "
                         f"{[list(n) for n in nodes]}")
    if op not in OPS:
        raise ValueError(f"algorithm='shm' supports op {', '.join(OPS)}, not {op!r}")
    if dtype not in DTYPES:
        raise ValueError(f"algorithm='shm' supports dtype {', '.join(map(str, DTYPES))}, "
                         f"not {dtype}")


def _window(st, nbytes: int, get_watch, nodes=None) -> Window:
    """The communicator's window, large enough for ``nbytes`` (first use of a size class:
    collective on the node, after every rank is known to have come when there is a deadline).
    ``nodes``: a node layout whose every node lies in one real node (hierarchical's): the
    window of this rank's node of it (the ranks of a node in the layout's order)."""
    shared = st.shared if nodes is None else st.node_shared.get(nodes)
    capacity = size_class(nbytes)
    if shared is not None and shared.window is not None and shared.window.capacity >= capacity:
        return shared.window
    watch = get_watch()
    if watch is not None:
        watch.wait([st.comm.Ibarrier()], "the shared window's allocation (every rank comes)")
    if shared is None and nodes is None:
        shared = st.shared = Shared(st.comm.Split_type(MPI.COMM_TYPE_SHARED))
        assert shared.node.Get_size() == st.comm.Get_size(), "shm needs one node (checked)"
    elif shared is None:
        members = _my_node(st, nodes)
        shared = st.node_shared[nodes] = Shared(st.comm.Split(
            nodes.index(members), members.index(st.comm.Get_rank())))
    if shared.window is not None:
        shared.window.free()
        shared.window = None
    rank = st.comm.Get_rank()
    shared.window = Window(shared.node, capacity,
                           next(len(r) for r in st.real_nodes if rank in r))
    return shared.window


def allreduce(st, src: np.ndarray, dst: np.ndarray, op: str, watch=None, signature: int = 0,
              mismatch=None, *, nodes=None, between=None) -> None:
    """All-reduce ``src`` (flat; may be ``dst``) into ``dst`` on ``st``'s communicator
    (``check`` passed on every rank). ``watch``: the call's deadline. ``signature``: the hash
    of the call's arguments (``_runtime.tags``), published beside each rank's input; when the
    ranks' differ, nothing is reduced and every rank calls ``mismatch()``, which raises
    (every rank sees some other rank's hash differ from its own). ``watch`` may also be a
    function that makes the deadline's ``Watch`` (or returns None), called only when one is
    needed (a prepared call: ``cache.Entry``).

    Hierarchical's node phases: ``nodes`` a node layout whose every node lies in one real node,
    ``between(part)`` a function that all-reduces ``part`` in place across the nodes (with the
    same local rank of every node). The window is then the node's, Phases 1 and 2 a
    reduce-scatter inside each node, ``between`` the inter-node phase on my slice of each chunk,
    Phase 3 an all-gather inside each node.

    From SINGLE_COPY_MIN_BYTES, where the node lets the ranks read each other's memory
    (``Window.single_copy``), the whole vector goes through ``_allreduce_single`` instead."""
    if not src.flags.writeable:             # a read-only sendbuf: its own compiled code
        warmup(src.dtype, readonly=True)
    get_watch = watch if callable(watch) else lambda: watch
    single = dst.nbytes >= SINGLE_COPY_MIN_BYTES
    window = _window(st, 0 if single else dst.nbytes, get_watch, nodes)
    if single and window.single_copy:
        _single_copy(st, window, src, dst, op, get_watch, signature, mismatch, nodes, between)
        return
    if single:
        window = _window(st, dst.nbytes, get_watch, nodes)
    data, acc = window.views(dst.dtype)
    size, chunk = data.shape[1], data.shape[2]
    nchunks = -(-dst.size // chunk)
    rank = st.comm.Get_rank() if nodes is None else window_rank(st, nodes)
    seq0, code = window.seq + 1, OPS.index(op)
    window.seq += nchunks
    resume = 0
    while True:
        resume, waiting = _allreduce(src, dst, data, window.flags, rank, seq0, resume, code,
                                     acc, MPI.Wtime() + SPIN_SECONDS, window.yield_after,
                                     signature, between is not None)
        if resume == DONE:
            break
        if resume == MISMATCH:
            mismatch()
            raise AssertionError("mismatch() must raise")
        if waiting == BETWEEN:              # my reduced slice of chunk k: across the nodes
            k = resume // 4
            at = k * chunk
            lo, hi = _slice(min(chunk, dst.size - at), size, rank)
            part = dst[at + lo:at + hi]
            if hi > lo:                     # (every node's rank of my index has the same)
                between(part)
            data[(seq0 + k) % 2, rank, lo:hi] = part
            continue
        watch = get_watch()
        if watch is not None:
            k, phase = divmod(resume, 4)
            _overdue(st, watch, window.flags, ARRIVED if phase == 1 else REDUCED, seq0 + k, rank,
                     waiting, nodes, f"chunk {k + 1} of {nchunks}, waiting for "
                     f"{'the inputs' if phase == 1 else 'the reduced slices'} in the shared "
                     "window", nchunks)
    st.traffic["shared_bytes"] += (dst.size - _own_elements(dst.size, chunk, size, rank)) * \
        dst.itemsize


def _single_copy(st, window: Window, src, dst, op: str, get_watch, signature: int, mismatch,
                 nodes, between) -> None:
    """``allreduce`` by ``_allreduce_single``: one sequence number, three flag waits."""
    size = window.flags.size // (FLAGS * LINE)
    rank = st.comm.Get_rank() if nodes is None else window_rank(st, nodes)
    acc = window.views(dst.dtype)[1]
    scratch, piece = window.scratch(dst.dtype, dst.size)
    window.seq += 1
    seq, code, resume = window.seq, OPS.index(op), 0
    whole = size == 2 and dst.nbytes <= WHOLE_MAX_BYTES     # if both ranks can (the kernel)
    while True:
        resume, waiting = _allreduce_single(src, dst, window.flags, rank, seq, resume, code, acc,
                                            scratch, piece, window.iov,
                                            MPI.Wtime() + SPIN_SECONDS, window.yield_after,
                                            signature, whole, between is not None)
        if resume == DONE:
            whole = waiting == 1
            break
        if resume == MISMATCH:
            mismatch()
            raise AssertionError("mismatch() must raise")
        if resume == UNREADABLE:
            peer = waiting if nodes is None else _my_node(st, nodes)[waiting]
            raise RuntimeError(f"shm: reading rank {peer}'s memory (process_vm_readv) failed "
                               "after it had worked when the window was made; set "
                               "MPICOLL_SHM_SINGLE_COPY=off to copy through the window instead")
        if waiting == BETWEEN:              # my reduced slice: all-reduce it across the nodes
            lo, hi = _slice(dst.size, size, rank)
            if hi > lo:
                between(dst[lo:hi])
            continue
        watch = get_watch()
        if watch is not None:
            which = {1: ARRIVED, 3: REDUCED, 4: GATHERED}[resume]
            what = {ARRIVED: "the inputs' addresses", REDUCED: "the reduced slices",
                    GATHERED: "the other ranks to finish reading my buffers"}[which]
            _overdue(st, watch, window.flags, which, seq, rank, waiting, nodes,
                     f"single copy, waiting for {what} in shared memory", 1)
    lo, hi = (0, dst.size) if whole else _slice(dst.size, size, rank)
    st.traffic["shared_bytes"] += ((size - 1) * (hi - lo) + dst.size - (hi - lo)) * dst.itemsize


def _overdue(st, watch, flags: np.ndarray, which: int, seq: int, rank: int, waiting: int, nodes,
             step: str, nsteps: int) -> None:
    """A flag wait outlasted its spin: ``watch.overdue`` (raises past the deadline or at a roll
    call), naming in ``st.comm``'s ranks those whose flag ``which`` is short of ``seq``
    (``waiting``, the rank the wait stopped at, if none is any more)."""
    waiting_on = _short(flags, which, seq, rank) or [waiting]
    if nodes is not None:                   # window ranks -> the communicator's
        members = _my_node(st, nodes)
        waiting_on = [members[j] for j in waiting_on]
    watch.overdue(step, nsteps, waiting_on)


def _my_node(st, nodes) -> tuple:
    """This rank's node of ``nodes`` (its ranks in ``st.comm``, in the layout's order)."""
    rank = st.comm.Get_rank()
    return next(members for members in nodes if rank in members)


def window_rank(st, nodes) -> int:
    """This rank's index in its node of ``nodes`` (its rank in that node's window)."""
    return _my_node(st, nodes).index(st.comm.Get_rank())


def _short(flags: np.ndarray, which: int, seq: int, rank: int) -> list:
    """The ranks whose flag ``which`` has not reached ``seq`` (a diagnosis; a plain read)."""
    size = flags.size // (FLAGS * LINE)
    return [j for j in range(size) if j != rank and flags[(FLAGS * j + which) * LINE] < seq]


def _own_elements(count: int, chunk: int, size: int, rank: int) -> int:
    """Elements of my own slices (not copied into the window), over every chunk: slice
    ``rank`` of ``block_displs`` has n // size elements, one more if rank < n % size."""
    full, last = divmod(count, chunk)
    return (full * (chunk // size + (rank < chunk % size))
            + (last // size + (rank < last % size) if last else 0))


_ready: set = set()


def warmup(dtype: np.dtype, readonly: bool = False) -> None:
    """Compile (or load from numba's disk cache) ``_allreduce`` for ``dtype`` (and a read-only
    input: numba types it apart), under ``kernels.file_lock``."""
    if (dtype, readonly) in _ready:
        return
    with kernels.file_lock():
        src, dst = np.zeros(4, dtype), np.zeros(4, dtype)
        src.flags.writeable = not readonly
        flags = np.zeros(FLAGS * LINE, np.int64)
        _allreduce(src, dst, np.zeros((2, 1, 4), dtype), flags, 0, 1, 0, 0,
                   np.empty(BLOCK, dtype), 0.0, 0.0, 0, False)
        _allreduce_single(src, dst, flags, 0, 1, 0, 0, np.empty(BLOCK, dtype),
                          np.empty(1, dtype), 1, np.zeros(4, np.int64), 0.0, 0.0, 0, True, False)
    _ready.add((dtype, readonly))
