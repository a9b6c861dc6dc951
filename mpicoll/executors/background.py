"""A communicator's first nonblocking call, started without blocking (issue 18).

The first mpicoll call on a communicator makes mpicoll's duplicate of it and finds its node
layout (``CommState.ready``: the presence check, ``MPI_Comm_idup``, one ``allgather`` of the
ranks' node names).
That waits for every rank, and the plan of the call needs the node layout. A nonblocking call
must still return at once: this valid MPI program must complete ::

    rank 0: req = iallreduce(x, comm=c); c.Ssend(msg, dest=1); req.wait()
    rank 1: c.Recv(msg, source=0); req = iallreduce(x, comm=c); req.wait()

So on a communicator that is not ready, ``iallreduce`` and its kin check their own arguments
(raising at once, as always), then hand the rest of the call -- the set-up, the plan, the
agreement step, the start -- to one background thread per communicator, and return a
``progress.Request`` that follows it. Calls made on the communicator while that thread still
works keep their order: a later nonblocking call joins its queue; a blocking or persistent
call, or anything else that needs the communicator ready, waits until the queue is empty
(``CommState.ready``). Errors reach the request (``wait`` raises them) and, as a blocking
call's, the other ranks (``Call.__exit__``: notices, a broken communicator).

On the caller's thread ``later`` first makes ``CommState.start``: it posts the presence
check's messages and starts the ``MPI_Comm_idup`` there, so that the ``Idup`` takes its place
among the collectives this rank starts on the communicator (MPI's ordering rule: started by the
background thread it could pass a ``comm.Ibarrier()`` the user starts right after, and hung).
The background thread only waits for them and then uses mpicoll's duplicate, so the user may
free the communicator at once. ``comm.Free()`` is local: it never waits for the set-up
(``CommState.free`` only marks the state and drops the strays; the thread frees the duplicate
after its calls). MPICH calls mpicoll's attribute callback from inside that thread's
``MPI_Test`` if the set-up's requests on the communicator were still pending, where no MPI call
may be made: there it only marks the state. The rest of the set-up -- one ``allgather`` of
the ranks' host names (the node layout) and failure-detector identities -- runs on the
duplicate, on this thread only: every rank's thread makes the same collective, and no other
thread makes one there until the queue is empty (a blocking call waits for it,
``CommState.ready``; a later nonblocking one joins the queue). This thread makes no
communicator: one made here (the node layout's ``MPI_Comm_split_type`` once) joins MPICH's
context-id agreement, which spans the process's communicators, and all ranks hung in it.

With ``validate=True`` the call agrees before it returns (that is what it asks for), so it
starts on the caller's thread. On by default (issue 40; ``MPICOLL_BACKGROUND_START=0`` turns it
off) under MPICH only (``_library_allows``: Open MPI failed with it). Needs the progress thread
(``MPICOLL_PROGRESS=thread``, i.e. ``MPI_THREAD_MULTIPLE``). With ``caller`` progress no other
thread may call MPI while the caller does, and the first nonblocking call on a communicator
makes the duplicate before it returns, as a blocking one.
"""

from __future__ import annotations

import functools
import threading
from collections import deque

from mpi4py import MPI

from .. import settings
from .._runtime.call import Call
from . import progress

__all__ = ["ready_now", "later"]


def ready_now(call: Call) -> bool:
    """Whether ``call`` can start on the caller's thread without waiting for other ranks."""
    if call.alone or call.validate:     # (validate=True: the agreement step at the start)
        return True
    if not settings.get("MPICOLL_BACKGROUND_START") or not _library_allows():
        return True
    st = call._st
    if st.made and st.background is None:
        return True
    return progress.mode() != "thread"         # (thread mode needs MPI_THREAD_MULTIPLE)


@functools.lru_cache(maxsize=1)
def _library_allows() -> bool:
    """Only under MPICH (and its derivatives): under Open MPI 5 a first call set up in the
    background beside the user's own nonblocking collective on the communicator failed
    (``MPI_ERR_IN_STATUS`` in ``Waitall``, then a hang: tests/mpi/test_drop_in.py at 2 ranks),
    and testing an ``MPI_Comm_idup`` whose parent was freed crashed (again in issue 40, with
    this check lifted, Open MPI 5 at 2 ranks: tests/mpi/test_first_start.py's start-then-Ssend
    passed for all 8 starts, 20 runs each, then ``Free`` with the set-up pending ended in a
    segmentation fault in ``wait_posted``'s ``Testall`` of the ``Idup``)."""
    return "MPICH" in MPI.Get_library_version()


def later(call: Call, go, what: str, result):
    """``go()`` (the call's plan and start; returns the started request) on the
    communicator's background thread; returns the request that follows it, in flight now."""
    st = call._st
    st.start()          # the Idup, here: in its place among this rank's collectives on comm
    follower = progress.Request.following(what, st, result)
    with _lock:
        queue = st.background
        if queue is None:
            queue = Background(st)
            st.start_background(queue)
        queue.jobs.append((call, go, follower))
        if not queue.thread.is_alive() and not queue.started:
            queue.started = True
            queue.thread.start()
    return follower


_lock = threading.Lock()            # st.background and its queue


class Background:
    """The queue of first calls of one communicator, and the thread that starts them."""

    def __init__(self, st):
        self.st, self.jobs, self.started = st, deque(), False
        self.empty = threading.Event()
        self.thread = threading.Thread(target=self._guarded, name="mpicoll-setup", daemon=True)

    def _guarded(self) -> None:
        try:
            self._run()
        finally:                    # never leave a caller waiting for a thread that is gone
            with _lock:
                self.st.end_background(self)
                pending, self.jobs = list(self.jobs), deque()
            for _, _, follower in pending:
                follower.refuse(RuntimeError("mpicoll: the thread that starts a "
                                             "communicator's first calls stopped"))
            self.empty.set()

    def _run(self) -> None:
        while True:
            with _lock:
                if not self.jobs:
                    self.st.end_background(self)
                    self.empty.set()
                    break
                call, go, follower = self.jobs.popleft()
            try:
                inner = go()
            except BaseException as exc:    # noqa: BLE001 - the request's wait raises it
                try:
                    call.__exit__(type(exc), exc, exc.__traceback__)   # as a blocking call's
                finally:
                    follower.refuse(exc)
            else:
                follower.adopt(inner)
        if self.st.freed:       # freed while the set-up was under way: the duplicate now
            self.st.free_duplicate()

    def wait_empty(self) -> None:
        """Block until every queued call has started (not from the background thread)."""
        if threading.current_thread() is not self.thread:
            self.empty.wait()
