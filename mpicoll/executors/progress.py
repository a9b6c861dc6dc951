"""The progress executor: collectives that run while the caller computes.

A ``Request`` runs the same ``Schedule.plan`` as the blocking executor (``executors/python.py``),
one step at a time, without ever blocking: *post* a step (its receives, then its sends), and on
each later look *test* them; once all are complete, *reduce* (the numba kernel, ``Recv.left``
order, as the blocking executor) and post the next step. With a codec
(``mpicoll.compression``) a send encodes its slice into a wire buffer and rounds the sender's
own copy in the same pass; a receive lands in a wire buffer and is decoded and summed into
fp32 in one pass (or decoded, for a copy); at the end every rank rounds what it may hold
unrounded (why: ``mpicoll.compression``). A request owns its scratch and wire buffers (made
once, when it is made; wire buffers are reused from requests gone before), so requests in
flight never share memory, and one request can be started again and again (``Buckets`` do:
MPI's persistent collectives).

Who looks (``MPICOLL_PROGRESS``):

* ``thread`` -- one daemon *progress thread* per process advances every active request
  (``executors/engine.py``: the thread, its lock, and how it backs off when nothing moves). It
  holds the GIL only between MPI calls (mpi4py releases it inside them; the numba kernels are
  ``nogil``), so numpy or numba compute in the caller's thread overlaps it. ``wait()`` looks
  at its own request for up to ``HELP`` (100 us; crowded, ``idle.crowded``, up to 1 ms with
  sleeps between looks), so a collective whose peers are there completes in the waiter, then
  sleeps on the request's event, which the thread sets.
  ``Request.then`` functions (torch's ``Work`` futures) run in the thread that ended the
  request, once it let the engine go. Needs ``MPI_THREAD_MULTIPLE``.
* ``caller`` -- no thread: a request's first step is posted when it starts and later steps
  move only inside ``test()``, ``wait()`` and ``api.waitall()`` (each advances every active
  request, so waiting in any order cannot deadlock; a ``wait`` yields the core between looks
  for ``_WAIT_YIELDS`` looks without a move -- crowded, ``idle.crowded``, it naps 10 us for
  ``idle.NAPS_SECONDS`` instead -- then sleeps 10 us doubling to 1 ms). Overlap
  depends on how often the caller looks. ``auto`` (the default) picks it when
  ``MPI.Query_thread()`` is below ``MPI_THREAD_MULTIPLE``, where ``thread`` raises RuntimeError.

A request started with ``keep=True`` (``Buckets`` on a node with no core to spare) is its
caller's in either mode: the thread never looks at it; it moves in ``drive``, ``test``, ``wait``.

Every request in flight has its own tag (``CommState.next_number``, ``_runtime/tags.py``), so
several on one communicator never take each other's messages and complete in any wait order. A
request with a deadline (``timeout=`` at the call -- the default one too -- or
``wait(timeout=...)``) is polled under it by the
``Watch`` of a blocking call: past it, the request fails with ``CollectiveTimeout`` naming the
missing ranks, its communicator is marked broken, and the other requests in flight on it fail
with ``CommunicatorBroken``.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np
from mpi4py import MPI

from .. import compression, idle
from ..idle import progress_mode as mode
from .._runtime import validate
from .._runtime.watch import Watch, kept
from ..errors import CommunicatorBroken
from .engine import (SLEEP_MIN, active, advance_all, ensure_thread, in_thread, lock, priority,
                     ready, run_ready, thread_alive, turn, wake)
from .step import posted_steps

__all__ = ["Request", "mode", "finish_deferred", "busy", "settle"]

_WAKE_CHECK = 0.05              # a wait() sleeping on the thread checks it is alive this often
HELP = 100e-6                   # a wait() looks at its request itself this long first
# A crowded process (``idle.crowded``: more ranks on the node than cores) does not spin (nor
# does the thread: ``engine``): start(first=) looks once, a wait() looks for up to _CROWDED_HELP
# sleeping between looks (10 us doubling): the rank waited for most often needs this core
# (MPICOLL_YIELD_WHEN_IDLE) ...
_CROWDED_HELP = 1e-3
# ... and a caller waiting on requests it moves itself (caller mode, kept ones) naps 10 us
# between looks for ``idle.NAPS_SECONDS`` after each move (a quiet node's yields this many looks:
# a crowded one's yields cost a time slice of any other job on the node; docs/training.md)
_WAIT_YIELDS = 200


class Request:
    """A collective in flight: ``test()``, ``wait(timeout=None)``, ``done``.

    Made by ``mpicoll.iallreduce`` and friends (and by ``Buckets``, which start theirs again
    every step); ``wait`` returns the call's result (its ``recvbuf``).
    """

    def __init__(self, what: str, schedule=None, buf: np.ndarray | None = None, *,
                 reduce_into=None, codec=None, cuts=None, library=None, on_done=None,
                 result=None, deferred=None, internode_bytes: int = 0):
        self.what, self.result, self._buf, self._cuts = what, result, buf, cuts
        self._internode = internode_bytes   # sent off-node per run (counted once per start)
        self._deferred = deferred       # deferred(watch): the whole collective, run at once
        self._codec, self._reduce, self._library, self._on_done = codec, reduce_into, library, on_done
        with priority():                # local work: the progress thread gives way
            self._steps = () if schedule is None else \
                posted_steps(schedule, buf, codec, cuts, owner=self)
        self._feedback = None           # the ErrorFeedback of the run under way (feed_back)
        self._unrounded, self._fed_steps, self._fed_before = (), (), ()
        if codec is not None and schedule is not None and buf is not None:
            self._unrounded = compression.unrounded(buf.size, schedule.plan)
            self._fed_steps, self._fed_before = compression.first_touches(buf.size,
                                                                          schedule.plan)
        self._nsteps = 1 if library is not None or deferred is not None else len(self._steps)
        self._mine = self._extremes = None  # a library call's check (Call.library_check)
        self._finished = threading.Event()
        self._finished.set()
        self._error: BaseException | None = None
        self._call = self._state = self._watch = self._traffic = None
        self._tag, self._index, self._pending, self._peers = 0, 0, [], []
        self._later: list = []          # a library call's posted with its check (_post)
        self._when_done: list = []      # mpicoll.Comm's hook (when_done)
        self._following = False         # (following)
        self._kept = False              # advanced by its caller only (start(keep=True))

    @property
    def call(self):
        """The ``Call`` of the latest ``start`` (None before it): its tag and signature are the
        run's, also for a request started again in a new call each time (``Buckets``)."""
        return self._call

    @property
    def cuts(self):
        """int8 compression's pieces (``compression.schedule_cuts``), or None."""
        return self._cuts

    def __repr__(self) -> str:
        state = "failed" if self._error else "done" if self.done else \
            f"step {self._index} of {self._nsteps}"
        return f"<mpicoll Request {self.what}: {state}>"

    # ------------------------------------------------------------------------- set-up (once)

    # --- mpicoll.Comm (issue 21): its requests are MPI generalized requests, completed here
    def when_done(self, fn) -> None:
        """Call ``fn(error)`` once, as the request completes (``error`` None) or fails, in the
        thread that ends it, just before ``done`` turns True (at once if done already); ``fn``
        must not raise nor call mpicoll."""
        with turn():
            if not self._finished.is_set():
                self._when_done.append(fn)
                return
        fn(self._error)

    def then(self, fn) -> None:
        """Call ``fn(error)`` once, when the request completes (``error`` None) or fails: from
        the thread that ends it once it let the engine go (``fn`` may call mpicoll, even wait),
        or at once if done already. What torch's ``Work`` completes its future with."""
        with turn():
            if not self._finished.is_set():
                self._when_done.append(lambda error: ready.append((fn, error)))
                return
        fn(self._error)

    def release(self) -> None:
        """Return once the thread's pass is over: it then holds no reference to this finished
        request, so the caller frees its buffers (mpi4py's DLPack tests count references)."""
        with turn():
            pass

    def _call_when_done(self) -> None:
        callbacks, self._when_done = self._when_done, []
        for fn in callbacks:
            fn(self._error)
    # --- end of mpicoll.Comm's hunk

    # --- a communicator's first call, started by another thread (executors/background.py)
    @classmethod
    def following(cls, what: str, state, result=None) -> "Request":
        """A request in flight at once, for a call whose start another thread does (the first
        nonblocking call on a communicator: ``executors.background``); it completes with the request
        that thread hands it (``adopt``), or fails with the error it met (``refuse``)."""
        req = cls(what, result=result)
        req._following, req._inner, req._state, req._nsteps = True, None, state, 1
        with turn():
            req._finished.clear()
            active.append(req)
            wake.notify()
        ensure_thread()
        return req

    def adopt(self, inner: "Request") -> None:
        with turn():
            self._inner = inner
            wake.notify()

    def refuse(self, error: BaseException) -> None:
        with turn():
            self._inner = error
            wake.notify()

    def _follow(self) -> bool:
        inner = self._inner
        if inner is None or isinstance(inner, Request) and not inner.done:
            return False
        if isinstance(inner, BaseException):
            self._error = inner
        else:
            self._error, self._index = inner._error, self._nsteps
        self._call_when_done()
        self._finished.set()
        return True

    # ------------------------------------------------------------------------- running

    def start(self, call, traffic: dict, first: float = 0.0, keep: bool = False) -> "Request":
        """Start (again) on ``call``'s communicator and tag, under its deadline; returns self.
        ``first``: seconds this thread advances it before handing it to the thread (a small
        call whose peers are there ends here, the thread not woken); a failure met then is the
        request's, which ``wait`` raises. ``keep``: the caller advances it, never the thread --
        in ``drive``, ``test``, ``wait`` (MPI's rule; ``Buckets`` on a full node)."""
        progress = mode()
        st = call.open()
        with turn():                    # (the posts below are local: nonblocking calls)
            if not self._finished.is_set():
                raise RuntimeError(f"{self.what}: start() while the request is still in flight")
            self._call, self._state, self._traffic = call, st, traffic
            traffic["internode_bytes"] += self._internode
            self._tag, self._watch = call.tag, call.watch
            self._error, self._index, self._pending, self._peers = None, 0, [], []
            self._kept = keep
            if self._library is not None:       # the check this start owes, if any
                check = call.library_check()
                self._nsteps = 1 if check is None else 2
                if check is not None:           # (its buffers made once: always one size)
                    if self._mine is None:
                        self._mine, self._extremes = np.empty((2, 2 * len(check)), np.int64)
                    self._mine[:] = validate.both_signs(check)
            self._finished.clear()
            if self._nsteps == 0:
                self._complete()
                return self
            try:
                self._post()
            except BaseException as exc:
                self._fail(exc)
                raise
            if first and self._first(first):
                return self
            active.append(self)        # (kept: for finish_deferred, settle and _fail's eyes)
            if keep:
                return self
            wake.notify()
        if progress == "thread":
            ensure_thread()
        return self

    def _first(self, seconds: float) -> bool:
        """``start``'s bounded look (lock held): whether the request ended within ``seconds``."""
        if self._deferred is not None:  # (it would run whole here)
            return False
        end = time.perf_counter() + (0.0 if idle.crowded() else seconds)
        try:
            while True:                 # (one look at least)
                moved = self._advance()
                if self._finished.is_set() or time.perf_counter() >= end:
                    break
                if not moved:
                    os.sched_yield()    # (a peer waiting for a core may take this one)
        except BaseException as exc:    # noqa: BLE001 - raised by wait()
            self._fail(exc)
        return self._finished.is_set()

    @property
    def done(self) -> bool:
        """True once the request has completed (or failed: ``wait`` raises its error)."""
        return self._finished.is_set()

    def test(self) -> bool:
        """Advance (in ``caller`` mode) and say whether the request is done; raises its error."""
        if not self._finished.is_set():
            if self._kept:
                self.drive()
            elif mode() == "caller":
                with turn():
                    advance_all()
        if self._error is not None:
            raise self._error
        return self._finished.is_set()

    def drive(self) -> bool:
        """A kept request (``start(keep=True)``): look at it once, here; returns whether
        anything moved. (Others: False; the engine advances them.)"""
        if not self._kept or self._finished.is_set():
            return False
        with turn():
            return self._look()

    def give_up(self, error: BaseException) -> None:
        """Fail it now with ``error`` if still in flight (a kept one on a broken communicator)."""
        with turn():
            self._fail(error)
            if self in active:
                active.remove(self)

    def _look(self) -> bool:
        """One look at this request alone, here (lock held); dropped from the engine once it
        ended. Returns whether anything moved (its failure is kept for ``wait``)."""
        if self._finished.is_set():
            return False
        try:
            moved = self._advance()
        except BaseException as exc:    # noqa: BLE001 - raised by wait()
            self._fail(exc)
            moved = True
        if self._finished.is_set() and self in active:
            active.remove(self)
        return moved

    def wait(self, timeout=None):
        """Block until done and return the result (``recvbuf``); raise the request's error.
        ``timeout`` (seconds) tightens the deadline to now + timeout: past it the collective
        fails as a blocking call's would (``CollectiveTimeout``; the communicator broken)."""
        if timeout is not None and not self._finished.is_set():
            self._tighten(timeout)
        threaded = mode() == "thread" and not in_thread() and not self._kept
        if not self._finished.is_set() and threaded:    # (a then() fn may wait, in the thread)
            self._help()
        while not self._finished.is_set() and threaded and thread_alive():
            # the thread advances it (and its deadline)
            self._finished.wait(_WAKE_CHECK)
        naps = idle.crowded()           # (naps between looks, where a quiet node yields)
        pause, looks, since = SLEEP_MIN, 0, time.monotonic()
        while not self._finished.is_set():      # caller mode: the caller advances
            if self._kept:              # (only itself: no request of the thread's)
                moved = self.drive()
            else:
                with turn():            # the caller helps: it would only sleep otherwise
                    moved = advance_all()
            if self._finished.is_set():
                break
            if moved:
                pause, looks, since = SLEEP_MIN, 0, time.monotonic()
            elif not naps and looks < _WAIT_YIELDS:
                looks += 1
                os.sched_yield()
            else:
                self._finished.wait(pause)
                pause = idle.next_pause(pause, time.monotonic() - since, naps)
        if self._error is not None:
            raise self._error
        return self.result

    def _help(self) -> None:
        """Thread mode: the waiting thread looks at this request alone (a waiter that drove all,
        as ``MPI_Wait`` does, cost a torch matmul beside it more: docs/training.md) for up to
        ``HELP`` s when the thread is not in a pass, yielding between looks (crowded: up to
        ``_CROWDED_HELP``, sleeping), then sleeps on its event: a small collective ends here,
        without two hand-offs. Not a deferred request (it would run whole here) nor a follower."""
        if self._deferred is not None or self._following:
            return
        crowded = idle.crowded()
        end = time.perf_counter() + (_CROWDED_HELP if crowded else HELP)
        pause = SLEEP_MIN
        while not self._finished.is_set():
            if lock.acquire(blocking=False):
                try:
                    self._look()
                finally:
                    lock.release()
                run_ready()
            if self._finished.is_set() or time.perf_counter() >= end:
                return
            if crowded:
                time.sleep(pause)       # (the rank waited for may need this core)
                pause *= 2
            else:
                os.sched_yield()

    def _tighten(self, timeout) -> None:
        if self._following:             # the request it follows has the deadline
            inner = self._inner
            if isinstance(inner, Request):
                inner._tighten(timeout)
            return
        from .._runtime.call import _timeout
        seconds = _timeout(timeout, "timeout")
        if seconds is None:
            return
        with turn():
            if self._finished.is_set():
                return
            if self._watch is None:
                self._watch = Watch(seconds, self.what, self._state.comm)
                self._call.label(self._watch)
                self._call.watch = self._watch
            elif time.monotonic() + seconds < self._watch.deadline:
                self._watch.deadline = time.monotonic() + seconds
                self._watch.timeout = seconds

    def _post(self) -> None:
        comm, tag, codec, cuts = self._state.comm, self._tag, self._codec, self._cuts
        if self._deferred is not None:          # run by _advance, not posted
            self._pending, self._peers = [], []
            return
        if self._library is not None:   # both at the start, in the order every rank starts
            if self._index == 0:        # calls (MPI's rule): the hash check owed, the call
                self._later = [self._library(comm)]
                if self._nsteps == 2:
                    self._later.insert(0, comm.Iallreduce(self._mine, self._extremes, MPI.MAX))
            self._pending, self._peers = [self._later.pop(0)], []
            return
        recvs, sends, sent, received = self._steps[self._index]
        pending = [comm.Irecv(into, src, tag) for src, into, _, _ in recvs]
        for k, (dst, out, enc) in enumerate(sends):
            if enc is not None:                 # encoded; the sender keeps what it sends
                x, lo, wire = enc
                codec.send(x, lo, wire, cuts, self._fed(self._fed_steps[self._index][0][k],
                                                        lo, x.size))
            pending.append(comm.Isend(out, dst, tag))
        self._pending = pending
        self._peers = [r[0] for r in recvs] + [s[0] for s in sends]
        traffic = self._traffic
        traffic["bytes_sent"] += sent
        traffic["bytes_received"] += received
        traffic["messages_sent"] += len(sends)

    def feed_back(self, error_feedback) -> None:
        """Add ``error_feedback``'s residual into the next run's input (before ``start``): on
        the slices no first pass of the schedule takes it along now, on the others as the run
        first sends or reduces them (``compression.first_touches``: one pass fewer)."""
        e, buf = error_feedback.residual, self._buf
        error_feedback.check(buf)
        for lo, hi in self._fed_before:
            self._codec.feedback(buf[lo:hi], e[lo:hi], self._cuts, error_feedback.divide, lo)
        self._feedback = error_feedback

    def _fed(self, first: bool, lo: int, n: int):
        """``Codec.send``/``add``'s ``fed`` for an op that touches its slice first, or None."""
        ef = self._feedback
        return (ef.residual[lo:lo + n], ef.divide) if first and ef is not None else None

    def _step_bytes(self) -> int:
        """The bytes the current step sends and receives (0 for a library or deferred one)."""
        if self._library is not None or self._deferred is not None or \
                self._index >= len(self._steps):
            return 0
        step = self._steps[self._index]
        return step[2] + step[3]

    def _finish_step(self) -> None:
        if self._library is not None:
            if self._index < self._nsteps - 1:  # the check: every entry's max, then -min
                k, high = self._mine.size // 2, self._extremes
                if not np.array_equal(high[:k], -high[k:]):
                    raise self._call.check_failed(high[:k], -high[k:], self._mine[:k])
            return
        codec, reduce_into, cuts = self._codec, self._reduce, self._cuts
        recvs = self._steps[self._index][0]
        for _, _, dec, _ in recvs:      # every decode first: an into_next receive's
            if dec is not None:         # accumulator is a later receive's scratch
                wire, lo, target = dec
                codec.decode(wire, lo, target, cuts)
        for k, (_, _, _, red) in enumerate(recvs):
            if red is not None:
                acc, incoming, left = red
                if type(incoming) is tuple:     # (wire, lo): decode and sum in one pass
                    wire, lo = incoming
                    codec.add(wire, lo, acc, left, cuts,
                              self._fed(self._fed_steps[self._index][1][k], lo, acc.size))
                elif left:                      # acc = op(incoming, acc)
                    reduce_into(incoming, acc)
                    acc[...] = incoming
                else:                           # acc = op(acc, incoming)
                    reduce_into(acc, incoming)

    def _advance(self) -> bool:
        """Look once (lock held): finish every step that completed and post the next. Returns
        whether anything moved."""
        moved = False
        if self._following:
            return self._follow()
        if self._deferred is not None:          # the engine runs it whole, here
            self._deferred(self._watch)
            self._index = self._nsteps
            self._complete()
            return True
        while True:
            if self._watch is None:
                if not MPI.Request.Testall(self._pending):
                    watched = self._state.watched     # no deadline: a death still ends it
                    if watched is not None and watched.known:
                        self._state.check(self.what)
                    return moved
            elif not self._watch.poll(self._pending, self._index, self._nsteps, self._peers):
                return moved
            self._finish_step()
            moved = True
            self._index += 1
            if self._index == self._nsteps:
                self._complete()
                return True
            self._post()

    def _complete(self) -> None:
        self._pending, self._feedback = [], None
        try:
            for lo, hi in self._unrounded:      # see mpicoll.compression
                self._codec.round(self._buf[lo:hi], lo, self._cuts)
            if self._on_done is not None:
                self._on_done()
        except BaseException as exc:    # noqa: BLE001 - raised by wait()
            self._error = exc
        self._call_when_done()          # mpicoll.Comm's hunk
        self._finished.set()

    def _fail(self, exc: BaseException) -> None:
        """Fail this request (lock held); after a timeout, fail the others on its
        communicator too (their messages may never come)."""
        if self._finished.is_set():
            return
        raw = isinstance(exc, MPI.Exception) and self._call is not None
        if raw:     # the MPI library failed in a step (a dead peer): named, the comm broken
            exc = self._call.interrupted(exc)
        self._error, self._feedback = exc, None
        self._call_when_done()          # mpicoll.Comm's hunk
        self._finished.set()
        state = self._state
        if self._pending or self._later:    # keep them and their buffers alive (a library
            state.abandon([kept(self._pending + self._later,    # call's: mpi4py does not)
                                (self._library, self._mine, self._extremes))])
            compression.failed(self)            # (and never reuse its wire buffers)
        self._pending, self._later = [], []
        if isinstance(exc, CommunicatorBroken) and not raw:
            return
        if self._call is not None and not raw:
            self._call._failed(exc)             # broken; abort if on_timeout="abort"
        for other in list(active):      # (a follower takes its own request's error)
            if other is not self and other._state is state and not other.done \
                    and not other._following:
                other._fail(CommunicatorBroken(
                    f"{other.what}: failed because {self.what} on the same communicator "
                    f"failed ({type(exc).__name__}: {exc})"))


def busy() -> bool:
    """Whether any request is in flight (on any communicator)."""
    return bool(active) and any(not r.done for r in active)     # (a plain call asks)


def finish_deferred(state) -> None:
    """Complete the deferred requests in flight on ``state``'s communicator (each runs whole,
    with the scratch and window a blocking call on it uses too); their errors stay theirs."""
    if not active:
        return
    for req in [r for r in active if r._state is state and r._deferred is not None]:
        try:
            req.wait()
        except Exception:       # noqa: BLE001 - its owner's wait() raises it
            pass


def settle(state, why: str) -> None:
    """Before ``state``'s communicator is freed (issue #22): complete every request in flight
    on it under its own deadline (600 s for one without), so none is left to touch the freed
    communicator; one that cannot fails with its error, which its ``wait`` raises."""
    for req in [r for r in list(active) if r._state is state and not r.done]:
        try:
            req.wait(timeout=None if req._watch is not None else 600.0)
        except BaseException:           # noqa: BLE001 - kept in the request for wait()
            pass
        if not req.done:
            with turn():
                req._fail(CommunicatorBroken(f"{req.what}: {why}"))
