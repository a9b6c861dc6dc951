"""Persistent collectives, as MPI-4's ``MPI_Allreduce_init``: plan once, then only communicate.

    h = mpicoll.allreduce_init(sendbuf, recvbuf, op=MPI.SUM, algorithm="auto", comm=comm)
    for step in range(steps):
        ...                  # write sendbuf
        h()                  # run it now; or h.start() ... h.wait()  -- recvbuf holds the result

The ``*_init`` call is collective and takes the arguments of the plain call. It makes the plain
call's plan (``mpicoll.plan``: the checks, the ``validate=True`` agreement, ``auto``'s choice,
the options, the executor) and binds it once to the buffers (``plan.bind``): the schedule, its
own scratch, the compiled executor's arguments (``executors.compiled.Bound``) -- or the MPI
library's persistent request (``MPI_Allreduce_init`` ...), or the shared-memory runner. A run
then copies the input in (out of place; the compiled executor reads it where no step wrote yet
instead, ``Schedule.first_touch``), runs the transfers and reductions, copies the output out
(reduce-scatter), and adds to the byte counters: no allocation, no lookup.

``h()`` runs the collective on the calling thread. ``h.start()`` returns at once: the same run
goes to the progress engine (``executors.progress``: its thread where the MPI library gives
``MPI_THREAD_MULTIPLE``, else the caller's ``test``/``wait``), and ``h.wait()`` completes it,
so a rank may start a handle, then send to a rank that receives before it starts its own. As
with MPI's persistent requests, every rank must start the same handles in the same order, and
the buffers must stay the ones given (write into them, don't rebind them). ``timeout``,
``on_timeout`` and ``validate`` are fixed at init; a timeout covers each run separately.
"""

from __future__ import annotations

import time

from mpi4py import MPI

from . import buffers, plan
from ._runtime.call import Call, interrupted
from .executors import progress
from .executors.progress import Request
from .reproducible.forms import dispatch

__all__ = ["Persistent", "bind", "allreduce_init", "reduce_scatter_block_init", "allgather_init",
           "bcast_init"]


