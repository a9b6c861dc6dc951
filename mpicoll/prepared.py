"""The prepared call: a ``Plan`` made ready to run, which every form of every collective holds.

    prepared = prepare(call, p)     # before the agreement step: what can fail here fails here
    p.agree(call)                   # (Call.agree)
    prepared.run(call, layout)      # blocking; .hold + .start + .wait (nonblocking, Buckets),
                                    # .bind + .run_bound / .start + .wait (persistent),
                                    # .rebind (other buffers), .keep + .again (the cache)

``prepare`` is the one place the plan's kind decides what runs it: the MPI library's own
collective (``_Library``), the shared-memory runner (``_Shared``), one of mpicoll's schedules
(``_Schedule``: in the plan's executor, ``Scheduled``, or step by step in the progress engine),
or nothing to communicate (``Prepared`` itself: one rank, or no elements). Every form then runs
the same object, and its asynchronous forms the one request type it holds
(``progress.Request``: ``start``, ``wait``): ``mpicoll.plan``'s verbs (``run``, ``start``), a
persistent handle (``mpicoll.persistent``: ``bind`` once, then ``run_bound``, or ``start`` and
``wait``), each of ``Buckets``' buckets (``hold`` once, ``start`` and ``wait`` each step), the
cache (``mpicoll.cache``: ``keep``, then ``again`` on new buffers as a new call, without the
decisions) and ``mpicoll.reproducible.Job`` (a ``Prepared`` whose run is its phases', each a
bound ``Prepared``). A failure inside any of them goes through one handling (``failure``, or
the progress engine's: ``_runtime.call``'s ``interrupted``), as a plain call's: the
communicator marked broken, the other ranks told.
"""

from __future__ import annotations

import functools
import time
from typing import NamedTuple, NoReturn

import numpy as np
from mpi4py import MPI

from . import buffers, compression, kernels, ops, settings
from ._runtime import context, loading
from ._runtime.call import Call, agree_library_hash, disagree, interrupted
from ._runtime.watch import Watch
from .buffers import Layout
from .errors import ArgumentMismatch
from .executors import compiled, progress
from .executors.progress import Request
from .executors.shared import SharedMemory
from .registry import Algorithm

__all__ = ["Prepared", "Scheduled", "prepare", "failure", "prepared_schedule", "schedule_of",
           "internode_elements", "library_args", "shared_buffers", "shm_signature", "cuts",
           "LIBRARY"]

# The MPI library's own collective of each kind: blocking, nonblocking, persistent.
LIBRARY = {
    "allreduce": (MPI.Comm.Allreduce, MPI.Comm.Iallreduce, MPI.Comm.Allreduce_init),
    "reduce_scatter_block": (MPI.Comm.Reduce_scatter_block, MPI.Comm.Ireduce_scatter_block,
                             MPI.Comm.Reduce_scatter_block_init),
    "allgather": (MPI.Comm.Allgather, MPI.Comm.Iallgather, MPI.Comm.Allgather_init),
    "bcast": (MPI.Comm.Bcast, MPI.Comm.Ibcast, MPI.Comm.Bcast_init),
}

_execute = None         # the executor (MPICOLL_EXECUTOR), chosen at the first call


def _choose():
    global _execute
    if _execute is None:
        _execute = compiled.choose()
    return _execute


@settings.on_reload
def _forget_executor() -> None:
    global _execute
    _execute = None


# ----------------------------------------------------------------------------- preparing it

@functools.lru_cache(maxsize=256)
def schedule_of(algo: Algorithm, rank: int, size: int, count: int, options: tuple,
                nodes: tuple):
    """The schedule, and how many elements it sends to ranks on other nodes (for the traffic
    counters: counted once per schedule, not per message)."""
    kwargs = dict(options, **({"nodes": nodes} if algo.has("node-layout") else {}))
    sched = algo.schedule(rank, size, count, **kwargs)
    return sched, internode_elements(sched, rank, nodes)


def internode_elements(sched, rank: int, nodes: tuple) -> int:
    """How many elements ``rank``'s schedule sends to ranks on other nodes."""
    node_of = {r: j for j, members in enumerate(nodes) for r in members}
    return sum(hi - lo for _, sends in sched.plan for peer, lo, hi in sends
               if node_of[peer] != node_of[rank])


