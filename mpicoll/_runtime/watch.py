"""Waiting under a deadline, and the roll call that names the missing ranks when it passes.

A ``Watch`` goes with one collective call that has a timeout. ``wait`` polls the requests of a
step instead of blocking in ``MPI_Waitall``; when the deadline passes it runs a *roll call* and
raises ``CollectiveTimeout``:

1. the rank sends its status -- the call's tag, the step it is in, whether its own deadline
   passed -- to every other rank, with the tag ``MPI.TAG_UB`` that calls never use;
2. it collects the other ranks' status for up to ``ROLL_CALL_SECONDS``.

A rank that is waiting in a call with a timeout looks for such a message each time it polls,
and joins the roll call as soon as one arrives: the call cannot complete once a rank has given
up on it. So every rank that is in the call hears from every other one within a second of the
first timeout, and the ranks nobody hears from -- they never entered the call, exited or died --
are the culprits, named in ``CollectiveTimeout.peers``. (A rank that merely waits on another
waiting rank is not blamed: the ring's rank 1, waiting for rank 0, which waits for the missing
rank 2, names rank 2.)

The roll call travels on mpicoll's private duplicate of the communicator -- except while that
duplicate is being created (the first call on a communicator), when it uses the caller's.
Requests left unfinished are kept in ``abandoned`` so their buffers stay alive: MPI may still
write into them if a missing rank turns up later.
"""

from __future__ import annotations

import os
import time

import numpy as np
from mpi4py import MPI

from ..errors import CollectiveTimeout

__all__ = ["Watch", "ROLL_CALL_SECONDS"]

ROLL_CALL_SECONDS = 0.5     # how long a rank that gave up waits to hear from the others
_SPIN_SECONDS = 0.01        # poll (yielding the core) this long, then sleep 10 us .. 1 ms per poll
_tag_ub = None


def roll_call_tag() -> int:
    global _tag_ub
    if _tag_ub is None:
        _tag_ub = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)
    return _tag_ub


def _test(requests) -> bool:
    """``MPI_Testall``; one request is tested alone: MPICH 5.0.2's Testall fails with
    MPI_ERR_IN_STATUS on a persistent collective request (``MPI_Allreduce_init``), its Test
    works."""
    return requests[0].Test() if len(requests) == 1 else MPI.Request.Testall(requests)


class Watch:
    """The deadline of one call and what this rank reports about itself in a roll call."""

    def __init__(self, timeout: float, what: str, comm: MPI.Intracomm):
        self.timeout, self.deadline = timeout, time.monotonic() + timeout
        self.what, self.comm, self.tag = what, comm, 0
        self.abandoned: list = []

    def wait(self, requests, step, nsteps: int = 0, peers=(), heed_roll_call=False) -> None:
        """Complete ``requests``, or (deadline passed, or a roll call came) raise CollectiveTimeout.

        ``step`` is the step index (of ``nsteps``) or a phrase; ``peers`` the rank of each request.
        ``heed_roll_call``: raise if a roll call came even when the requests are complete.
        """
        tag = roll_call_tag()
        start, pause = time.monotonic(), 1e-5
        while not _test(requests) or (
                heed_roll_call and self.comm.Iprobe(MPI.ANY_SOURCE, tag)):
            now = time.monotonic()
            expired = now > self.deadline
            if expired or self.comm.Iprobe(MPI.ANY_SOURCE, tag):
                raise self.give_up(requests, step, nsteps, peers, expired)
            if now - start < _SPIN_SECONDS:
                os.sched_yield()        # let the rank we wait for run, if it shares our core
            else:
                time.sleep(pause)
                pause = min(2 * pause, 1e-3)

    def poll(self, requests, step, nsteps: int = 0, peers=()) -> bool:
        """One look, for the progress executor: True when ``requests`` are complete; raise
        CollectiveTimeout as ``wait`` does when the deadline has passed or a roll call came."""
        if MPI.Request.Testall(requests):
            return True
        expired = time.monotonic() > self.deadline
        if expired or self.comm.Iprobe(MPI.ANY_SOURCE, roll_call_tag()):
            raise self.give_up(requests, step, nsteps, peers, expired)
        return False

    def overdue(self, step, nsteps: int = 0, waiting_on=()) -> None:
        """For a wait on something other than MPI requests (a flag in shared memory): raise
        CollectiveTimeout as ``wait`` does when the deadline has passed or a roll call came,
        naming ``waiting_on``; else return."""
        expired = time.monotonic() > self.deadline
        if expired or self.comm.Iprobe(MPI.ANY_SOURCE, roll_call_tag()):
            raise self.give_up([], step, nsteps, waiting_on, expired)

    def give_up(self, requests, step, nsteps: int, peers, expired: bool) -> CollectiveTimeout:
        """Keep the unfinished requests alive, run the roll call, and return the error naming
        the ranks this one waits for (``peers`` of the unfinished ``requests``; all of
        ``peers`` when there are no requests) and those nobody heard from."""
        done = [r.Test() for r in requests] if requests else [False] * len(peers)
        self.abandoned += requests
        waiting_on = {p for p, ok in zip(peers, done) if not ok}
        heard = self.roll_call(step if isinstance(step, int) else -1, expired)
        others = set(range(self.comm.Get_size())) - {self.comm.Get_rank()}
        return CollectiveTimeout(
            self.what, step, nsteps, waiting_on=waiting_on, missing=others - set(heard),
            elsewhere={r for r, (t, _, _) in heard.items() if t != self.tag},
            gave_up={r for r, (_, _, e) in heard.items() if e},
            timeout=self.timeout if expired else None)

    def roll_call(self, step: int, expired: bool) -> dict:
        """Tell every other rank where this one is; return what was heard, ``{rank: (tag, step,
        expired)}``."""
        comm, tag = self.comm, roll_call_tag()
        me, size = comm.Get_rank(), comm.Get_size()
        status = np.array([self.tag, step, expired], np.int64)
        self.abandoned += [comm.Isend(status, peer, tag) for peer in range(size) if peer != me]
        heard, msg, probe = {}, np.empty(3, np.int64), MPI.Status()
        end = time.monotonic() + ROLL_CALL_SECONDS
        while len(heard) < size - 1 and time.monotonic() < end:
            if comm.Iprobe(MPI.ANY_SOURCE, tag, probe):
                comm.Recv(msg, probe.Get_source(), tag)
                heard[probe.Get_source()] = tuple(int(v) for v in msg)
            else:
                time.sleep(1e-4)
        return heard
