"""The cache of plain calls: a call that comes again with the same arguments skips its decisions.

A plain call that comes again with the same arguments -- the same communicator, algorithm, op,
dtype, count, in place or not, options, reliability options -- would make the same plan again
(``mpicoll.plan``: the checks of the op and dtype, the settings, ``auto``'s choice, the options,
the schedule, the executor's arguments, the signature hashed into the tag). The first such call
keeps what it prepared as an ``Entry`` in the communicator's state (``CommState``: a
communicator freed, and its handle reused, starts empty), in a least-recently-used table of
``PER_COMM`` entries; its key holds ``_epoch``, which ``settings.reload()`` bumps. A later call
with the same key then does only what depends on the buffers themselves -- exact numpy arrays,
C-contiguous, recvbuf writable, no overlap -- and, when any check fails, takes the full path,
which raises the same error as ever. Then the broken-communicator check, the call number and
tag, the copy and the run; under a deadline, the deadline is a time of ``MPI_Wtime`` and a
``Watch`` is made only if a round outlasts the compiled loop's spin (``compiled.Reusable``).
Kept only for the compiled executor's schedules, for the shared-memory runner (whose
deadline's ``Watch`` is likewise made only if a wait outlasts a spin) and for the MPI library's
own all-reduce (``algorithm="mpi"``, or ``auto``'s choice of it: under a deadline the same two
nonblocking collectives as the full path, the hash check and ``MPI_Iallreduce``), and never
with ``validate`` (which agrees every call): other calls take the full path every time.
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from . import ops, settings
from ._runtime import context
from ._runtime.call import Call, agree_library_hash, disagree, interrupted
from ._runtime.watch import Watch
from .errors import ArgumentMismatch
from .executors import compiled, progress
from .executors.shared import SharedMemory

__all__ = ["PER_COMM", "Entry", "key", "remember", "allreduce", "reduce_scatter_block",
           "allgather", "bcast"]

PER_COMM = 64
_epoch = 0
_OP_KEYS = ops.KEYS
_IN_PLACE = MPI.IN_PLACE            # (a global read: the repeated all-reduce's path)


@settings.on_reload
def _new_epoch() -> None:
    global _epoch
    _epoch += 1


class Entry:
    """A plain call's prepared plan, for a call with the same key (see above)."""

    __slots__ = ("collective", "numbered", "offset", "what", "signature", "timeout",
                 "on_timeout", "run", "internode_bytes", "rank", "block", "shared_memory",
                 "hashed", "agreed", "plan", "sig", "noop", "mpi_op")

    def __init__(self, call: Call, plan, prepared):
        self.collective, self.rank, self.block = call.collective, call.comm.Get_rank(), plan.block
        self.plan = plan
        # the call took a number (and a tag); alone, nothing is sent and nothing to number
        self.numbered = call._state is not None and not call.alone
        self.sig = sig = call.signature     # (the tag: CommState.label, issue #22)
        self.offset = 0 if sig is None else sig.offset
        self.signature = "" if sig is None else sig.text
        self.what = call.watch.what if call.watch is not None else call.collective
        self.timeout, self.on_timeout = call.timeout, call.on_timeout
        self.run, self.internode_bytes = None, 0
        # shm and the node phases in shared memory run by ``shared``, the MPI library's
        # all-reduce by ``library``, not ``__call__``
        self.shared_memory = prepared if isinstance(prepared, SharedMemory) else None
        self.mpi_op = None
        if plan.kind == "library" and self.numbered:       # (alone: the copy, as noop)
            self.mpi_op, self.agreed = ops.MPI_OPS[plan.op], call._agreed_on
        elif self.shared_memory is not None:
            self.hashed, self.agreed = sig.hashed, call._agreed_on
        elif prepared is not None:
            _, sched, internode, op, scratch = prepared
            st = call.open()
            self.run = compiled.Reusable(sched, plan.dtype, st.comm, op=op, scratch=scratch,
                                         traffic=st.traffic)
            self.internode_bytes = internode * plan.dtype.itemsize
        # alone on the communicator: the copies are the whole call
        self.noop = self.run is None and self.shared_memory is None and not self.numbered

    @context.exclusive                      # one thread at a time (issue #22)
    def __call__(self, st, buf: np.ndarray, src: np.ndarray | None = None,
                 kept: tuple | None = None) -> None:
        """Run on ``buf`` as a new call on ``st``: the input copied in already, or (out of
        place, ``self.run`` set) read from ``src`` (flat) where no step wrote yet
        (``compiled.Reusable.run``; ``kept``: the part of ``buf`` the call keeps)."""
        if st.broken:
            st.check(self.collective)
        number = st.next_number() if self.numbered else 0
        tag = st.label(number, self.sig) if self.numbered else 0
        run = self.run
        if run is None:
            return
        flat = buf.reshape(-1)
        watch = None
        try:
            if self.timeout is None:
                run.run(flat, tag, None, None, src, kept)
            else:
                def make_watch(left: float) -> Watch:
                    nonlocal watch
                    watch = self._watch(st, number, left, tag)
                    return watch
                run.run(flat, tag, self.timeout, make_watch, src, kept)
        except BaseException as exc:
            error = interrupted(st, watch, self.on_timeout, st.parent, exc, self.what)
            if error is exc:
                raise
            raise error from exc
        if self.internode_bytes:
            st.traffic["internode_bytes"] += self.internode_bytes

    @context.exclusive                      # one thread at a time (issue #22)
    def shared(self, st, src: np.ndarray, dst: np.ndarray) -> None:
        """Run the shared-memory runner from ``src`` (flat; may be ``dst``) into ``dst`` as a
        new call on ``st``."""
        if st.broken:
            st.check(self.collective)
        number = st.next_number() if self.numbered else 0
        tag = st.label(number, self.sig) if self.numbered else 0
        start, watch = time.monotonic(), None

        def get_watch():                # made when first needed, with the call's deadline
            nonlocal watch
            if watch is None and self.timeout is not None:
                watch = self._watch(st, number, start + self.timeout - time.monotonic(), tag)
            return watch

        def mismatch():
            disagree(st.comm, self.collective, self.agreed, self.timeout is not None,
                     get_watch(), "the argument check of the shared-memory all-reduce (the "
                     "ranks' hashes differ)")
        try:
            self.shared_memory.run(src, dst, tag, get_watch, self.hashed, mismatch)
        except BaseException as exc:
            error = interrupted(st, watch, self.on_timeout, st.parent, exc, self.what)
            if error is exc:
                raise
            raise error from exc

    @context.exclusive                      # one thread at a time (issue #22)
    def library(self, st, sendbuf, recvbuf) -> None:
        """The MPI library's all-reduce from ``sendbuf`` (or ``MPI.IN_PLACE``) into
        ``recvbuf`` as a new call on ``st``: what the full path runs (``Call.agree``'s hash
        check under a deadline, then ``Call.mpi``), without its decisions."""
        if st.broken:
            st.check(self.collective)
        number = st.next_number()
        before = st.history, st.before, st.last
        tag = st.label(number, self.sig)
        comm = st.comm
        if self.timeout is None:
            comm.Allreduce(sendbuf, recvbuf, op=self.mpi_op)
            return
        watch = self._watch(st, number, self.timeout, tag)
        try:
            try:
                agree_library_hash(comm, self.collective, self.agreed, self.sig.hashed, before,
                                   watch)
            except ArgumentMismatch:
                if not st.broken:           # before any transfer: as if not called (Call's)
                    st.history, st.before, st.last = before
                raise
            watch.wait([comm.Iallreduce(sendbuf, recvbuf, op=self.mpi_op)], "MPI_Iallreduce")
        except BaseException as exc:
            error = interrupted(st, watch, self.on_timeout, st.parent, exc, self.what)
            if error is exc:
                raise
            raise error from exc

    def _watch(self, st, number: int, left: float, tag: int) -> Watch:
        """The deadline of call ``number``, ``left`` seconds from now, as the full path's."""
        watch = Watch(self.timeout, self.what, st.comm)
        watch.deadline = time.monotonic() + left
        watch.tag, watch.number, watch.calls = tag, number, st.tags.calls
        watch.signature = self.signature
        st.mark(watch)
        return watch


