"""Persistent collectives, as MPI-4's ``MPI_Allreduce_init``: decide once, then only communicate.

    h = mpicoll.allreduce_init(sendbuf, recvbuf, op=MPI.SUM, algorithm="auto", comm=comm)
    for step in range(steps):
        ...                  # write sendbuf
        h()                  # or h.start(); h.wait()  -- recvbuf holds the result

The ``*_init`` call is collective and takes the arguments of the plain call. It does, once,
everything the plain call does before communicating: the argument checks (and the
``validate=True`` agreement), mpicoll's duplicate of the communicator and the call's tag, the
algorithm choice (``auto``), the schedule, the scratch buffer, and the compiled executor's
arguments (``executors.compiled.Bound``) -- or, for the MPI library's own algorithm (``mpi``),
the library's persistent request (``MPI_Allreduce_init`` ...). A call then copies the input in
(out of place), runs the transfers and reductions, copies the output out (reduce-scatter), and
adds to the byte counters: no allocation, no lookup.

As with MPI's persistent requests, every rank must start the same handles in the same order,
and the buffers must stay the ones given (write into them, don't rebind them). ``start()`` runs
the whole collective before it returns (there is no progress engine to run it in the
background); ``wait()`` then returns the result at once. ``timeout``, ``on_timeout`` and
``validate`` are fixed at init; a timeout covers each call separately.
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from . import api, kernels, select
from .algorithms import allreduce_shm
from ._runtime.call import Call
from .errors import ArgumentMismatch, CollectiveTimeout
from .executors import compiled
from .registry import lookup

__all__ = ["Persistent", "allreduce_init", "reduce_scatter_block_init", "allgather_init",
           "bcast_init"]


class Persistent:
    """One collective bound to its buffers; call it (or ``start()`` then ``wait()``) to run it.

    ``result`` is the output array (``recvbuf``, or ``buf`` for bcast)."""

    __slots__ = ("result", "collective", "_call", "_state", "_before", "_run", "_after",
                 "_request", "_active")

    def __init__(self, call: Call, result: np.ndarray, *, before=(), run=None, after=(),
                 request=None):
        self.result, self.collective = result, call.collective
        self._call, self._state = call, call.open()
        self._before, self._run, self._after = tuple(before), run, tuple(after)
        self._request, self._active = request, False

    def __call__(self) -> np.ndarray:
        """Run the collective once; returns ``result``."""
        if self._state.broken:
            self._state.check(self.collective)
        for dst, src in self._before:
            np.copyto(dst, src)
        if self._call.watch is not None:
            self._watched()
        elif self._request is not None:
            self._request.Start()
            self._request.Wait()
        elif self._run is not None:
            self._run(None)
        for dst, src in self._after:
            np.copyto(dst, src)
        return self.result

    def start(self) -> None:
        """Start the collective (here: run it to completion; see the module's doc)."""
        if self._active:
            raise RuntimeError(f"persistent {self.collective}: start() called again before "
                               "wait()")
        self()
        self._active = True

    def wait(self) -> np.ndarray:
        """Complete the collective started by ``start()``; returns ``result``."""
        self._active = False
        return self.result

    def _watched(self) -> None:
        """One call under a fresh deadline; a timeout marks the communicator broken (and aborts
        with ``on_timeout="abort"``), as a plain call does."""
        call, watch = self._call, self._call.watch
        watch.deadline = time.monotonic() + call.timeout    # the init's Watch, a new deadline
        try:
            if self._request is not None:
                self._request.Start()
                watch.wait([self._request], "MPI_" + self.collective.capitalize() + "_init")
            elif self._run is not None:
                self._run(watch)
        except (CollectiveTimeout, ArgumentMismatch, KeyboardInterrupt) as exc:
            call._failed(exc)       # ArgumentMismatch: only the roll call's can come from here
            raise

    def __repr__(self) -> str:
        return f"<persistent {self.collective} on {self.result.size} elements>"


def _runner(call: Call, algo, flat: np.ndarray, op: str | None, options: dict):
    """``run(watch)``: the schedule of ``algo`` on ``flat``, bound once to everything it uses
    (``op=None``: nothing is reduced)."""
    op = op or kernels.ops_for(flat.dtype)[0]
    st = call.open()
    sched, internode, _, _ = api._scheduled(call, algo, flat.size, options)
    execute = api._execute or api._choose_executor()
    scratch = np.empty(compiled.scratch_elements(execute, sched, flat.itemsize), flat.dtype)
    traffic, internode_bytes = st.traffic, internode * flat.itemsize
    if execute is compiled.execute:
        bound = compiled.Bound(sched, flat, st.comm, op=op, tag=call.tag, scratch=scratch,
                               traffic=traffic).run

        def run(watch):
            bound(watch)
            traffic["internode_bytes"] += internode_bytes
        return run

    def run(watch):
        execute(sched, flat, st.comm, op=op, tag=call.tag, scratch=scratch, traffic=traffic,
                watch=watch)
        traffic["internode_bytes"] += internode_bytes
    return run


def allreduce_init(sendbuf, recvbuf=None, *, op=MPI.SUM, algorithm="auto", comm=None,
                   inner: str | None = None, outer: str | None = None,
                   order: str | None = None, timeout=None, on_timeout=None,
                   validate=None) -> Persistent:
    """A persistent ``allreduce`` (the arguments of ``mpicoll.allreduce``); collective."""
    with Call("allreduce", algorithm, comm, timeout, on_timeout, validate) as call:
        opname = api._op_name(op)
        algo = api._algorithm("allreduce", algorithm)
        comm = call.comm
        send, recv = api._buffers(sendbuf, recvbuf, lambda n: n, lambda s: s.shape)
        given = {"inner": inner, "outer": outer, "order": order}
        auto = algo is None
        if auto and (inner or outer or order):
            raise ValueError("inner/outer/order apply only to an algorithm that declares them, "
                             "not to 'auto'")
        size, count = comm.Get_size(), recv.size
        api._check_op(call.collective, opname, recv.dtype, algo)
        api._local_checks(algo, opname, given)
        if algo is None:
            algo = api._unless_library_lacks("allreduce", lookup("allreduce", select.allreduce(
                recv.nbytes, size, count, call.open().ranks_per_node if size > 1 else None,
                shared_memory=size > 1 and api._shared_memory(call, opname, recv.dtype),
                single_copy=allreduce_shm.single_copy_expected(size))),
                recv.dtype, opname, recv.nbytes, size, count)
        options = api._options(call, algo, given, auto)
        node_phases = options.get("inner") == "shm"         # hierarchical's, in shared memory
        shared = api._prepare(call, algo, count, recv.dtype, opname, options) \
            if algo.has("shared-memory") or node_phases else None  # checked before agreeing
        call.agree(algo.name, op=opname, dtype=recv.dtype, count=count,
                   inner=options.get("inner"), outer=options.get("outer"),
                   order=options.get("order"), nodes=api._nodes(call, algo))
        st = call.open()
        if algo.library:
            request = st.comm.Allreduce_init(MPI.IN_PLACE if send is None else send, recv,
                                             op=api._OPS[opname])
            return Persistent(call, recv, request=request)
        if algo.has("shared-memory") or node_phases:    # from sendbuf (or recvbuf) to recvbuf
            src, dst = (recv if send is None else send).reshape(-1), recv.reshape(-1)
            if shared is None:              # one rank, or nothing to reduce
                return Persistent(call, recv, before=() if send is None else ((dst, src),))
            signed = api._shm_signature(call)
            return Persistent(call, recv, run=lambda watch: shared.run(
                src, dst, call.tag, watch, *signed))
        before = () if send is None else ((recv, send.reshape(recv.shape)),)
        run = _runner(call, algo, recv.reshape(-1), opname, options) \
            if size > 1 and count > 0 else None
        return Persistent(call, recv, before=before, run=run)


def reduce_scatter_block_init(sendbuf, recvbuf=None, *, op=MPI.SUM, algorithm="auto",
                              comm=None, timeout=None, on_timeout=None,
                              validate=None) -> Persistent:
    """A persistent ``reduce_scatter_block``; collective."""
    with Call("reduce_scatter_block", algorithm, comm, timeout, on_timeout, validate) as call:
        opname = api._op_name(op)
        algo = api._algorithm("reduce_scatter_block", algorithm)
        comm = call.comm
        size, rank = comm.Get_size(), comm.Get_rank()
        send, recv, total, n = api._reduce_scatter_buffers(sendbuf, recvbuf, size)
        api._check_op(call.collective, opname, recv.dtype, algo)
        api._local_checks(algo, opname, {})
        if algo is None:
            algo = api._unless_library_lacks("reduce_scatter_block", lookup(
                "reduce_scatter_block", select.reduce_scatter_block(total * recv.itemsize, size)),
                recv.dtype, opname, total * recv.itemsize, size, total)
        options = api._options(call, algo, {})
        call.agree(algo.name, op=opname, dtype=recv.dtype, count=n)
        st = call.open()
        if algo.library:
            request = st.comm.Reduce_scatter_block_init(
                MPI.IN_PLACE if send is None else send, recv, op=api._OPS[opname])
            return Persistent(call, recv, request=request)
        out = recv.reshape(-1)
        work = out if send is None else np.empty(total, recv.dtype)
        before = () if send is None else ((work, send.reshape(-1)),)
        after = ((out[:n], work[rank * n:(rank + 1) * n]),)
        run = _runner(call, algo, work, opname, options) if size > 1 and n > 0 else None
        return Persistent(call, recv, before=before, run=run, after=after)


def allgather_init(sendbuf, recvbuf=None, *, algorithm="auto", comm=None, timeout=None,
                   on_timeout=None, validate=None) -> Persistent:
    """A persistent ``allgather``; collective."""
    with Call("allgather", algorithm, comm, timeout, on_timeout, validate) as call:
        algo = api._algorithm("allgather", algorithm)
        comm = call.comm
        size, rank = comm.Get_size(), comm.Get_rank()
        send, recv, n = api._allgather_buffers(sendbuf, recvbuf, size)
        api._local_checks(algo, None, {})
        if algo is None:
            algo = lookup("allgather", select.allgather(recv.nbytes, size))
        options = api._options(call, algo, {})
        call.agree(algo.name, dtype=recv.dtype, count=n)
        st = call.open()
        if algo.library:
            request = st.comm.Allgather_init(      # bfloat16: as uint16
                MPI.IN_PLACE if send is None else kernels.as_storage(send),
                kernels.as_storage(recv))
            return Persistent(call, recv, request=request)
        flat = recv.reshape(-1)
        before = () if send is None else ((flat[rank * n:(rank + 1) * n], send.reshape(-1)),)
        run = _runner(call, algo, flat, None, options) if size > 1 and n > 0 else None
        return Persistent(call, recv, before=before, run=run)


def bcast_init(buf, root=0, *, algorithm="auto", comm=None, timeout=None, on_timeout=None,
               validate=None) -> Persistent:
    """A persistent ``bcast`` of ``buf`` from ``root``; collective."""
    with Call("bcast", algorithm, comm, timeout, on_timeout, validate) as call:
        algo = api._algorithm("bcast", algorithm)
        comm = call.comm
        buf = api._array(buf, "buf", writable=True)
        size = comm.Get_size()
        root = api._root(root, size)
        api._local_checks(algo, None, {})
        if algo is None:
            algo = lookup("bcast", select.bcast(buf.nbytes, size))
        options = {**api._options(call, algo, {}), "root": root}
        call.agree(algo.name, dtype=buf.dtype, count=buf.size, root=root)
        st = call.open()
        if algo.library:
            return Persistent(call, buf, request=st.comm.Bcast_init(kernels.as_storage(buf),
                                                                    root=root))
        run = _runner(call, algo, buf.reshape(-1), None, options) \
            if size > 1 and buf.size > 0 else None
        return Persistent(call, buf, run=run)