class Persistent:
    """One collective bound to its buffers (``plan.bind``): ``h()`` runs it; ``start()``,
    ``test()``, ``wait()`` run it in the progress engine; ``free()`` drops it.

    ``result`` is the output array (``recvbuf``, or ``buf`` for bcast); ``plan`` the plan."""

    __slots__ = ("result", "collective", "plan", "_call", "_state", "_layout", "_run",
                 "_library", "_request", "_copies", "_active", "_freed",
                 "_nonblocking")

    def __init__(self, call: Call, p, layout, *, request=None, run=None, copies: bool = True):
        self.result, self.collective, self.plan = layout.result, call.collective, p
        self._call, self._state, self._layout = call, call.open(), layout
        self._run, self._library = run, request         # a schedule's or shm's run, MPI's
        # start() of MPI's own collective: its nonblocking call in the progress engine (which
        # comm.Free settles; MPICH fails a persistent request tested while it frees)
        self._nonblocking = None
        self._copies = copies and request is None
        self._request: Request | None = None            # the progress engine's, at start()
        self._active = self._freed = False

    def __call__(self):
        """Run the collective once, now; returns ``result``."""
        if self._active or self._freed or self._state.broken:
            self._usable()
        progress.finish_deferred(self._state)   # (they share its scratch and window)
        watch = self._call.watch
        if watch is not None:
            watch.deadline = time.monotonic() + self._call.timeout
        self._once(watch)
        return self.result

    def start(self) -> None:
        """Start the collective and return at once (see the module's doc)."""
        self._usable()
        self._rearm()
        if self._request is None:       # the progress engine runs it (comm.Free settles it)
            what = f"persistent {self.plan.describe()}"
            self._request = Request(what, result=self.result, deferred=self._once) \
                if self._library is None else \
                Request(what, result=self.result, library=self._nonblocking)
        self._request.start(self._call, self._state.traffic)
        self._active = True

    def test(self) -> bool:
        """Whether the collective started is done (moves it on where the caller progresses)."""
        if not self._active:
            return True
        done = self._request.test()
        if done:
            self._active = False
        return done

    def wait(self):
        """Complete the collective started by ``start()``; returns ``result`` (at once if none
        is active, as for MPI's inactive persistent requests)."""
        if not self._active:
            return self.result
        self._active = False
        return self._request.wait()

    def when_done(self, fn) -> None:
        """Call ``fn(error)`` once, when the collective started by ``start()`` completes or
        fails (``progress.Request.when_done``: from the thread that finishes it)."""
        self._request.when_done(fn)

    def release(self) -> None:
        """Return once the progress thread holds no reference to the finished collective
        (``progress.Request.release``)."""
        if self._request is not None:
            self._request.release()

    def free(self) -> None:
        """Drop the handle (MPI's persistent request with ``algorithm="mpi"``); it can't run
        again."""
        if self._active:
            raise RuntimeError(f"persistent {self.collective}: free() while started; wait() "
                               "first")
        if self._library is not None and self._library:
            self._library.Free()
        self._freed = True
        if self._request is not None:   # (it refers back to this handle: no cycle left for
            self._request.release()     # the garbage collector to free in another thread)
            self._request = None

    def _usable(self) -> None:
        if self._freed:
            raise RuntimeError(f"persistent {self.collective}: the handle was freed")
        if self._active:
            raise RuntimeError(f"persistent {self.collective}: start() called again before "
                               "wait()")
        if self._state.broken:
            self._state.check(self.collective)

    def _rearm(self):
        """The init's ``Watch`` with a new deadline (None: no timeout)."""
        watch = self._call.watch
        if watch is not None:
            watch.deadline = time.monotonic() + self._call.timeout
        return watch

    def _once(self, watch) -> None:
        """One run under ``watch``: copies in, the collective, copies out; a timeout marks the
        communicator broken (and aborts with ``on_timeout="abort"``), as a plain call's."""
        layout = self._layout
        if self._copies:
            layout.copy_in()
        try:
            if self._library is not None:
                self._library.Start()
                if watch is None:
                    self._library.Wait()
                else:
                    watch.wait([self._library], f"MPI_{self.collective.capitalize()}_init")
            elif self._run is not None:
                self._run(watch)
        except BaseException as exc:                # as a plain call's
            call = self._call
            error = interrupted(call._state, call.watch, call.on_timeout, call.comm, exc,
                                self.collective)
            if error is exc:
                raise
            raise error from exc
        if self._copies:
            layout.copy_out()

    def __repr__(self) -> str:
        return f"<persistent {self.plan.describe()} on {self.result.size} elements>"


def bind(call: Call, p, layout) -> Persistent:
    """A persistent handle running ``p`` on ``layout`` (``persistent.Persistent``)."""
    kind = p.kind
    prepared = plan.prepare(call, p)
    if kind == "library":
        p.agree(call)
        args, kwargs = plan.library_args(p, layout)
        _, nonblocking, persistent = plan.LIBRARY[p.collective]
        handle = Persistent(call, p, layout,
                            request=persistent(call.open().comm, *args, **kwargs))
        handle._nonblocking = lambda comm: nonblocking(comm, *args, **kwargs)
        return handle
    if kind == "shared":
        p.agree(call)
        (src, dst), signed = plan.shared_buffers(layout), plan.shm_signature(call)
        return Persistent(call, p, layout, run=lambda watch: prepared.run(
            src, dst, call.tag, watch, *signed), copies=False)
    p.agree(call)           # first: the tag the bound run keeps carries the arguments' hash
    if kind != "schedule":
        return Persistent(call, p, layout)
    if plan.reads_input(prepared, layout):      # no copy in: the run reads the input itself
        return Persistent(call, p, layout._replace(before=()), run=plan.bound(
            call, p, prepared, layout.work, layout.source, layout.kept))
    return Persistent(call, p, layout, run=plan.bound(call, p, prepared, layout.work))


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
    return Persistent(call, job.plan, job.layout, run=job.run, copies=False)


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
