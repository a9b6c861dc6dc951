"""The all-reduce through the shared window: the Python side of ``kernels.window_copy`` and
``kernels.single_copy`` -- which window, which path, the deadline, the failures.

``window_allreduce`` is what both users call: the ``shm`` algorithm (every rank of the communicator
in one window) and ``hierarchical``'s shared-memory node phases (``nodes``: one window per node
of the layout, and ``between``, the inter-node all-reduce of this rank's reduced slice).

Waiting. A rank coming to the call rings the bells of the window (``Window.ring``): a rank
that waited so long that it naps (``window.Patience``) wakes at once, not at its nap's end.

Failures. Every wait returns to Python after SPIN_SECONDS (CROWDED_SPIN_SECONDS when the
node's ranks outnumber the cores: ``mpicoll/idle.py``), then after each nap
(``window.Patience``) while it lasts (``_late``): first the call's
deadline, if any (``Watch.overdue``: past it, or when another rank's roll call has come, the
roll call names the ranks whose flags are missing); then the ranks of the window: one whose
process is gone (``probe.alive``), or that published ``aborted`` (it gave up on the window),
ends the call at once with ``CommunicatorBroken`` -- the communicator is marked broken, so the
next call raises at once too -- and this rank publishes ``aborted`` in turn, so that a rank
waiting on it learns in one spin, deadline or not. A read of another rank's memory that fails
(single copy) ends the call the same way. Any other failure mid-call (a timeout, an
interrupt) also publishes ``aborted``.
"""

from __future__ import annotations

import time

import numpy as np

from ..kernels import as_storage, read_through
from ..errors import ArgumentMismatch, CommunicatorBroken, PeerError
from . import kernels, probe, window as _window
from .kernels import (ABORTED, ARRIVED, BETWEEN, DONE, FLAGS, GATHERED, LINE, MISMATCH,
                      REDUCED, UNREADABLE, slice_of)
from .policy import single_copy_expected

__all__ = ["window_allreduce", "window_for", "window_rank", "SINGLE_COPY_MIN_BYTES", "PIECE_BYTES",
           "WHOLE_MAX_BYTES"]

SINGLE_COPY_MIN_BYTES = 16 << 10    # single copy from this size (when the node allows it)
PIECE_BYTES = 256 << 10     # single copy: scratch for the other ranks' pieces of my slice
WHOLE_MAX_BYTES = 256 << 10     # single copy, 2 ranks: each reduces the whole vector up to this


def window_allreduce(st, src: np.ndarray, dst: np.ndarray, op: str, watch=None, signature: int = 0,
              mismatch=None, *, tag: int = 0, nodes=None, between=None, rows=None) -> None:
    """All-reduce ``src`` (flat; may be ``dst``) into ``dst`` on ``st``'s communicator
    (``policy.check`` passed on every rank). ``watch``: the call's deadline, or a function that
    makes its ``Watch`` (or returns None), called only when one is needed (a prepared call).
    ``signature``: the hash of the call's arguments (``_runtime.tags``), published beside each
    rank's input; when the ranks' differ, nothing is reduced and every rank calls
    ``mismatch()``, which raises. ``tag``: the call's tag, for the messages that make a new
    window (``window.make``).

    Hierarchical's node phases: ``nodes`` a node layout whose every node lies in one real node,
    ``between(part)`` a function that all-reduces ``part`` (of ``dst``'s dtype) in place across
    the nodes (with the same local rank of every node). The window is then the node's, Phases
    1 and 2 a reduce-scatter inside each node, ``between`` the inter-node phase on my slice of
    each chunk, Phase 3 an all-gather inside each node.

    From SINGLE_COPY_MIN_BYTES, where the node lets the ranks read each other's memory
    (``Window.single_copy``), the whole vector goes through ``kernels.single_copy`` instead.

    ``rows(x, stride, out)`` (``mpicoll.reproducible``'s node path; every rank of the
    communicator, a float dtype, no ``nodes``) replaces ``op``: this rank's slice of each chunk
    of the result is ``rows`` of the slice of every rank's input -- ``x[r * stride + i]``,
    rank r's element i, in the window -- into ``out``, written before the slices are copied
    out. Always through the window's segments (the single copy has no whole rows to give)."""
    entry = (kernels.ROWS, 0) if rows is not None else kernels.entry_points(op, dst.dtype)
    user = dst                              # between() gets slices of it: the user's dtype
    src, dst = read_through(as_storage(src)), as_storage(dst)   # half types: their bits
    get_watch = watch if callable(watch) else lambda: watch
    single = dst.nbytes >= SINGLE_COPY_MIN_BYTES and rows is None
    window = window_for(st, 0 if single else dst.nbytes, tag, get_watch, nodes)
    window.ring()                           # a rank napping on this call: I came
    try:
        if single and window.single_copy:
            _single_copy(st, window, src, dst, user, entry, get_watch, signature, mismatch,
                         between)
            return
        if single:
            window = window_for(st, dst.nbytes, tag, get_watch, nodes)
        _window_copy(st, window, src, dst, user, entry, get_watch, signature, mismatch, between,
                     rows)
    except BaseException as exc:
        if not (isinstance(exc, ArgumentMismatch) and not exc.in_flight):
            _abort(window)                  # the call failed mid-way: tell the node
        raise