def _schedule(call: Call, p):
    st = call.open()
    return schedule_of(p.algorithm, call.rank, p.size, p.count,
                       tuple(p.options.items()), st.nodes())


def _warmup(call: Call, op: str, dtype) -> None:
    """Compile (or load) ``op``'s kernel for ``dtype`` (``kernels.warmup``), before the
    agreement step, under the call's deadline (``_runtime.loading``)."""
    if not kernels.warm(op, dtype):     # (else a thread started per call)
        loading.load(lambda: kernels.warmup(op, dtype), call.watch)


class Scheduled(NamedTuple):
    """A schedule ready for a blocking or persistent run (made before the agreement step):
    the executor, the schedule, the elements it sends to other nodes per run, the op by name
    (nothing reduced: any of the dtype's) and the communicator's scratch."""

    executor: compiled.Executor
    schedule: object
    internode: int
    op: str
    scratch: np.ndarray

    def bind(self, call: Call, flat: np.ndarray, src=None, kept=None):
        """``run(watch, tag=None)``: the schedule on ``flat``, bound once to everything it uses,
        with its own scratch (a persistent handle may run in the progress thread beside a
        blocking call); on ``call``'s tag, or ``tag`` (a later call's: ``Buckets``'
        reproducible sums). ``src``, ``kept``: the input, which a compiled executor reads where
        no step wrote yet instead of a copy in ``flat``, and the part of ``flat`` kept."""
        execute, sched, st = self.executor, self.schedule, call.open()
        scratch = np.empty(compiled.scratch_elements(execute, sched, flat.itemsize), flat.dtype)
        traffic, internode_bytes = st.traffic, self.internode * flat.itemsize
        bound = execute.bind(sched, flat, st.comm, op=self.op, tag=call.tag, scratch=scratch,
                             traffic=traffic, src=src, kept=kept)

        def run(watch, tag=None):
            bound(watch, tag)
            traffic["internode_bytes"] += internode_bytes
        return run


def prepared_schedule(call: Call, sched, internode: int, op: str | None, dtype) -> Scheduled:
    """A schedule of ``dtype`` elements ready to run (``op`` None: nothing is reduced), also
    one no plan names (``mpicoll.reproducible``'s exchange of values)."""
    execute = _choose()
    op = op or kernels.ops_for(dtype)[0]            # nothing is reduced (allgather, bcast)
    if not execute.compiled:                        # (the compiled loop loads its own)
        _warmup(call, op, dtype)
    scratch = call.open().scratch(dtype, compiled.scratch_elements(execute, sched,
                                                                   dtype.itemsize))
    return Scheduled(execute, sched, internode, op, scratch)


def shm_signature(call: Call) -> tuple:
    """``shm``'s (signature, mismatch): the hash of the call's arguments, which every rank
    publishes beside its input in the shared window, and what to do when they differ."""
    return (call.signature.hashed if call.signature is not None else 0, lambda: call.disagree(
        "the argument check of the shared-memory all-reduce (the ranks' hashes differ)"))


def library_args(p, layout: Layout) -> tuple:
    """The arguments of the MPI library's own collective (bfloat16 as uint16 where it only
    copies: ``kernels.as_storage``)."""
    if p.collective == "bcast":
        return (kernels.as_storage(layout.recv),), {"root": p.options["root"]}
    send = MPI.IN_PLACE if layout.send is None else layout.send
    if p.collective == "allgather":
        return (send if layout.send is None else kernels.as_storage(send),
                kernels.as_storage(layout.recv)), {}
    return (send, layout.recv), {"op": ops.MPI_OPS[p.op]}


def shared_buffers(layout: Layout) -> tuple:
    """The shared-memory runner's (src, dst): it reads sendbuf itself (recvbuf in place)."""
    return (layout.recv if layout.send is None else layout.send).reshape(-1), \
        layout.recv.reshape(-1)


def prepare(call: Call, p) -> "Prepared":
    """``p`` made ready to run, before the agreement step: what can still fail on this rank
    (the schedule, the kernel, the scratch, the shared-memory runner) fails here. The one
    place the plan's kind decides what runs it."""
    kind = p.kind
    if kind == "library":
        return _Library(call, p)
    if kind == "shared":
        return _Shared(call, p)
    if kind == "schedule":
        return _Schedule(call, p)
    return Prepared(call, p)