def remember(call: Call, key, plan, prepared) -> None:
    """Keep ``call``'s plan (done) for calls with ``key`` (None: not kept). Of the MPI
    library's own collectives only all-reduce is kept: the prepared forms of the others run
    schedules only (``reduce_scatter_block`` ... below)."""
    if key is None or call.validate:
        return
    if plan.kind == "library" and plan.collective != "allreduce":
        return
    if prepared is not None and not isinstance(prepared, SharedMemory) \
            and prepared[0] is not compiled.execute:
        return
    st = context.attach(call.comm)
    table = st.cached
    entry = table[key] = Entry(call, plan, prepared)
    st.last_cached = key, entry
    if len(table) > PER_COMM:
        table.popitem(last=False)


_last = (None, None)        # the communicator _entry last found a state of, and that state


def _entry(comm, key):
    """The entry of ``key`` on ``comm``, or None (the full path; also while any request is in
    flight). The table is a
    least-recently-used one: a hit moves its entry last, unless it is the last one already.
    The communicator's state is remembered for the next call on the same communicator object
    (one pair, replaced whole: thread-safe), until it is freed."""
    global _last
    if progress.busy():         # a request in flight may share the scratch or the window:
        return None, None       # the full path completes the deferred ones first
    if comm is None:
        comm = MPI.COMM_WORLD
    last = _last
    if comm is last[0] and not last[1].freed:
        st = last[1]
    else:
        if not isinstance(comm, MPI.Intracomm):
            return None, None
        try:
            st = context.known(comm)
        except MPI.Exception:           # a freed communicator: the full path names it
            return None, None
        if st is None:
            return None, None
        _last = comm, st
    last = st.last_cached                 # (key, entry), replaced whole: thread-safe
    if key == last[0]:
        return st, last[1]
    entry = st.cached.get(key)
    if entry is not None:
        try:
            st.cached.move_to_end(key)
        except KeyError:                    # another thread dropped it meanwhile
            pass
        st.last_cached = key, entry
    return st, entry


