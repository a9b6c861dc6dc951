"""The cache of plain calls: a call that comes again with the same arguments skips its decisions.

The first plain call with a key -- the communicator, algorithm, op, dtype, count, in place or
not, options, reliability options (``key``) -- keeps its prepared call (``plan.Prepared``) in
the communicator's state (``CommState``: a communicator freed, and its handle reused, starts
empty), in a least-recently-used table of ``PER_COMM`` entries; the key holds ``_epoch``, which
``settings.reload()`` bumps. A later call with the key does only what depends on the buffers
themselves -- exact numpy arrays, C-contiguous, recvbuf writable, no overlap; when a check
fails, the full path raises the error -- and runs the prepared call again on them
(``Prepared.again``: a new call number and tag, the run, one failure handling). Never with
``validate`` (which agrees every call), nor where ``Prepared.keep`` says no.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from . import ops, settings
from ._runtime import context
from ._runtime.call import Call
from .executors import progress

__all__ = ["PER_COMM", "key", "remember", "allreduce", "reduce_scatter_block",
           "allgather", "bcast"]

PER_COMM = 64
_epoch = 0
_OP_KEYS = ops.KEYS
_IN_PLACE = MPI.IN_PLACE            # (global reads: the repeated all-reduce's path)
_ndarray = np.ndarray


@settings.on_reload
def _new_epoch() -> None:
    global _epoch
    _epoch += 1


def remember(call: Call, key, prepared) -> None:
    """Keep ``call``'s prepared call (``plan.Prepared``, run and done) for calls with ``key``
    (None: not kept; nor where it can't be run again: ``Prepared.keep``)."""
    if key is None or call.validate or not prepared.keep(call):
        return
    st = context.attach(call.comm)
    table = st.cached
    table[key] = prepared
    st.remember_cached(key, prepared)
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
        st.remember_cached(key, entry)
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


_served = (None,) * 11      # the last all-reduce the cache ran: its arguments, state and entry


def allreduce(sendbuf, recvbuf, op, algorithm, options: tuple, timeout, on_timeout, validate,
              comm):
    """``allreduce`` by its cached plan, or None (the full path: not a call the cache serves,
    no entry, or a check of the buffers fails, which the full path reports). The loop's case
    -- numpy arrays (recvbuf may be None), no reliability option, the arguments of the last
    all-reduce the cache ran (the same communicator, op and algorithm objects, options, dtypes
    and sizes: ``_served``),
    nothing in flight (unless alone on the communicator, where the copy is the call) -- takes
    that call's entry without making its key (``key`` and ``_entry``: 0.25 us of a 1.0 us call
    at N = 1, jobs/experiments/call_overhead.py)."""
    entry = None
    loop = type(sendbuf) is _ndarray and (type(recvbuf) is _ndarray or recvbuf is None) and \
        timeout is None and on_timeout is None and validate is None
    if loop:
        last_comm, st, entry, last_op, last_algorithm, last_options, send_dtype, send_size, \
            recv_dtype, recv_size, epoch = _served
        if not (comm is last_comm and op is last_op and algorithm is last_algorithm and
                sendbuf.dtype is send_dtype and sendbuf.size == send_size and
                (recvbuf is None and recv_dtype is None or recvbuf is not None and
                 recvbuf.dtype is recv_dtype and recvbuf.size == recv_size) and
                options == last_options and epoch == _epoch and not st.freed) or \
                not entry.noop and progress.busy():     # (alone: nothing shared)
            entry = None
    if entry is None:
        k = key("allreduce", sendbuf, recvbuf, op, algorithm, options, timeout, on_timeout,
                validate)
        st, entry = (None, None) if k is None else _entry(comm, k)
        if entry is None:
            return None
        if loop:
            _serve(comm, st, entry, op, algorithm, options, sendbuf, recvbuf)
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
    if entry.noop:                  # alone: the copy is the whole call
        if sendbuf is not _IN_PLACE:
            try:        # (the same size: shapes that broadcast keep the order; no compare)
                recvbuf[...] = sendbuf
            except ValueError:
                np.copyto(recvbuf.reshape(-1), sendbuf.reshape(-1))
        return recvbuf
    entry.allreduce(st, sendbuf, recvbuf)
    return recvbuf


def _serve(comm, st, entry, op, algorithm, options, sendbuf, recvbuf) -> None:
    """Remember the all-reduce ``entry`` serves now, for the next one (``allreduce``)."""
    global _served
    _served = (comm, st, entry, op, algorithm, options, sendbuf.dtype, sendbuf.size,
               None if recvbuf is None else recvbuf.dtype,
               None if recvbuf is None else recvbuf.size, _epoch)


def reduce_scatter_block(k, sendbuf, recvbuf, comm):
    """``reduce_scatter_block`` by its cached plan, or None."""
    st, entry = _entry(comm, k)
    if entry is None or not _checked(sendbuf, recvbuf):
        return None
    n, rank = entry.block, entry.rank
    source = (recvbuf if sendbuf is MPI.IN_PLACE else sendbuf).reshape(-1)
    if entry.reads_input:           # the loop reads the input where no step wrote yet
        work = np.empty(source.size, source.dtype)
        entry.again(st, work, source, (rank * n, (rank + 1) * n))
    else:
        work = source.copy()
        entry.again(st, work)
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
    entry.again(st, flat)
    return recvbuf


def bcast(k, buf, comm):
    """``bcast`` by its cached plan, or None."""
    st, entry = _entry(comm, k)
    if entry is None or not _checked(MPI.IN_PLACE, buf):
        return None
    entry.again(st, buf)
    return buf