class Prepared:
    """One call made ready to run (``prepare``), which every form holds and runs:

    * ``run(call, layout)`` -- now, on the call that made it (blocking);
    * ``start(call)`` then ``wait()`` -- in the progress engine: the request this object
      holds (``held``), made once and started again by each ``start``. ``hold(call, layout)``
      makes it a request on ``layout`` agreed anew by each ``start``'s call (nonblocking calls,
      ``Buckets``' buckets); after ``bind`` it is the bound run, agreed at the bind
      (persistent handles);
    * ``bind(call, layout)`` then ``run_bound(call)`` (or ``once(watch)``, the raw run) --
      bound to fixed buffers once, run many times (persistent handles,
      ``mpicoll.reproducible.Job``'s phases); ``rebind(sendbuf, recvbuf)`` binds it to other
      buffers of the same dtypes and sizes, without a new agreement;
    * ``keep(call)`` then ``again`` / ``allreduce`` -- kept by the cache, a new call with the
      same arguments on other buffers, without the decisions.

    A failure of ``run_bound`` or of a bound ``start``'s run goes through ``failure``, a
    request's through the progress engine's (both ``_runtime.call.interrupted``).

    This class is the prepared call with nothing to communicate (one rank, or no elements:
    the copies are the call); ``_Library``, ``_Shared`` and ``_Schedule`` run the others."""

    reads_input = False     # a run reads an out-of-place input itself (``Layout.source``)
    copies = True           # the run copies the input in and the output out (``Layout``)
    noop = False            # kept, alone on the communicator: the copies are the whole call
    feedback = False        # error feedback's residual applies (a schedule's run: ``start``)
    held = None             # the request ``start`` starts (``hold``, or made at the first start)
    _each = False           # held by ``hold``: each start agrees on its call, copies in
    _signed: dict = {}      # what each start signs beyond the plan's fields (``hold``)
    _binding = None         # the call ``bind`` bound on (``rebind``)

    def __init__(self, call: Call, p):
        self.plan, self.collective, self.layout = p, p.collective, None

    def run(self, call: Call, layout: Layout) -> None:
        """Run now (blocking), on ``call``, which agreed."""
        progress.finish_deferred(call.open())   # (they share its scratch and window)
        layout.copy_in()
        self._run(call, layout)
        layout.copy_out()

    def _run(self, call: Call, layout: Layout) -> None:
        pass

    def request(self, call: Call, layout: Layout, on_done=None) -> Request:
        """A request running this call on ``layout`` (not started); ``on_done`` runs, then the
        division of ``plan.average``."""
        p = self.plan
        if p.average and p.size > 1:
            on_done = _then_average(on_done, p, layout)
        if self.copies and layout.after:
            on_done = _then(layout.copy_out, on_done)
        return self._request(call, layout, f"{p.collective} {p.algorithm.name}", on_done)

    def _request(self, call: Call, layout: Layout, what: str, on_done) -> Request:
        return Request(what, result=layout.result, on_done=on_done)

    def hold(self, call: Call, layout: Layout, req: Request | None = None,
             **signed) -> "Prepared":
        """Hold ``req`` (default: ``request``'s on ``layout``), which each ``start`` starts on
        its own call, agreed there (``signed``: as ``Plan.agree``'s ``instead``); returns
        self."""
        self.layout, self._each, self._signed = layout, True, signed
        self.held = self.request(call, layout) if req is None else req
        return self

    def start(self, call: Call, error_feedback=None, first: float = 0.0,
              keep: bool = False) -> Request:
        """Start the held request on ``call`` (its tag and deadline) and return it; ``wait``
        completes it. Held (``hold``): the agreement step first, the input copied in, error
        feedback's residual added (compression needs a schedule: ``plan._check``). Bound
        (``bind``): the bound run in the progress engine, or the MPI library's nonblocking
        collective, on the bind's agreement. ``first``, ``keep``: as ``Request.start``'s."""
        req = self.held
        if self._each:      # started again (Buckets, torch): the MPI library's argument
            call.in_request = req.call is not None      # check in the request, not a wait
            self.plan.agree(call, **self._signed)
            if self.copies:
                layout = self.layout
                layout.copy_in()
                if error_feedback is not None and self.feedback:
                    req.feed_back(error_feedback)
        elif req is None:
            what, result = f"persistent {self.plan.describe()}", self.layout.result
            req = self.held = Request(what, result=result,
                                      deferred=lambda watch: self.run_bound(call, False)) \
                if self.nonblocking is None else \
                Request(what, result=result, library=self.nonblocking)
        return req.start(call, call.open().traffic, first, keep)

    def wait(self):
        """Complete the run ``start`` started; returns the result (raises its error)."""
        return self.held.wait()

    def bind(self, call: Call, layout: Layout) -> "Prepared":
        """Bind to ``layout`` for ``once`` (agreed first: the tag the bound run keeps carries
        the arguments' hash); returns self."""
        return self._bound_to(call, layout, None)

    def rebind(self, sendbuf, recvbuf=None) -> "Prepared":
        """Bind to other buffers (the arguments of the ``*_init`` call; bcast: ``sendbuf`` is
        ``buf``) with the dtype, size and in-place-ness of the bound ones: the same call, no new
        agreement, nothing decided again; returns self. Not while a ``start`` is in flight;
        every rank rebinds alike (with the MPI library's own collective, its persistent request
        is made anew: collective)."""
        call = self._binding
        if call is None:
            raise NotImplementedError(f"{self.collective}: this prepared call can't be rebound "
                                      "(only one bound by bind())")
        if self.held is not None and not self.held.done:
            raise RuntimeError(f"{self.collective}: rebind() while started; wait() first")
        old, new = self.layout, _layout_of(self.collective, sendbuf, recvbuf, call.comm)
        if (new.work.dtype, new.work.size, new.send is None) != \
                (old.work.dtype, old.work.size, old.send is None):
            def shown(lay):
                return f"{lay.work.size} {lay.work.dtype}" + (" in place" * (lay.send is None))
            raise ValueError(f"rebind: {self.collective} was bound to {shown(old)}, got "
                             f"{shown(new)}")
        self.free()                     # (the held request: made again at the next start)
        self.bind(call, new)
        return self

    def _bound_to(self, call: Call, layout: Layout, run) -> "Prepared":
        self.layout, self._bound, self._binding = layout, run, call
        self._before, self._after = (layout.before, layout.after) if self.copies else ((), ())
        return self

    def once(self, watch, tag=None) -> None:
        """Run once on the bound buffers under ``watch`` (``tag``: another call's); the caller
        handles a failure (``failure``)."""
        for dst, src in self._before:
            np.copyto(dst, src)
        if self._bound is not None:
            self._bound(watch, tag)
        for dst, src in self._after:
            np.copyto(dst, src)

    def run_bound(self, call: Call, renew: bool = True):
        """Run once now on the bound buffers (``once``'s run), on ``call`` (the bind's: its
        tag; its deadline renewed, unless not ``renew``: a start's, renewed at the start); a
        failure goes through ``failure``."""
        watch = renewed(call) if renew else call.watch
        try:
            self.once(watch)
        except BaseException as exc:
            failure(call._state, watch, call.on_timeout, call.comm, exc, self.collective)

    nonblocking = None      # the MPI library's nonblocking collective (``_Library``)

    def free(self) -> None:
        """Drop what ``bind`` and ``start`` made (MPI's persistent request; the held request,
        which refers back to this object: no cycle left for the garbage collector to free in
        another thread)."""
        if self.held is not None:
            self.held.release()
            self.held = None

    # --- kept by the cache: a new call on ``st`` each time (``context.exclusive``: one
    #     thread at a time)

    def keep(self, call: Call) -> bool:
        """Make this call one the cache can run again (``again``, ``allreduce``): the call's
        number, tag, signature and deadline are taken anew each time; False where it can't."""
        sig = call.signature
        self.numbered = call._state is not None and not call.alone  # (alone: no number)
        self.sig, self.agreed = sig, call._agreed_on
        self.text = "" if sig is None else sig.text
        self.what = call.watch.what if call.watch is not None else call.collective
        self.timeout, self.on_timeout = call.timeout, call.on_timeout
        self.rank, self.block = call.rank, self.plan.block
        self.noop = not self.numbered
        return self._keep(call)

    def _keep(self, call: Call) -> bool:
        return True

    def _next(self, st) -> tuple:
        """A new call on ``st``: its number and tag (the broken check first)."""
        if st.broken:
            st.check(self.collective)
        if not self.numbered:
            return 0, 0
        number = st.next_number()
        return number, st.label(number, self.sig)

    @context.exclusive
    def again(self, st, buf: np.ndarray, src=None, kept=None) -> None:
        """Run on ``buf`` as a new call on ``st``: the input copied in already, or (out of
        place, ``reads_input``) read from ``src`` (flat) where no step wrote yet (``kept``:
        the part of ``buf`` the call keeps)."""
        self._next(st)

    def allreduce(self, st, sendbuf, recvbuf) -> None:
        """``again`` for an all-reduce from ``sendbuf`` (or ``MPI.IN_PLACE``) into ``recvbuf``
        (C-contiguous, the same sizes: the cache checked them)."""
        if sendbuf is not MPI.IN_PLACE:
            if self.reads_input:    # the loop reads sendbuf where no step wrote yet
                return self.again(st, recvbuf, sendbuf if sendbuf.ndim == 1 else
                                  sendbuf.reshape(-1))
            if recvbuf.shape == sendbuf.shape:
                recvbuf[...] = sendbuf
            else:                   # same element count, any shape: the flat views
                np.copyto(recvbuf.reshape(-1), sendbuf.reshape(-1))
        self.again(st, recvbuf)

    def _watch(self, st, number: int, left: float, tag: int) -> Watch:
        """The deadline of call ``number``, ``left`` seconds from now, as the full path's."""
        watch = Watch(self.timeout, self.what, st.comm)
        watch.deadline = time.monotonic() + left
        watch.tag, watch.number, watch.calls = tag, number, st.tags.calls
        watch.signature = self.text
        st.mark(watch)
        return watch

    def _failed(self, st, watch, exc: BaseException) -> NoReturn:
        """``failure`` for a call the cache runs again."""
        failure(st, watch, self.on_timeout, st.parent, exc, self.what)