def key(collective: str, sendbuf, recvbuf, op, algorithm, options: tuple, timeout, on_timeout,
        validate):
    """The key of a call's plan, or None (not one the cache serves): exact numpy arrays
    (sendbuf may be IN_PLACE; allreduce's recvbuf None), a predefined op (``""``: the
    collective has none), options and reliability options of the types that are valid (so
    that ``True == 1`` or ``np.int64(5) == 5`` cannot pass for another)."""
    if type(recvbuf) is np.ndarray:
        rtype, rsize = recvbuf.dtype, recvbuf.size
    elif recvbuf is None and collective == "allreduce":
        rtype = rsize = None
    else:
        return None
    if type(sendbuf) is np.ndarray:
        stype, ssize = sendbuf.dtype, sendbuf.size
    elif sendbuf is MPI.IN_PLACE and recvbuf is not None:
        stype = ssize = None
    else:
        return None
    opkey = op if type(op) is str else _OP_KEYS.get(id(op))     # ops.key, inlined
    if opkey is None:
        return None
    k = (collective, _epoch, algorithm, opkey, stype, ssize, rtype, rsize, options)
    if timeout is None and on_timeout is None and validate is None:
        return k
    if (timeout is not None and type(timeout) is not float and type(timeout) is not int) or \
            (validate is not None and type(validate) is not bool):
        return None
    return k + (timeout, on_timeout, validate)


def _checked(sendbuf, recvbuf):
    """The checks of ``buffers.pair`` that depend on the buffers themselves, for a call whose
    key matched (dtypes and sizes are in the key): True when they pass, else False (the full
    path then raises the error)."""
    flags = recvbuf.flags
    if not flags.carray:                # C-contiguous, writeable (and aligned)
        return False
    if sendbuf is MPI.IN_PLACE:
        return True
    sflags = sendbuf.flags
    # two arrays that own their memory are two allocations: they can't overlap
    return sflags.c_contiguous and (flags.owndata and sflags.owndata and sendbuf is not recvbuf
                                    or not np.may_share_memory(sendbuf, recvbuf))


