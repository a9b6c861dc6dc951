"""Waiting under a deadline, and the roll call that names the missing ranks when it passes.

A ``Watch`` goes with one collective call that has a timeout. ``wait`` polls the requests of a
step instead of blocking in ``MPI_Waitall``; when the deadline passes it runs a *roll call* and
raises ``CollectiveTimeout``:

1. the rank sends its status -- the call's tag and number, the step it is in, whether its own
   deadline passed, and the call's signature (its arguments as text, ``tags.signature``) -- to
   every other rank, with the tag ``MPI.TAG_UB`` that calls never use;
2. it collects the other ranks' status for up to ``ROLL_CALL_SECONDS``.

A rank that is waiting in a call with a timeout looks for such a message each time it polls,
and joins the roll call as soon as one arrives: the call cannot complete once a rank has given
up on it. So every rank that is in the call hears from every other one within a second of the
first timeout, and the ranks nobody hears from -- they never entered the call, exited or died --
are the culprits, named in ``CollectiveTimeout.peers``. (A rank that merely waits on another
waiting rank is not blamed: the ring's rank 1, waiting for rank 0, which waits for the missing
rank 2, names rank 2.) When ranks heard from the same call (same number) passed different
signatures, their messages could never match (the tags differ: ``tags.py``): every rank then
raises ``ArgumentMismatch`` naming who passed what, instead of ``CollectiveTimeout``.

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

from ..errors import ArgumentMismatch, CollectiveTimeout
from .tags import fields, tag_ub

__all__ = ["Watch", "ROLL_CALL_SECONDS"]

ROLL_CALL_SECONDS = 0.5     # how long a rank that gave up waits to hear from the others
_SPIN_SECONDS = 0.01        # poll (yielding the core) this long, then sleep 10 us .. 1 ms per poll


def roll_call_tag() -> int:
    """``MPI_TAG_UB``, which calls never use (``tags.layout``)."""
    return tag_ub()


def _test(requests) -> bool:
    """``MPI_Testall``; one request is tested alone: MPICH 5.0.2's Testall fails with
    MPI_ERR_IN_STATUS on a persistent collective request (``MPI_Allreduce_init``), its Test
    works."""
    return requests[0].Test() if len(requests) == 1 else MPI.Request.Testall(requests)


class Watch:
    """The deadline of one call and what this rank reports about itself in a roll call.

    Made for every call under a deadline (the default), so made cheaply: what the call sets
    later (``call.Call.label``) starts as class attributes, and ``abandoned`` (requests kept
    alive after a failure) is created when first used."""

    tag, number, signature = 0, -1, ""      # the call's tag, number and arguments (call.Call)
    calls = 1                               # how many call numbers the tags hold (tags.py)
    _abandoned = None

    def __init__(self, timeout: float, what: str, comm: MPI.Intracomm):
        self.timeout, self.deadline = timeout, time.monotonic() + timeout
        self.what, self.comm = what, comm

    @property
    def abandoned(self) -> list:
        if self._abandoned is None:
            self._abandoned = []
        return self._abandoned

    @abandoned.setter
    def abandoned(self, value: list) -> None:
        self._abandoned = value

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

    def give_up(self, requests, step, nsteps: int, peers, expired: bool) -> Exception:
        """Keep the unfinished requests alive, run the roll call, and return the error naming
        the ranks this one waits for (``peers`` of the unfinished ``requests``; all of
        ``peers`` when there are no requests) and those nobody heard from -- or, if the ranks
        in this call passed different arguments, the ``ArgumentMismatch`` naming who passed
        what."""
        done = [r.Test() for r in requests] if requests else [False] * len(peers)
        self.abandoned += requests
        waiting_on = {p for p, ok in zip(peers, done) if not ok}
        heard = self.roll_call(step if isinstance(step, int) else -1, expired)
        others = set(range(self.comm.Get_size())) - {self.comm.Get_rank()}
        missing = others - set(heard)
        signed = {r: sig for r, (_, number, _, _, sig) in heard.items()
                  if number == self.number and sig}
        if self.signature and any(sig != self.signature for sig in signed.values()):
            signed[self.comm.Get_rank()] = self.signature
            return mismatch(self.what, signed, missing, self.timeout if expired else None)
        strays = self.strays(missing) if self.signature else {}
        if strays:
            return stray_mismatch(self.what, self.signature, strays, missing,
                                  self.timeout if expired else None)
        return CollectiveTimeout(
            self.what, step, nsteps, waiting_on=waiting_on, missing=missing,
            elsewhere={r for r, (_, number, _, _, _) in heard.items() if number != self.number},
            gave_up={r for r, (_, _, _, e, _) in heard.items() if e},
            timeout=self.timeout if expired else None)

    def strays(self, ranks) -> dict:
        """``{rank: bytes}`` for each of ``ranks`` whose first unreceived message on mpicoll's
        duplicate is of this call (its number) but carries another tag: that rank passed other
        arguments, and left the call (a bcast root whose sends completed without this rank).
        Such messages are received and dropped (the communicator is broken anyway); a message of
        another call, or with this call's own tag, is left alone."""
        found, status = {}, MPI.Status()
        for rank in sorted(ranks):
            if self.comm.Iprobe(rank, MPI.ANY_TAG, status):
                tag = status.Get_tag()
                if tag != self.tag and tag % self.calls == self.number % self.calls:
                    nbytes = status.Get_count(MPI.BYTE)
                    self.comm.Recv(np.empty(nbytes, np.uint8), rank, tag)
                    found[rank] = nbytes
        return found

    def roll_call(self, step: int, expired: bool) -> dict:
        """Tell every other rank where this one is; return what was heard, ``{rank: (tag,
        number, step, expired, signature)}``."""
        comm, tag = self.comm, roll_call_tag()
        me, size = comm.Get_rank(), comm.Get_size()
        status = np.concatenate([np.array([self.tag, self.number, step, expired], np.int64)
                                 .view(np.uint8), np.frombuffer(self.signature.encode(), np.uint8)])
        self.abandoned += [status] + [comm.Isend(status, peer, tag)
                                      for peer in range(size) if peer != me]
        heard, probe = {}, MPI.Status()
        end = time.monotonic() + ROLL_CALL_SECONDS
        while len(heard) < size - 1 and time.monotonic() < end:
            if comm.Iprobe(MPI.ANY_SOURCE, tag, probe):
                msg = np.empty(probe.Get_count(MPI.BYTE), np.uint8)
                comm.Recv(msg, probe.Get_source(), tag)
                head = [int(v) for v in msg[:32].view(np.int64)]
                heard[probe.Get_source()] = (*head[:3], bool(head[3]), msg[32:].tobytes().decode())
            else:
                time.sleep(1e-4)
        return heard