def renewed(call: Call):
    """``call``'s ``Watch`` with a new deadline, ``call.timeout`` from now (None: none)."""
    watch = call.watch
    if watch is not None:
        watch.deadline = time.monotonic() + call.timeout
    return watch


def _layout_of(collective: str, sendbuf, recvbuf, comm) -> Layout:
    """The ``Layout`` of ``collective``'s buffers (``mpicoll.buffers``: checked as the form's)."""
    if collective == "allreduce":
        return buffers.allreduce(sendbuf, recvbuf)
    if collective == "bcast":
        return buffers.bcast(sendbuf)
    make = buffers.reduce_scatter_block if collective == "reduce_scatter_block" else \
        buffers.allgather
    return make(sendbuf, recvbuf, comm.Get_size(), comm.Get_rank())


def failure(st, watch, on_timeout: str, comm, exc: BaseException, what: str) -> NoReturn:
    """A prepared call's run raised ``exc`` (its ``except`` calls this): the one handling of
    every form (``_runtime.call.interrupted``, as a plain call's ``Call``): the communicator
    marked broken where ``exc`` breaks it (a raw ``MPI.Exception``: the dead rank's
    ``ProcessFailed``, or ``CommunicatorBroken``), the other ranks told; raise the error."""
    error = interrupted(st, watch, on_timeout, comm, exc, what)
    if error is exc:
        raise exc
    raise error from exc