def allreduce(sendbuf, recvbuf, op, algorithm, options: tuple, timeout, on_timeout, validate,
              comm):
    """``allreduce`` by its cached plan, or None (the full path: not a call the cache serves,
    no entry, or a check of the buffers fails, which the full path reports). The loop's case
    -- numpy arrays, no reliability option, the communicator and key of the last call, nothing
    in flight (unless alone on the communicator, where the copy is the call) -- compares the key with the last one's here (``key`` and ``_entry``, inlined:
    0.25 us of a 1.0 us call at N = 1, jobs/experiments/call_overhead.py)."""
    entry = None
    if type(recvbuf) is np.ndarray and type(sendbuf) is np.ndarray and timeout is None and \
            on_timeout is None and validate is None:
        known, st = _last
        if st is not None and (comm is known or comm is None and known is MPI.COMM_WORLD) \
                and not st.freed:
            k, entry = st.last_cached
            if k != ("allreduce", _epoch, algorithm, _OP_KEYS.get(id(op)), sendbuf.dtype,
                     sendbuf.size, recvbuf.dtype, recvbuf.size, options) or \
                    not entry.noop and progress.busy():     # (alone: nothing shared)
                entry = None
    if entry is None:
        k = key("allreduce", sendbuf, recvbuf, op, algorithm, options, timeout, on_timeout,
                validate)
        st, entry = (None, None) if k is None else _entry(comm, k)
        if entry is None:
            return None
    if recvbuf is None:
        if not sendbuf.flags.c_contiguous:
            return None
        recvbuf = np.empty(sendbuf.shape, sendbuf.dtype)
    else:                               # ``_checked``, inlined
        flags = recvbuf.flags
        if not flags.carray:            # C-contiguous, writeable (and aligned)
            return None
        if sendbuf is not _IN_PLACE:
            sflags = sendbuf.flags      # two arrays that own their memory can't overlap
            if not (sflags.c_contiguous and (flags.owndata and sflags.owndata and sendbuf is
                    not recvbuf or not np.may_share_memory(sendbuf, recvbuf))):
                return None
    if entry.noop and sendbuf is not _IN_PLACE:     # alone: the copy is the whole call
        try:            # (the same size: shapes that broadcast keep the order; no compare)
            recvbuf[...] = sendbuf
        except ValueError:
            np.copyto(recvbuf.reshape(-1), sendbuf.reshape(-1))
        return recvbuf
    if entry.mpi_op is not None:            # the MPI library's: it reads sendbuf itself
        entry.library(st, sendbuf, recvbuf)
        return recvbuf
    if entry.shared_memory is not None:     # it reads sendbuf itself
        src = recvbuf if sendbuf is _IN_PLACE else sendbuf
        entry.shared(st, src if src.ndim == 1 else src.reshape(-1),
                     recvbuf if recvbuf.ndim == 1 else recvbuf.reshape(-1))
        return recvbuf
    if sendbuf is not _IN_PLACE:
        if entry.run is not None:   # the loop reads sendbuf where no step wrote yet
            entry(st, recvbuf, sendbuf if sendbuf.ndim == 1 else sendbuf.reshape(-1))
            return recvbuf
        if recvbuf.shape == sendbuf.shape:
            recvbuf[...] = sendbuf
        else:                       # same element count, any shape: the flat views
            np.copyto(recvbuf.reshape(-1), sendbuf.reshape(-1))
    if not entry.noop:
        entry(st, recvbuf)
    return recvbuf


def reduce_scatter_block(k, sendbuf, recvbuf, comm):
    """``reduce_scatter_block`` by its cached plan, or None."""
    st, entry = _entry(comm, k)
    if entry is None or not _checked(sendbuf, recvbuf):
        return None
    n, rank = entry.block, entry.rank
    source = (recvbuf if sendbuf is MPI.IN_PLACE else sendbuf).reshape(-1)
    if entry.run is None:
        work = source.copy()
        entry(st, work)
    else:                           # the loop reads the input where no step wrote yet
        work = np.empty(source.size, source.dtype)
        entry(st, work, source, (rank * n, (rank + 1) * n))
    np.copyto(recvbuf.reshape(-1)[:n], work[rank * n:(rank + 1) * n])
    return recvbuf


def allgather(k, sendbuf, recvbuf, comm):
    """``allgather`` by its cached plan, or None."""
    st, entry = _entry(comm, k)
    if entry is None or not _checked(sendbuf, recvbuf):
        return None
    n, rank = entry.block, entry.rank
    flat = recvbuf.reshape(-1)
    if sendbuf is not MPI.IN_PLACE:
        np.copyto(flat[rank * n:(rank + 1) * n], sendbuf.reshape(-1))
    entry(st, flat)
    return recvbuf


def bcast(k, buf, comm):
    """``bcast`` by its cached plan, or None."""
    st, entry = _entry(comm, k)
    if entry is None or not _checked(MPI.IN_PLACE, buf):
        return None
    entry(st, buf)
    return buf