def mismatch(what: str, signed: dict, missing=(), timeout: float | None = None):
    """The ``ArgumentMismatch`` for the ranks of one call whose signatures differ: ``signed`` is
    ``{rank: signature text}``; each differing field is shown with the ranks that passed each
    value ("count: 10 on rank(s) [0], 20 on rank(s) [1]")."""
    parsed = {r: fields(text) for r, text in sorted(signed.items())}
    names = []
    for values in parsed.values():
        names += [name for name in values if name not in names]
    parts, ranks, table = [], set(), {}
    for name in names:
        groups: dict = {}
        for r, values in parsed.items():
            groups.setdefault(values.get(name, "none"), []).append(r)
        if len(groups) > 1:
            ordered = sorted(groups.items(), key=lambda item: (-len(item[1]), item[1][0]))
            table[name] = dict(ordered)
            ranks.update(r for _, rs in ordered[1:] for r in rs)
            parts.append(f"{name}: " + ", ".join(f"{v} on rank(s) {rs}" for v, rs in ordered))
    how = f"timed out after {timeout:g} s" if timeout is not None else "gave up"
    text = (f"{what}: {how}: the ranks called it with different arguments, so their messages "
            f"could not match: " + "; ".join(parts))
    if missing:
        text += f"; rank(s) {sorted(missing)} did not answer the roll call"
    return ArgumentMismatch(text, ranks, table, in_flight=True)


def stray_mismatch(what: str, mine: str, strays: dict, missing, timeout: float | None):
    """The ``ArgumentMismatch`` for ranks that sent this call's messages with other arguments
    and left the call (``Watch.strays``): their arguments are not known here, only this rank's
    and the size of their message."""
    how = f"timed out after {timeout:g} s" if timeout is not None else "gave up"
    ranks = sorted(strays)
    shown = ", ".join(f"{strays[r]} bytes from rank {r}" for r in ranks)
    text = (f"{what}: {how}: rank(s) {ranks} sent this call's messages with other arguments "
            f"than this rank's ({' '.join(f'{k}={v}' for k, v in fields(mine).items())}): the "
            f"hash of the arguments in their tag differs ({shown}); they did not answer the "
            "roll call (their part of the call needed nothing from this rank)")
    others = sorted(set(missing) - set(ranks))
    if others:
        text += f"; rank(s) {others} did not answer the roll call either"
    return ArgumentMismatch(text, ranks, {}, in_flight=True)