class _Library(Prepared):
    """The MPI library's own collective."""

    copies = False

    def run(self, call: Call, layout: Layout) -> None:
        args, kwargs = library_args(self.plan, layout)
        blocking, nonblocking, _ = LIBRARY[self.collective]
        call.mpi(blocking, nonblocking, *args, **kwargs)

    def _request(self, call: Call, layout: Layout, what: str, on_done) -> Request:
        args, kwargs = library_args(self.plan, layout)
        nonblocking = LIBRARY[self.collective][1]
        return Request(what, result=layout.result, on_done=on_done,
                       library=lambda comm: nonblocking(comm, *args, **kwargs))

    def bind(self, call: Call, layout: Layout) -> Prepared:
        args, kwargs = library_args(self.plan, layout)
        _, nonblocking, persistent = LIBRARY[self.collective]
        self._bound_to(call, layout, self._start_wait)
        self._persistent = persistent(call.open().comm, *args, **kwargs)
        self.nonblocking = lambda comm: nonblocking(comm, *args, **kwargs)
        return self

    def _start_wait(self, watch, tag=None) -> None:
        """The bound run: MPI's persistent request started and waited for."""
        request = self._persistent
        request.Start()
        if watch is None:
            request.Wait()
        else:
            watch.wait([request], f"MPI_{self.collective.capitalize()}_init")

    def free(self) -> None:
        super().free()
        if self._persistent:
            self._persistent.Free()

    def _keep(self, call: Call) -> bool:
        """Of the MPI library's own collectives only all-reduce is kept: the prepared forms of
        the others run schedules only."""
        if self.collective != "allreduce":
            return False
        self.mpi_op = ops.MPI_OPS[self.plan.op]
        return True

    @context.exclusive
    def allreduce(self, st, sendbuf, recvbuf) -> None:
        """What the full path runs (``Call.agree``'s hash check under a deadline, then
        ``Call.mpi``), without its decisions."""
        if st.broken:
            st.check(self.collective)
        number = st.next_number()
        before = st.history_mark()
        tag = st.label(number, self.sig)
        comm, watch = st.comm, None
        try:
            if self.timeout is None:
                comm.Allreduce(sendbuf, recvbuf, op=self.mpi_op)
                return
            watch = self._watch(st, number, self.timeout, tag)
            try:
                agree_library_hash(comm, self.collective, self.agreed, self.sig.hashed, before,
                                   watch)
            except ArgumentMismatch:
                if not st.broken:           # before any transfer: as if not called (Call's)
                    st.rewind(before)
                raise
            watch.wait([comm.Iallreduce(sendbuf, recvbuf, op=self.mpi_op)], "MPI_Iallreduce",
                       keep=(sendbuf, recvbuf))
        except BaseException as exc:
            self._failed(st, watch, exc)