def _window_copy(st, window, src, dst, user, entry, get_watch, signature, mismatch,
                 between, rows=None) -> None:
    """``window_allreduce`` through the window's segments, chunk by chunk (``rows``: as
    ``window_allreduce``'s, with ``entry`` ``(ROWS, 0)``; ``entry``: ``kernels.entry_points``)."""
    data, acc = window.views(dst.dtype)
    size, chunk, rank = window.size, data.shape[2], window.rank
    nchunks = -(-dst.size // chunk)
    seq0 = window.seq + 1
    window.seq += nchunks
    resume, patience = 0, _window.Patience(window)
    while True:
        resume, waiting = kernels.window_copy(
            src, dst, data, window.flags, rank, seq0, resume, entry[0], acc,
            patience.until(resume), window.yield_after, signature,
            between is not None or rows is not None)
        if resume == DONE:
            break
        if resume == MISMATCH:
            mismatch()
            raise AssertionError("mismatch() must raise")
        if waiting == BETWEEN:              # my slice of chunk k: across the nodes, or rows
            k = resume // 4
            at = k * chunk
            lo, hi = slice_of(min(chunk, dst.size - at), size, rank)
            buf = data[(seq0 + k) % 2]
            if hi > lo and rows is not None:
                # my own input beside the others' (Phase 1 leaves it out), then the rows
                buf[rank, lo:hi] = src[at + lo:at + hi]
                rows(buf.reshape(-1)[lo:], chunk, dst[at + lo:at + hi])
            elif hi > lo:                   # (every node's rank of my index has the same)
                between(user[at + lo:at + hi])
                window.ring()               # (the node may have napped meanwhile)
            buf[rank, lo:hi] = dst[at + lo:at + hi]
            continue
        k, phase = divmod(resume, 4)
        which = ARRIVED if phase == 1 else REDUCED
        patience.late(resume)
        _late(st, window, get_watch, which, seq0 + k, waiting,
              f"chunk {k + 1} of {nchunks}, waiting for "
              f"{'the inputs' if phase == 1 else 'the reduced slices'} in the shared window",
              nchunks)
    st.traffic["shared_bytes"] += (dst.size - _own_elements(dst.size, chunk, size, rank)) * \
        dst.itemsize


def _single_copy(st, window, src, dst, user, entry, get_watch, signature, mismatch,
                 between) -> None:
    """``window_allreduce`` by ``kernels.single_copy``: one sequence number, three flag waits."""
    size, rank = window.size, window.rank
    acc = window.views(dst.dtype)[1]
    scratch, piece = window.scratch(dst.dtype, dst.size, PIECE_BYTES)
    window.seq += 1
    seq, resume, patience = window.seq, 0, _window.Patience(window)
    whole = size == 2 and dst.nbytes <= WHOLE_MAX_BYTES     # if both ranks can (the kernel)
    while True:
        resume, waiting = kernels.single_copy(
            src, dst, window.flags, rank, seq, resume, entry[0], entry[1], acc, scratch, piece,
            window.iov, patience.until(resume), window.yield_after, signature, whole,
            between is not None)
        if resume == DONE:
            whole = waiting == 1
            break
        if resume == MISMATCH:
            mismatch()
            raise AssertionError("mismatch() must raise")
        if resume == UNREADABLE:
            peer, pid = window.members[waiting], window.pid(waiting)
            if not probe.alive(pid):
                _died(st, window, [peer])
            _broken(st, window, f"rank {peer} (pid {pid}) died during the call: reading its "
                    "memory failed" if not probe.alive(pid) else
                    f"reading rank {peer}'s memory (process_vm_readv) failed after it had "
                    "worked when the window was made; set MPICOLL_SHM_SINGLE_COPY=off to "
                    "copy through the window instead")
        if waiting == BETWEEN:              # my reduced slice: all-reduce it across the nodes
            lo, hi = slice_of(dst.size, size, rank)
            if hi > lo:
                between(user[lo:hi])
                window.ring()               # (the node may have napped meanwhile)
            continue
        which = {1: ARRIVED, 3: REDUCED, 4: GATHERED}[resume]
        patience.late(resume)
        what = {ARRIVED: "the inputs' addresses", REDUCED: "the reduced slices",
                GATHERED: "the other ranks to finish reading my buffers"}[which]
        _late(st, window, get_watch, which, seq, waiting,
              f"single copy, waiting for {what} in shared memory", 1)
    mine = dst.size if whole else _slice_elements(dst.size, size, rank)
    st.traffic["shared_bytes"] += ((size - 1) * mine + dst.size - mine) * dst.itemsize


# ----------------------------------------------------------------------------- the window

def window_for(st, nbytes: int, tag: int, get_watch, nodes=None):
    """The communicator's window (``st.shared``; with ``nodes``, this rank's node's,
    ``st.node_shared[nodes]``), made or remade (``window.make``) when it is missing or smaller
    than ``nbytes``' size class -- at the same call on every rank: the ranks pass the same
    count (or their signatures differ, which the make's messages or the flags then show)."""
    old = st.window(nodes)
    if old is not None and (nbytes == 0 or old.capacity >= _window.size_class(nbytes)):
        return old                          # (0: any window; the single copy's flags only)
    capacity = _window.size_class(nbytes)
    if old is not None:                     # local: the others drop theirs at the same call
        old.free()
        st.set_window(nodes, None)
    members = tuple(range(st.comm.Get_size())) if nodes is None else _my_node(st, nodes)
    sharing = next(len(r) for r in st.real_nodes if st.comm.Get_rank() in r)
    wanted = single_copy_expected(max(len(members), sharing))
    made = _window.make(st.comm, members, capacity, tag, wanted, get_watch,
                        _Overdue(st, get_watch, members))
    st.set_window(nodes, made)
    return made


class _Overdue:
    """``window.make``'s ``overdue``: ``_late`` on the window being made."""

    def __init__(self, st, get_watch, members):
        self.st, self.get_watch, self.members = st, get_watch, members

    def __call__(self, window, which: int, seq: int, j: int) -> None:
        step = "making the shared window (every rank maps it)"
        if window is not None:
            _late(self.st, window, self.get_watch, which, seq, j, step, 0)
        elif self.get_watch() is not None:          # not mapped: only the deadline
            self.get_watch().overdue(step, 0, [self.members[j]])


def _my_node(st, nodes) -> tuple:
    """This rank's node of ``nodes`` (its ranks in ``st.comm``, in the layout's order)."""
    rank = st.comm.Get_rank()
    return next(tuple(members) for members in nodes if rank in members)


def window_rank(st, nodes) -> int:
    """This rank's index in its node of ``nodes`` (its rank in that node's window)."""
    return _my_node(st, nodes).index(st.comm.Get_rank())


# ----------------------------------------------------------------------------- failures

def _late(st, window, get_watch, which: int, seq: int, waiting: int, step: str,
          nsteps: int) -> None:
    """A flag wait outlasted its spin: ``watch.overdue`` (raises past the deadline or at a roll
    call), naming in ``st.comm``'s ranks those whose flag ``which`` is short of ``seq``
    (``waiting``, the rank the wait stopped at, if none is any more); then end the call if a
    rank of the window died or gave up without a roll call (``_broken``)."""
    flags = window.flags
    watch = get_watch()
    if watch is not None:
        short = [j for j in range(window.size)
                 if j != window.rank and flags[(FLAGS * j + which) * LINE] < seq] or [waiting]
        watch.overdue(step, nsteps, [window.members[j] for j in short])
    others = [j for j in range(window.size) if j != window.rank]
    gave_up = [j for j in others if flags[FLAGS * j * LINE + ABORTED]]
    for j in others:            # a rank that died without giving up first: every survivor
        pid = window.pid(j)     # names it (one that gave up may have exited since)
        if j not in gave_up and pid and not probe.alive(pid):
            _died(st, window, [window.members[j]])
            _broken(st, window, f"rank {window.members[j]} (pid {pid}) died during the call")
    for j in gave_up:
        _told_first(window, watch)
        _died(st, window, [])           # (a rank died: the one that gave up saw it first)
        _broken(st, window, f"rank {window.members[j]} gave up on the shared window (a "
                "rank died, or its memory could not be read)")


def _told_first(window, watch) -> None:
    """Another rank gave up on the window. Most often a rank's own call failed and it told
    every rank (a notice), which the one that gave up read first: wait up to ``NOTICE_GRACE``
    for that notice and raise its ``PeerError``, as that rank did, rather than
    ``CommunicatorBroken`` (3 ranks: seen 1 run in 5 of the fault matrix's "local error")."""
    if watch is None:
        return
    end = time.monotonic() + NOTICE_GRACE
    while True:
        try:
            watch.heed_notices()
        except PeerError:
            _abort(window)
            raise
        if time.monotonic() >= end:
            return
        time.sleep(0.005)


NOTICE_GRACE = 0.2          # seconds: a notice sent before the window's flag arrives by then


def _died(st, window, ranks) -> None:
    """``ranks`` died (or, with none, some rank may have): end the call with the failure
    detector's ``ProcessFailed``, agreed by the survivors (``_runtime/detector.py``), if it
    knows of a death (it learns ``ranks`` first)."""
    watched = getattr(st, "watched", None)      # (a CommState's; tests pass stand-ins)
    error = None if watched is None else watched.died(ranks, "allreduce shm")
    if error is not None:
        _abort(window)
        raise error


def _broken(st, window, reason: str):
    """End the call: the communicator broken (later calls raise at once), the node told."""
    _abort(window)
    st.mark_broken(f"allreduce shm: {reason}", replace=True)
    raise CommunicatorBroken(f"allreduce shm: {reason}; the communicator is broken: mpicoll "
                             "will not use it again (comm.Dup() on every rank to go on; "
                             "mpicoll.shrink(comm) on every survivor if a rank died)")


def _abort(window) -> None:
    """Publish that this rank gave up on ``window`` (a rank waiting on it stops in one spin)."""
    if window.flags is not None:
        kernels.publish(window.flags, FLAGS * window.rank * LINE + ABORTED, 1)


def _slice_elements(count: int, size: int, rank: int) -> int:
    """Elements of slice ``rank`` of ``count`` cut in ``size`` (``kernels.slice_of``'s, of
    ``block_displs``: count // size, one more if rank < count % size; in Python, as calling
    the compiled one costs more than this costs to run)."""
    return count // size + (rank < count % size)


def _own_elements(count: int, chunk: int, size: int, rank: int) -> int:
    """Elements of my own slices (not copied into the window), over every chunk."""
    full, last = divmod(count, chunk)
    return full * _slice_elements(chunk, size, rank) + _slice_elements(last, size, rank)
