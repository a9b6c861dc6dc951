"""Persistent collectives, as MPI-4's ``MPI_Allreduce_init``: plan once, then only communicate.

    h = mpicoll.allreduce_init(sendbuf, recvbuf, op=MPI.SUM, algorithm="auto", comm=comm)
    for step in range(steps):
        ...                  # write sendbuf
        h()                  # run it now; or h.start() ... h.wait()  -- recvbuf holds the result

The ``*_init`` call is collective and takes the arguments of the plain call. It makes the plain
call's plan (``mpicoll.plan``: the checks, the ``validate=True`` agreement, ``auto``'s choice,
the options, the executor) and binds it once to the buffers (``plan.Prepared.bind``): the
schedule, its own scratch, the compiled executor's arguments (``compiled.Bound``) -- or the MPI
library's persistent request (``MPI_Allreduce_init`` ...), or the shared-memory runner. A run
then copies the input in (out of place; the compiled executor reads it where no step wrote yet
instead, ``Schedule.first_touch``), runs the transfers and reductions, copies the output out
(reduce-scatter), and adds to the byte counters: no allocation, no lookup.

``h()`` runs the collective on the calling thread. ``h.start()`` returns at once: the same run
goes to the progress engine (``executors.progress``: its thread where the MPI library gives
``MPI_THREAD_MULTIPLE``, else the caller's ``test``/``wait``), and ``h.wait()`` completes it,
so a rank may start a handle, then send to a rank that receives before it starts its own. As
with MPI's persistent requests, every rank must start the same handles in the same order, and
the buffers must stay the ones given: write into them, or move the handle to others of the same
dtype and size with ``h.rebind(sendbuf, recvbuf)`` (every rank alike). ``timeout``,
``on_timeout`` and ``validate`` are fixed at init; a timeout covers each run separately.
"""

from __future__ import annotations

from mpi4py import MPI

from . import buffers, plan
from ._runtime.call import Call
from .executors.progress import finish_deferred
from .prepared import renewed
from .reproducible.forms import dispatch

__all__ = ["Persistent", "bind", "allreduce_init", "reduce_scatter_block_init", "allgather_init",
           "bcast_init"]


class Persistent:
    """One collective bound to its buffers (``plan.Prepared.bind``): ``h()`` runs it;
    ``start()``, ``test()``, ``wait()`` run it in the progress engine; ``rebind()`` moves it to
    other buffers; ``free()`` drops it. Each is the prepared call's own (``run_bound``,
    ``start``, ``wait``, ``rebind``, ``free``); the handle adds the checks of its state.

    ``result`` is the output array (``recvbuf``, or ``buf`` for bcast); ``plan`` the plan."""

    __slots__ = ("result", "collective", "plan", "_call", "_state", "_prepared", "_active",
                 "_freed")

    def __init__(self, call: Call, prepared):
        self.result, self.collective = prepared.layout.result, call.collective
        self.plan, self._prepared = prepared.plan, prepared
        self._call, self._state = call, call.open()
        self._active = self._freed = False

    def __call__(self):
        """Run the collective once, now; returns ``result``."""
        if self._active or self._freed or self._state.broken:
            self._usable()
        finish_deferred(self._state)    # (they share its scratch and window)
        self._prepared.run_bound(self._call)
        return self.result

    def start(self) -> None:
        """Start the collective and return at once (see the module's doc)."""
        self._usable()
        renewed(self._call)
        self._prepared.start(self._call)
        self._active = True

    def test(self) -> bool:
        """Whether the collective started is done (moves it on where the caller progresses)."""
        if not self._active:
            return True
        done = self._prepared.held.test()
        if done:
            self._active = False
        return done

    def wait(self):
        """Complete the collective started by ``start()``; returns ``result`` (at once if none
        is active, as for MPI's inactive persistent requests)."""
        if not self._active:
            return self.result
        self._active = False
        return self._prepared.wait()

    def when_done(self, fn) -> None:
        """Call ``fn(error)`` once, when the collective started by ``start()`` completes or
        fails (``progress.Request.when_done``: from the thread that finishes it)."""
        self._prepared.held.when_done(fn)

    def release(self) -> None:
        """Return once the progress thread holds no reference to the finished collective
        (``progress.Request.release``)."""
        if self._prepared.held is not None:
            self._prepared.held.release()

    def rebind(self, sendbuf, recvbuf=None) -> "Persistent":
        """Run on other buffers from now on (the ``*_init`` call's arguments; bcast: the new
        ``buf``), of the dtype, size and in-place-ness of the bound ones; returns self. Every
        rank rebinds its handle alike, between runs (``Prepared.rebind``)."""
        self._usable()
        self.result = self._prepared.rebind(sendbuf, recvbuf).layout.result
        return self

    def free(self) -> None:
        """Drop the handle (MPI's persistent request with ``algorithm="mpi"``); it can't run
        again."""
        if self._active:
            raise RuntimeError(f"persistent {self.collective}: free() while started; wait() "
                               "first")
        self._prepared.free()
        self._freed = True

    def _usable(self) -> None:
        if self._freed:
            raise RuntimeError(f"persistent {self.collective}: the handle was freed")
        if self._active:
            raise RuntimeError(f"persistent {self.collective}: start() called again before "
                               "wait()")
        if self._state.broken:
            self._state.check(self.collective)

    def __repr__(self) -> str:
        return f"<persistent {self.plan.describe()} on {self.result.size} elements>"