class _Shared(Prepared):
    """The shared-memory runner (``executors.shared``): it reads the input itself."""

    copies = False

    def __init__(self, call: Call, p):
        super().__init__(call, p)
        st = call.open()
        self.runner = SharedMemory(st, p.dtype, p.op) if p.executor == "shm" else \
            SharedMemory(st, p.dtype, p.op, _choose(), p.algorithm, p.options["outer"])

    def run(self, call: Call, layout: Layout) -> None:
        progress.finish_deferred(call.open())   # (they share its scratch and window)
        self.runner.run(*shared_buffers(layout), call.tag, call.watch, *shm_signature(call))

    def _request(self, call: Call, layout: Layout, what: str, on_done) -> Request:
        (src, dst), runner = shared_buffers(layout), self.runner
        req = Request(what, result=layout.result, on_done=on_done,   # (on the tag and signature
                      deferred=lambda watch: runner.run(src, dst, req.call.tag, watch,  # of the
                                                        *shm_signature(req.call)))  # start's)
        return req

    def bind(self, call: Call, layout: Layout) -> Prepared:
        (src, dst), signed, runner = shared_buffers(layout), shm_signature(call), self.runner
        return self._bound_to(call, layout, lambda watch, tag=None: runner.run(
            src, dst, call.tag, watch, *signed))

    @context.exclusive
    def allreduce(self, st, sendbuf, recvbuf) -> None:
        """The runner from ``sendbuf`` (in place: ``recvbuf``) into ``recvbuf``; the deadline's
        ``Watch`` made only if a wait outlasts a spin."""
        src = recvbuf if sendbuf is MPI.IN_PLACE else sendbuf
        number, tag = self._next(st)
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
            self.runner.run(src.reshape(-1), recvbuf.reshape(-1), tag, get_watch,
                            self.sig.hashed, mismatch)
        except BaseException as exc:
            self._failed(st, watch, exc)


