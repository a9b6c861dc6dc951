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
write into them if a missing rank turns up later. mpi4py keeps a point-to-point request's buffer
alive, but not a nonblocking collective's (``MPI_Iallreduce`` ...): those are kept beside their
requests (``wait``'s ``keep``, ``kept``).
"""

from __future__ import annotations

import os
import time

import numpy as np
from mpi4py import MPI

from .. import idle
from ..errors import ArgumentMismatch, CollectiveTimeout
from . import detector, notice
from .tags import fields, tag_ub
from .validate import differences

__all__ = ["Watch", "ROLL_CALL_SECONDS", "LOOK_AFTER", "LOOK_EVERY"]

ROLL_CALL_SECONDS = 0.5     # how long a rank that gave up waits to hear from the others
_SPIN_SECONDS = 0.01        # poll (yielding the core) this long, then sleep 10 us .. 1 ms per poll
_CROWDED_SPIN_SECONDS = 20e-6   # ... this long in a crowded process (``idle.crowded``), whose
                                # sleeps stay at 10 us for ``idle.NAPS_SECONDS``, then double
LOOK_AFTER = 0.02           # a wait this long looks for other ranks' notices and strays ...
LOOK_EVERY = 0.05           # ... and again this often (``Watch.look``)
_RESERVED = 5               # tags TAG_UB - 4 .. TAG_UB: the detector's agreement and heartbeats,
                            # notices, presence check, roll call


def kept(requests, buffers) -> tuple:
    """An item of ``abandoned`` (and ``CommState.abandoned``) that keeps ``buffers`` alive while
    any of ``requests`` is unfinished (``context.release``): the buffers of nonblocking
    collectives, which mpi4py does not keep alive -- without this, a rank that arrives after
    the others gave up completes the collective into memory freed and maybe reused."""
    return list(requests), tuple(buffers)


def roll_call_tag() -> int:
    """``MPI_TAG_UB``, which calls never use (``tags.tag_space``)."""
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
    seen = None                 # what ``look`` found: (rank, tag) of a message of another call
    history, previous = 0, ""   # the running hash after this call, the previous call's signature

    def __init__(self, timeout: float, what: str, comm: MPI.Intracomm):
        self.timeout, self.deadline = timeout, time.monotonic() + timeout
        self.what, self.comm = what, comm
        self.next_look = 0.0                # 0: set by the first wait that outlasts the spin

    @property
    def abandoned(self) -> list:
        if self._abandoned is None:
            self._abandoned = []
        return self._abandoned

    @abandoned.setter
    def abandoned(self, value: list) -> None:
        self._abandoned = value

    def wait(self, requests, step, nsteps: int = 0, peers=(), heed_roll_call=False,
             keep=()) -> None:
        """Complete ``requests``, or (deadline passed, or a roll call came) raise CollectiveTimeout.

        ``step`` is the step index (of ``nsteps``) or a phrase; ``peers`` the rank of each request.
        ``heed_roll_call``: raise if a roll call came even when the requests are complete.
        ``keep``: the buffers of the collectives among ``requests``, kept alive with them if
        the wait raises.
        """
        try:
            self._wait(requests, step, nsteps, peers, heed_roll_call)
        except BaseException:
            if keep:
                self.abandoned.append(kept(requests, keep))
            raise

    def _wait(self, requests, step, nsteps: int, peers, heed_roll_call: bool) -> None:
        tag = roll_call_tag()
        start, pause = time.monotonic(), 1e-5
        naps = idle.crowded()       # (the MPI library moves a collective only inside a poll:
        spin = _CROWDED_SPIN_SECONDS if naps else _SPIN_SECONDS     # naps, not long sleeps)
        while not _test(requests) or (
                heed_roll_call and self.comm.Iprobe(MPI.ANY_SOURCE, tag)):
            now = time.monotonic()
            expired = now > self.deadline
            if expired or self.comm.Iprobe(MPI.ANY_SOURCE, tag):
                raise self.give_up(requests, step, nsteps, peers, expired)
            if now - start < spin:
                os.sched_yield()        # let the rank we wait for run, if it shares our core
            else:
                if now >= self.next_look:
                    self.look(now, requests, step, nsteps, peers)
                time.sleep(pause)
                pause = idle.next_pause(pause, now - start, naps)

    def poll(self, requests, step, nsteps: int = 0, peers=()) -> bool:
        """One look, for the progress executor: True when ``requests`` are complete; raise
        CollectiveTimeout as ``wait`` does when the deadline has passed or a roll call came."""
        if MPI.Request.Testall(requests):
            return True
        now = time.monotonic()
        expired = now > self.deadline
        if expired or self.comm.Iprobe(MPI.ANY_SOURCE, roll_call_tag()):
            raise self.give_up(requests, step, nsteps, peers, expired)
        if now >= self.next_look:
            self.look(now, requests, step, nsteps, peers)
        return False

    def overdue(self, step, nsteps: int = 0, waiting_on=()) -> None:
        """For a wait on something other than MPI requests (a flag in shared memory): raise
        CollectiveTimeout as ``wait`` does when the deadline has passed or a roll call came,
        naming ``waiting_on``; else return."""
        now = time.monotonic()
        expired = now > self.deadline
        if expired or self.comm.Iprobe(MPI.ANY_SOURCE, roll_call_tag()):
            raise self.give_up([], step, nsteps, waiting_on, expired)
        if now >= self.next_look:
            self.look(now, [], step, nsteps, waiting_on)

    def look(self, now: float, requests, step, nsteps: int, peers) -> None:
        """A wait that outlasts ``LOOK_AFTER``: look (then every ``LOOK_EVERY`` s) for what
        the other ranks say without being asked --

        * a notice (``notice.py``): a rank's own call failed, or it gave up on one: raise its
          ``PeerError`` (the unfinished requests kept alive);
        * a message of this call with another tag than this rank's (the other rank passed
          other arguments: ``tags.py``), or of an earlier call with another tag than the one
          this rank used there (the ranks' calls diverged earlier: a skipped call, a bcast
          whose roots disagreed): run the roll call now, not at the deadline, so that every
          rank raises ``ArgumentMismatch`` naming who passed what.

        Costs a call that completes within ``LOOK_AFTER`` nothing; a longer wait, one
        ``MPI_Iprobe`` for notices and one per rank of the communicator every ``LOOK_EVERY``."""
        if self.next_look == 0.0:
            self.next_look = now + LOOK_AFTER
            return
        self.next_look = now + LOOK_EVERY
        comm = self.comm
        state = self.heed_notices(requests)
        if state is None:
            return
        if self.number < 0 or not self.signature or not state.made or not comm == state.comm:
            return                  # no tag yet (the first call's presence check, Idup)
        seen = self.stray(comm, state)
        if seen is not None:
            self.seen = seen
            raise self.give_up(requests, step, nsteps, peers, False)

    def heed_notices(self, requests=()):
        """Read the notices that have come (``notice.py``) and raise the ``PeerError`` they
        mean for this call, if any (``requests`` kept alive); returns the communicator's state
        (None: not mpicoll's)."""
        comm = self.comm
        state = notice.lookup(comm)
        if state is None:
            return None
        w = state.watched
        if w is not None:               # a rank died (or revoked): before any notice, which
            detector.tick()             # the death may have caused
            if w.known or w.revoked_by is not None:
                error = detector.failure(state, self.what)
                if error is not None:
                    self.abandoned += list(requests)
                    raise error
        if comm.Iprobe(MPI.ANY_SOURCE, notice.notice_tag()):
            state.add_notices(notice.collect(comm))
        if state.notices:
            numbered = self.number >= 0     # else: the first call's presence check, Idup
            error = notice.judge(state, state.absolute(self.number) if numbered
                                 else state.calls + 1, self.what)
            if error is not None:
                error.in_flight = numbered or state._dup is not None
                self.abandoned += list(requests)
                raise error
        return state

    def stray(self, comm, state):
        """``(rank, tag)`` of the first message from another rank that cannot be this call's
        nor an earlier one's as this rank made it (see ``look``), or None."""
        status, calls, top = MPI.Status(), self.calls, tag_ub() - _RESERVED
        me = comm.Get_rank()
        for rank in range(comm.Get_size()):
            if rank == me or not comm.Iprobe(rank, MPI.ANY_TAG, status):
                continue
            tag = status.Get_tag()
            if tag > top:
                continue
            number = tag % calls
            if number == self.number % calls:
                if tag != self.tag:
                    return rank, tag
                continue
            # a recent call's (counted back from the latest call this rank made: a persistent
            # handle's watch keeps the number of its init, maybe long ago)
            back = (state.calls - number) % calls
            if back < len(state.recent) and state.recent[number % len(state.recent)] not in (
                    -1, tag):
                return rank, tag
        return None

    def give_up(self, requests, step, nsteps: int, peers, expired: bool) -> Exception:
        """Keep the unfinished requests alive, run the roll call, and return the error naming
        the ranks this one waits for (``peers`` of the unfinished ``requests``; all of
        ``peers`` when there are no requests) and those nobody heard from -- or, if the ranks
        in this call passed different arguments (or made different calls before it), the
        ``ArgumentMismatch`` naming who passed what."""
        done = [r.Test() for r in requests] if requests else [False] * len(peers)
        self.abandoned += requests
        waiting_on = {p for p, ok in zip(peers, done) if not ok}
        why = FOUND if self.seen is not None else EXPIRED if expired else JOINED
        heard = self.roll_call(step if isinstance(step, int) else -1, why)
        me = self.comm.Get_rank()
        others = set(range(self.comm.Get_size())) - {me}
        missing = others - set(heard)
        found = why == FOUND or any(h[3] == FOUND for h in heard.values())
        timeout = self.timeout if expired else None
        same = {r: h for r, h in heard.items() if h[1] == self.number and h[4]}
        if self.signature and any(h[4] != self.signature for h in same.values()):
            signed = {r: h[4] for r, h in same.items()}
            signed[me] = self.signature
            before = {r: h[6] for r, h in same.items()}
            before[me] = self.previous
            return mismatch(self.what, signed, missing, timeout, found=found, before=before)
        if self.signature and any(h[5] != self.history for h in same.values()):
            before = {r: h[6] for r, h in same.items()}
            before[me] = self.previous
            return diverged(self.what, before, missing, timeout, found=found)
        # A rank still in the call before this one, which found that the ranks had made it with
        # other arguments (a bcast whose ranks passed different roots: this rank's part of it
        # completed, that rank's did not): that call's mismatch, not "in another call"
        earlier = {r: h[4] for r, h in heard.items()
                   if (self.number - h[1]) % self.calls == 1 and h[4] and h[4] != self.previous}
        if self.signature and self.previous and earlier:
            earlier[me] = self.previous
            return mismatch(f"{self.what}: the call before it on this communicator", earlier,
                            missing, timeout, found=found)
        strays = self.strays(missing) if self.signature else {}
        if strays:
            return stray_mismatch(self.what, self.signature, strays, missing, timeout,
                                  found=found)
        if self.seen is not None:
            rank, tag = self.seen
            return ArgumentMismatch(
                f"{self.what}: rank {rank} sent a message of this call or of a recent one with "
                f"another tag ({tag}) than this rank's ({self.tag}): its arguments, or the calls "
                "it made before, differ from this rank's", [rank], in_flight=True)
        return CollectiveTimeout(
            self.what, step, nsteps, waiting_on=waiting_on, missing=missing,
            elsewhere={r for r, h in heard.items() if h[1] != self.number},
            gave_up={r for r, h in heard.items() if h[3] == EXPIRED},
            timeout=timeout)

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

    def roll_call(self, step: int, why: int) -> dict:
        """Tell every other rank where this one is; return what was heard, ``{rank: (tag,
        number, step, why, signature, history, previous signature)}``; ``why``: ``JOINED``
        (another rank's roll call), ``EXPIRED`` (this rank's deadline), ``FOUND`` (``look``
        found a message of another signature)."""
        comm, tag = self.comm, roll_call_tag()
        me, size = comm.Get_rank(), comm.Get_size()
        text = f"{self.signature}\n{self.previous}".encode()
        status = np.concatenate([np.array([self.tag, self.number, step, why, self.history],
                                          np.int64).view(np.uint8), np.frombuffer(text, np.uint8)])
        self.abandoned += [status] + [comm.Isend(status, peer, tag)
                                      for peer in range(size) if peer != me]
        heard, probe = {}, MPI.Status()
        end = time.monotonic() + ROLL_CALL_SECONDS
        while len(heard) < size - 1 and time.monotonic() < end:
            if comm.Iprobe(MPI.ANY_SOURCE, tag, probe):
                msg = np.empty(probe.Get_count(MPI.BYTE), np.uint8)
                comm.Recv(msg, probe.Get_source(), tag)
                head = [int(v) for v in msg[:40].view(np.int64)]
                sig, _, previous = msg[40:].tobytes().decode().partition("\n")
                heard[probe.Get_source()] = (*head[:4], sig, head[4], previous)
            else:
                time.sleep(1e-4)
        return heard


JOINED, EXPIRED, FOUND = 0, 1, 2      # why a rank runs the roll call


def _how(timeout: float | None, found: bool) -> str:
    if found:
        return "found while the ranks waited, before the deadline"
    return f"timed out after {timeout:g} s" if timeout is not None else "gave up"


def diverged(what: str, before: dict, missing=(), timeout: float | None = None, *,
             found: bool = False):
    """The ``ArgumentMismatch`` for ranks of one call whose arguments agree but whose earlier
    calls on the communicator differ (``before``: ``{rank: previous call's signature}``)."""
    groups: dict = {}
    for r, text in sorted(before.items()):
        groups.setdefault(text or "none", []).append(r)
    ordered = sorted(groups.items(), key=lambda item: (-len(item[1]), item[1][0]))
    ranks = [r for _, rs in ordered[1:] for r in rs]
    if len(ordered) > 1:
        shown = "the call before this one: " + ", ".join(f"'{v}' on rank(s) {rs}"
                                                          for v, rs in ordered)
    else:
        shown = f"the call before this one agrees ('{ordered[0][0]}'); an earlier one differs"
    text = (f"{what}: {_how(timeout, found)}: the ranks' earlier calls on this communicator "
            "differ, so their messages could not match (a call made on some ranks only, or an "
            "earlier call whose arguments differed yet completed, as a bcast whose ranks passed "
            f"different roots): {shown}")
    if missing:
        text += f"; rank(s) {sorted(missing)} did not answer the roll call"
    return ArgumentMismatch(text, ranks, {"previous call": dict(ordered)}, in_flight=True)


def mismatch(what: str, signed: dict, missing=(), timeout: float | None = None, *,
             found: bool = False, before: dict | None = None):
    """The ``ArgumentMismatch`` for the ranks of one call whose signatures differ: ``signed`` is
    ``{rank: signature text}``; each differing field is shown with the ranks that passed each
    value ("count: 10 on rank(s) [0], 20 on rank(s) [1]"). With ``before`` (``{rank: previous
    call's signature}``), ranks that repeat their previous call while the others moved on from
    it are named: a likely extra call (``repeated``)."""
    parsed = {r: fields(text) for r, text in sorted(signed.items())}
    names = []
    for values in parsed.values():
        names += [name for name in values if name not in names]
    ranks, table = set(), {}
    for name in names:
        groups: dict = {}
        for r, values in parsed.items():
            groups.setdefault(values.get(name, "none"), []).append(r)
        if len(groups) > 1:
            ordered = sorted(groups.items(), key=lambda item: (-len(item[1]), item[1][0]))
            table[name] = dict(ordered)
            ranks.update(r for _, rs in ordered[1:] for r in rs)
    how = _how(timeout, found)
    text = (f"{what}: {how}: the ranks called it with different arguments, so their messages "
            f"could not match: " + "; ".join(differences(table)))
    if missing:
        text += f"; rank(s) {sorted(missing)} did not answer the roll call"
    text += repeated(signed, before or {})
    return ArgumentMismatch(text, ranks, table, in_flight=True)


def repeated(signed: dict, before: dict) -> str:
    """A hint for a mismatch where some ranks make the same call again while every other rank
    made that call last and now makes another: the repeating ranks likely made one call more
    (a skipped call whose arguments matched: not caught in the call itself), so the others'
    previous call paired with their extra one and its result there may be wrong."""
    again = sorted(r for r, sig in signed.items() if sig and sig == before.get(r))
    if not again or len(again) == len(signed):
        return ""
    call = signed[again[0]]
    if any(signed[r] != call for r in again) or any(
            before.get(r) != call or signed[r] == call for r in signed if r not in again):
        return ""
    others = sorted(set(signed) - set(again))
    return (f"; rank(s) {again} repeat their previous call ({call}), which rank(s) {others} made "
            f"last: if rank(s) {again} made it once more than the others, the others' previous "
            "call paired with their extra one and its result there may be wrong (calls with "
            "the same arguments are told apart only with validate=\"callsite\")")


def stray_mismatch(what: str, mine: str, strays: dict, missing, timeout: float | None, *,
                   found: bool = False):
    """The ``ArgumentMismatch`` for ranks that sent this call's messages with other arguments
    and left the call (``Watch.strays``): their arguments are not known here, only this rank's
    and the size of their message."""
    how = _how(timeout, found)
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