def bind(call: Call, p, layout) -> Persistent:
    """A persistent handle running ``p`` on ``layout``: prepared, agreed, bound."""
    prepared = plan.prepare(call, p)
    p.agree(call)           # first: the tag the bound run keeps carries the arguments' hash
    return Persistent(call, prepared.bind(call, layout))


def allreduce_init(sendbuf, recvbuf=None, *, op=MPI.SUM, algorithm="auto", comm=None,
                   inner: str | None = None, outer: str | None = None,
                   order: str | None = None, timeout=None, on_timeout=None,
                   validate=None, reproducible=False) -> Persistent:
    """A persistent ``allreduce`` (the arguments of ``mpicoll.allreduce``); collective.
    ``reproducible=True`` (or K): the blocking call's bits (``mpicoll.reproducible.Job``)."""
    if reproducible is not False:
        return dispatch("persistent", "allreduce", reproducible, sendbuf, recvbuf, op=op,
                        algorithm=algorithm, comm=comm,
                        given={"inner": inner, "outer": outer, "order": order},
                        timeout=timeout, on_timeout=on_timeout, validate=validate,
                        handle=_job_handle)
    with Call("allreduce", algorithm, comm, timeout, on_timeout, validate) as call:
        layout = buffers.allreduce(sendbuf, recvbuf)
        p = plan.make(call, "allreduce", algorithm, layout, op=op, form="persistent",
                      given={"inner": inner, "outer": outer, "order": order})
        return bind(call, p, layout)


def _job_handle(call, job) -> Persistent:
    """``reproducible=True`` or K: a handle whose run is a ``mpicoll.reproducible.Job``'s."""
    return Persistent(call, job)


def reduce_scatter_block_init(sendbuf, recvbuf=None, *, op=MPI.SUM, algorithm="auto",
                              comm=None, timeout=None, on_timeout=None,
                              validate=None, reproducible=False) -> Persistent:
    """A persistent ``reduce_scatter_block``; collective. ``reproducible``: as
    ``allreduce_init``'s."""
    if reproducible is not False:
        return dispatch("persistent", "reduce_scatter_block", reproducible, sendbuf, recvbuf,
                        op=op, algorithm=algorithm, comm=comm, timeout=timeout,
                        on_timeout=on_timeout, validate=validate, handle=_job_handle)
    with Call("reduce_scatter_block", algorithm, comm, timeout, on_timeout, validate) as call:
        layout = buffers.reduce_scatter_block(sendbuf, recvbuf, call.comm.Get_size(),
                                              call.comm.Get_rank())
        p = plan.make(call, "reduce_scatter_block", algorithm, layout, op=op, form="persistent")
        return bind(call, p, layout)


def allgather_init(sendbuf, recvbuf=None, *, algorithm="auto", comm=None, timeout=None,
                   on_timeout=None, validate=None) -> Persistent:
    """A persistent ``allgather``; collective."""
    with Call("allgather", algorithm, comm, timeout, on_timeout, validate) as call:
        layout = buffers.allgather(sendbuf, recvbuf, call.comm.Get_size(), call.comm.Get_rank())
        p = plan.make(call, "allgather", algorithm, layout, form="persistent")
        return bind(call, p, layout)


def bcast_init(buf, root=0, *, algorithm="auto", comm=None, timeout=None, on_timeout=None,
               validate=None) -> Persistent:
    """A persistent ``bcast`` of ``buf`` from ``root``; collective."""
    with Call("bcast", algorithm, comm, timeout, on_timeout, validate) as call:
        layout = buffers.bcast(buf)
        p = plan.make(call, "bcast", algorithm, layout,
                      root=buffers.root(root, call.comm.Get_size()), form="persistent")
        return bind(call, p, layout)