class _Schedule(Prepared):
    """One of mpicoll's schedules: in the progress engine step by step (a request), else in
    the plan's executor (``Scheduled``)."""

    feedback = True

    def __init__(self, call: Call, p):
        super().__init__(call, p)
        self.scheduled = None
        if p.executor != "progress":
            sched, internode = _schedule(call, p)
            self.scheduled = prepared_schedule(call, sched, internode, p.op, p.dtype)
            self.reads_input = self.scheduled.executor.compiled

    def _run(self, call: Call, layout: Layout) -> None:
        execute, sched, internode, op, scratch = self.scheduled
        st = call.open()
        execute(sched, layout.work, st.comm, op=op, tag=call.tag, scratch=scratch,
                traffic=st.traffic, watch=call.watch)
        st.traffic["internode_bytes"] += internode * self.plan.dtype.itemsize

    def run(self, call: Call, layout: Layout) -> None:
        if not self.reads_input or layout.source is None:
            return super().run(call, layout)
        progress.finish_deferred(call.open())   # the loop reads the input: no copy in
        execute, sched, internode, op, scratch = self.scheduled
        st = call.open()
        execute(sched, layout.work, st.comm, op=op, tag=call.tag, scratch=scratch,
                traffic=st.traffic, watch=call.watch, src=layout.source, kept=layout.kept)
        st.traffic["internode_bytes"] += internode * self.plan.dtype.itemsize
        layout.copy_out()

    def _request(self, call: Call, layout: Layout, what: str, on_done) -> Request:
        p = self.plan
        sched, internode = _schedule(call, p)
        op = p.op or kernels.ops_for(p.dtype)[0]
        _warmup(call, op, p.dtype)
        if p.codec is not None:
            compression.warmup()
        return Request(what, sched, kernels.as_storage(layout.work),
                       reduce_into=kernels.kernel(op, p.dtype), codec=p.codec,
                       cuts=cuts(call, p), on_done=on_done, result=layout.result,
                       internode_bytes=internode * p.dtype.itemsize)

    def bind(self, call: Call, layout: Layout) -> Prepared:
        if self.reads_input and layout.source is not None:   # no copy in: it reads the input
            layout = layout._replace(before=())
            return self._bound_to(call, layout, self.scheduled.bind(
                call, layout.work, layout.source, layout.kept))
        return self._bound_to(call, layout, self.scheduled.bind(call, layout.work))

    def _keep(self, call: Call) -> bool:
        execute, sched, internode, op, scratch = self.scheduled
        if execute.reusable is None:
            return False
        st = call.open()
        self.reusable = execute.reusable(sched, self.plan.dtype, st.comm, op=op,
                                         scratch=scratch, traffic=st.traffic)
        self.internode_bytes = internode * self.plan.dtype.itemsize
        return True

    @context.exclusive
    def again(self, st, buf: np.ndarray, src=None, kept=None) -> None:
        """The schedule (``compiled.Reusable``): under a deadline, a ``Watch`` is made only if
        a round outlasts the loop's spin."""
        number, tag = self._next(st)
        flat, watch = buf.reshape(-1), None
        try:
            if self.timeout is None:
                self.reusable.run(flat, tag, None, None, src, kept)
            else:
                def make_watch(left: float) -> Watch:
                    nonlocal watch
                    watch = self._watch(st, number, left, tag)
                    return watch
                self.reusable.run(flat, tag, self.timeout, make_watch, src, kept)
        except BaseException as exc:
            self._failed(st, watch, exc)
        if self.internode_bytes:
            st.traffic["internode_bytes"] += self.internode_bytes


def _average(p, layout: Layout) -> np.ndarray:
    """The result, divided by the rank count where ``p.average`` (the sum's own dtype: the
    same bits on every rank)."""
    result = layout.result
    if p.average and p.size > 1:
        np.divide(result, result.dtype.type(p.size), out=result)
    return result


def _then_average(on_done, p, layout: Layout):
    def done():
        if on_done is not None:
            on_done()
        _average(p, layout)
    return done


def _then(first, then):
    if then is None:
        return first

    def done():
        first()
        then()
    return done


def cuts(call: Call, p):
    """int8's pieces for ``p`` (``compression.schedule_cuts``): cut at every slice edge of every
    rank's schedule."""
    if p.codec is None or p.codec.name != "int8":
        return None
    return _cached_cuts(p.algorithm, p.size, p.count, tuple(p.options.items()),
                        call.open().nodes())


@functools.lru_cache(maxsize=64)
def _cached_cuts(algo: Algorithm, size: int, count: int, options: tuple, nodes):
    return compression.schedule_cuts(
        count, [schedule_of(algo, r, size, count, options, nodes)[0] for r in range(size)])
