"""One collective call's reliability options: ``timeout``, ``on_timeout``, ``validate``.

    with Call("allreduce", algorithm, comm, timeout, on_timeout, validate) as call:
        ...                          # this rank's own argument checks
        call.agree(...)              # validate=True: the agreement step (_runtime.validate)
        call.open() ... call.mpi(...)  # communicate: mpicoll's duplicate, the deadline, the tag

Unset options come from the environment: ``MPICOLL_TIMEOUT`` (seconds; unset: 600, the default
deadline, ``settings.DEFAULT_TIMEOUT``; ``0``: none),
``MPICOLL_ON_TIMEOUT`` (``exception`` or ``abort``), ``MPICOLL_VALIDATE`` (``0`` or ``1``), read
once, at the first call (``mpicoll.settings``; ``settings.reload()`` reads them again).

With a timeout the clock starts here: the deadline covers everything after, the creation of
mpicoll's duplicate communicator (first call) included, except the time spent compiling or
loading a numba kernel (local work under a file lock, no other rank involved: ``plan._warmup``
adds it to the deadline).

The call's tag is its number on the communicator folded with a hash of its arguments (``tags``):
``open`` takes the number, ``agree`` -- which every collective calls, with its arguments, before
it communicates -- the hash. So ranks that pass different arguments never match each other's
messages; the roll call then names who passed what (``ArgumentMismatch``). The MPI library's own
collectives (``algorithm="mpi"``) take no tag: under a deadline, without ``validate``, ``agree``
runs one small ``MPI_Iallreduce`` of the hash instead (MAX of it and of its negation), and on a
mismatch every rank raises ``ArgumentMismatch`` (MPICH's nonblocking collectives otherwise
return a wrong result silently when counts differ). A held call started again (``Buckets``'
buckets, the torch backend's kept calls: ``in_request``; their first start checks as any call)
does not wait for that: its request posts the check's ``MPI_Iallreduce`` with the collective and
checks it first (``library_check``: with ``validate``'s fingerprint, so the error names the
differing arguments' extremes); a mismatch then fails the request on every rank and breaks the
communicator (``check_failed``), as a nonblocking schedule's does.

On the way out the call handles failures:

* with ``validate``, a rank whose own checks failed (a bad argument or option, a bad setting, any
  error before the agreement step) still takes part in the agreement step, flagged, so that the
  other ranks raise ``ArgumentMismatch`` naming it instead of waiting for it; it raises its own
  error. Nothing that can fail on one rank only runs after the agreement step (``api``);
* ``CollectiveTimeout`` (or an interrupt, or an ``ArgumentMismatch`` found by the roll call)
  marks the communicator broken -- messages of the failed call may still be in flight, so
  later calls raise ``CommunicatorBroken`` -- and with ``on_timeout="abort"`` prints the error
  and calls ``comm.Abort``, so a batch job ends (and ``os._exit``, should ``MPI_Abort``
  return: the error never reaches the caller).
"""

from __future__ import annotations

import math
import os
import sys
import time
import zlib
from typing import NoReturn

import numpy as np
from mpi4py import MPI

from .. import settings
from ..errors import (ArgumentMismatch, CollectiveTimeout, CommunicatorBroken, PeerError,
                      ProcessFailed)
from . import detector, notice, tags, validate
from .context import CommState, attach, enter, leave
from .watch import Watch

__all__ = ["Call", "ABORT_CODE", "failed", "interrupted", "breaks", "disagree",
           "agree_library_hash"]

ABORT_CODE = 124        # the job's MPI_Abort error code after a timeout (as timeout(1) exits)


class Call:
    def __init__(self, collective: str, algorithm: str, comm, timeout, on_timeout, validate):
        if comm is None:
            comm = MPI.COMM_WORLD
        if isinstance(comm, MPI.Comm) and comm == MPI.COMM_NULL:
            raise TypeError("comm is MPI.COMM_NULL (a communicator that was freed, "
                            "comm.Free(), or never created): pass a live communicator")
        if not isinstance(comm, MPI.Intracomm):
            raise TypeError(f"comm must be an MPI intracommunicator, got {comm!r}")
        self.collective, self.comm = collective, comm
        # (read now: a call started in the background (executors/background.py) may run after comm.Free())
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.alone = self.size == 1
        self._st = attach(comm)
        # local: from now on freeing comm drops mpicoll's stray messages; one thread at a time
        self._owner = not self.alone
        if self._owner:
            enter(self._st, collective)
        self.agreed, self.tag, self._state = False, 0, None
        self.chained = 0                            # the signature's hash folded with the history
        self.number, self.signature = -1, None      # the call's number, its tags.Signature
        self._agreed_on = None                      # agree's (algorithm, fields)
        # a held call's later start (``Prepared.start``): the MPI library's hash check under a
        # deadline is then its request's first step (``owed``), not a wait here
        self.in_request = self.owed = False
        self.watch, self.timeout, self.on_timeout = None, None, "exception"
        self.error: Exception | None = None     # a bad option: raised by __enter__
        self.callsite = validate == "callsite" and not self.alone
        if self.callsite:
            validate = False
        try:
            self.validate = (settings.get("MPICOLL_VALIDATE") if validate is None
                             else _validate(validate)) and not self.alone
        except (TypeError, ValueError) as error:
            # whether the others validate is unknown; a truthy value most likely means they do
            self.validate, self.error = bool(validate) and not self.alone, error
        try:
            self.timeout = (settings.get("MPICOLL_TIMEOUT") if timeout is None
                            else _timeout(timeout, "timeout"))
            self.on_timeout = (settings.get("MPICOLL_ON_TIMEOUT") if on_timeout is None
                               else _on_timeout(on_timeout, "on_timeout"))
        except ValueError as error:
            self.error = self.error or error
        if self.timeout is not None and not self.alone:      # alone, nothing waits
            self.watch = Watch(self.timeout, f"{collective} {algorithm}", comm)

    def open(self) -> CommState:
        """mpicoll's state of the communicator, ready for this call; the first use takes the
        call's tag. Communicates: on a communicator's first use it completes mpicoll's
        duplicate and finds the node layout (collective), under the deadline if any."""
        if self._state is None:
            st = self._st
            st.check(self.collective)
            self._state = st
            if not st.made or st.background is not None:
                st.ready(self.watch)
            self.number = self.tag = st.next_number()      # the hash comes with agree
            if self.watch is not None:
                self.watch.comm = st.comm
            if self.signature is not None:
                self._label()
        return self._state

    def _label(self) -> None:
        """The tag: the call's number, and its arguments' hash (folded with the history of the
        calls before it: ``CommState.label``) once ``agree`` gave them."""
        sig = self.signature
        if sig is None:
            self.tag = self.number
        elif not self.chained:
            self.chained = (sig.hashed ^ self._state.history) or 1
            st = self._state
            self._unlabel = st.history_mark()
            self.tag = st.label(self.number, sig)
            self._marks = st.history, "" if st.before is None else st.before.text
        if self.watch is not None:
            self.label(self.watch)

    def label(self, watch) -> None:
        """Give ``watch`` this call's tag, number and signature (for the roll call)."""
        watch.tag, watch.number, watch.calls = self.tag, self.number, self._state.tags.calls
        watch.signature = "" if self.signature is None else self.signature.text
        if self.chained:
            watch.history, watch.previous = self._marks

    def agree(self, algorithm: str, **fields) -> None:
        """Name the algorithm about to run and the arguments every rank must agree on: they
        enter the call's tag (``tags``); with ``validate``, check every rank agrees on them all;
        for the MPI library's own algorithm under a deadline, check their hash.

        ``fields`` are those of ``mpicoll.validate.fingerprint`` (op, dtype, count, root, ...).
        """
        watch = self.watch
        if watch is not None:
            watch.what = f"{self.collective} {algorithm}"
        if self.alone:          # no message to tag, no one to disagree with
            return
        if self.callsite:
            fields = {**fields, "site": _callsite()}
        self.signature = sig = tags.signature(self.collective, algorithm, fields)
        self._agreed_on = (algorithm, fields)
        if self._state is not None:
            self._label()
        if self.agreed:
            return
        if self.validate:
            self.agreed = True
            validate.check(self.open().comm, validate.fingerprint(
                self.collective, algorithm, timeout=self.timeout is not None, **fields),
                self.watch)
        elif sig.library and watch is not None:
            self.agreed = True
            if self.in_request:     # (a start must not wait for the other ranks)
                self.owed = True
            else:
                self._agree_hash(algorithm, fields)

    def _agree_hash(self, algorithm: str, fields: dict) -> None:
        """``agree_library_hash`` for this call (``_label`` gave it its number and history)."""
        agree_library_hash(self.open().comm, self.collective, self._agreed_on,
                           self.signature.hashed, self._unlabel, self.watch)

    def library_check(self) -> list | None:
        """What a request that owes this call's argument check (``owed``) exchanges first, with
        one ``MPI_Iallreduce`` (MAX of it and of its negation: ``progress.Request``): the
        fingerprint ``validate=True`` checks, and the hash ``agree_library_hash`` would check
        (the signature's, folded with the history before it); None when none is owed."""
        if not self.owed:
            return None
        self.open()                     # (labelled: ``chained`` is set)
        algorithm, fields = self._agreed_on
        return validate.fingerprint(self.collective, algorithm, timeout=True, **fields) + [
            self.chained]

    def check_failed(self, high, low, mine) -> ArgumentMismatch:
        """The error of a request whose check (``library_check``) found the ranks differ
        (``high``, ``low``: each entry's largest and smallest over the ranks). Every rank found
        it, in the same step, and none started the collective; but other calls may have
        started since on some ranks, so nothing more is exchanged (as ``disagree`` would) and
        the communicator is broken (``in_flight``). Named: each differing argument's largest
        and smallest value and this rank's; ``validate=True`` names every rank's."""
        named = validate.spread(high, low, mine) or [
            "the same arguments, but their earlier calls on this communicator differ (a call "
            "made on some ranks only, or with other arguments, that completed anyway)"]
        return ArgumentMismatch(
            f"{self.collective} {self._agreed_on[0]}: the ranks started it with different "
            "arguments (the argument check of the MPI library's nonblocking collective under a "
            f"deadline): {'; '.join(named)}; the communicator is broken (validate=True names "
            "every rank's arguments, before the start)", in_flight=True)

    def disagree(self, step: str, seen: str = "") -> NoReturn:
        """The ranks' signature hashes differ (every rank found out, so this is collective):
        exchange the fingerprints of ``agree``'s fields and raise ``ArgumentMismatch`` naming
        who passed what."""
        earlier = None
        if self.chained:            # (the history before this call, the call before it)
            history, _, last = self._unlabel
            earlier = history, "" if last is None else last.text
        disagree(self.open().comm, self.collective, self._agreed_on, self.timeout is not None,
                 self.watch, step, earlier, seen)

    def mpi(self, blocking, nonblocking, *args, **kwargs) -> None:
        """The MPI library's own collective on mpicoll's duplicate: ``blocking`` (e.g.
        ``MPI.Comm.Allreduce``) without a timeout, else ``nonblocking`` (``MPI.Comm.Iallreduce``)
        polled under the deadline."""
        comm = self.open().comm
        if self.watch is None:
            blocking(comm, *args, **kwargs)
        else:
            self.watch.wait([nonblocking(comm, *args, **kwargs)], "MPI_" + nonblocking.__name__,
                            keep=args)

    def __enter__(self) -> "Call":
        if self.error is not None:          # a bad option of this call: as a bad argument
            try:
                self._reject(self.error)
                self._tell(self.error)
            finally:
                self._leave()
            raise self.error
        return self

    def __exit__(self, kind, exc, tb) -> bool:
        try:
            if exc is None:
                return False
            if isinstance(exc, MPI.Exception) and self._state is not None:
                # the MPI library failed inside the call (a peer's death breaks its
                # connections): a failure of the call, named by the detector if it can
                error = interrupted(self._state, self.watch, self.on_timeout, self.comm, exc,
                                    f"{self.collective}")
                raise error from exc
            if isinstance(exc, PeerError) or breaks(exc):
                if breaks(exc):
                    self._failed(exc)
            elif isinstance(exc, Exception) and not isinstance(exc, CommunicatorBroken):
                if self.chained and not self._state.broken:
                    # failed before communicating (validate's or the hash check's mismatch):
                    # as if not called, on every rank alike, so the histories stay equal
                    self._state.rewind(self._unlabel)
                self._reject(exc)
                self._tell(exc)
        finally:
            self._leave()
        return False

    def _leave(self) -> None:
        if self._owner:
            self._owner = False
            leave(self._st)

    def _tell(self, exc: BaseException) -> None:
        """This rank's call raised ``exc`` (its own error, not one of the call's): tell the
        other ranks of the call at once (``notice``), so they raise ``PeerError`` instead of
        waiting for this rank until their deadline. Before the call's transfers (``agree``
        not reached) the communicator stays usable here; after them it is broken. With
        ``validate`` the agreement step told them already."""
        if self.alone or self.agreed:
            return
        st = self._st
        if st.broken:
            return
        if st.background is not None and self._state is None:
            st.background.wait_empty()      # calls started in the background come first
        if self._state is not None:         # numbered already
            call = st.calls
        elif st.made:                       # take this call's number (no communication)
            call = st.take_number()
        else:       # the communicator's first call: told on the caller's communicator (the
            call = st.calls + 1     # others wait in the presence check there), no number
            if st._dup is not None:
                return              # (the duplicate is being made: the others can't look)
        started = self.signature is not None and self._state is not None
        st.failed_here.add(call)
        if started:
            st.mark_broken(f"{type(exc).__name__}: {exc}")
        notice.post(st, call, notice.BROKEN if started else notice.OWN,
                    f"{type(exc).__name__}: {exc}")

    def _reject(self, exc: Exception) -> None:
        """This rank's own checks raised ``exc`` before the agreement step: with ``validate``,
        take part in it flagged, so that the others raise ``ArgumentMismatch`` naming this rank
        instead of waiting for it (this rank then raises ``exc``)."""
        if not self.validate or self.agreed:
            return
        self.agreed = True
        try:
            comm = self.open().comm
            validate.check(comm, validate.rejected(self.collective, exc), self.watch)
        except (ArgumentMismatch, CommunicatorBroken):
            pass                    # the others now raise naming this rank; it raises exc
        except CollectiveTimeout as timeout:
            self._failed(timeout)
            raise timeout from exc

    def _failed(self, exc: BaseException) -> None:
        """Mark the communicator broken after a call that failed mid-way; abort if asked to."""
        failed(self._state, self.watch, self.on_timeout, self.comm, exc)

    def interrupted(self, exc: BaseException) -> BaseException:
        """``interrupted`` for this call: the error a request of it raises for ``exc`` (a raw
        ``MPI.Exception``: the dead rank's ``ProcessFailed``), the communicator marked broken
        where ``exc`` breaks it."""
        return interrupted(self._state, self.watch, self.on_timeout, self.comm, exc,
                           self.collective)


def agree_library_hash(comm: MPI.Intracomm, collective: str, agreed_on: tuple, hashed: int,
                       before: tuple, watch) -> None:
    """Before the MPI library's own collective under a deadline (a ``Call``'s, or a prepared
    one's: ``plan.Prepared``, kept by the cache): one small ``MPI_Iallreduce`` (MAX of the call's chained
    hash -- its signature's ``hashed`` folded with the history ``before`` it, as ``Call._label``
    folds it -- and of its negation), so every rank learns whether all passed the same
    arguments and made the same calls before; if not, ``disagree`` raises ``ArgumentMismatch``
    naming who passed what, on every rank. ``before``: (history, before, last) of the
    communicator's state before the call took its tag."""
    history, _, last = before
    h = (hashed ^ history) or 1
    # (mine is named, so it lives until the wait returns: mpi4py does not keep it alive,
    # and under Open MPI the collective read it after it was freed -- a heap pointer as
    # the largest hash, ArgumentMismatch "their hashes differ" for equal arguments)
    extremes, mine = np.empty(2, np.int64), np.array([h, -h], np.int64)
    validate.wait(comm.Iallreduce(mine, extremes, op=MPI.MAX), watch,
                  "the argument check of the MPI library's collective (MPI_Iallreduce)",
                  (mine, extremes))
    if extremes[0] != -extremes[1]:
        disagree(comm, collective, agreed_on, True, watch,
                 "the argument check of the MPI library's collective under a deadline",
                 (history, "" if last is None else last.text),
                 f"MPI_Iallreduce gave {extremes[0]} and {-extremes[1]} as the largest and "
                 f"smallest, this rank's is {h}")


def disagree(comm: MPI.Intracomm, collective: str, agreed_on: tuple, timed: bool, watch,
             step: str, earlier: tuple | None = None, seen: str = "") -> NoReturn:
    """``Call.disagree`` for a call that agreed on ``agreed_on`` (algorithm, fields) -- also a
    prepared call's (``plan.Prepared``), which keeps them. ``earlier``: (the running hash of the
    calls before this one, the previous call's signature), to tell the ranks apart when their
    arguments agree and their histories don't."""
    algorithm, fields = agreed_on
    validate.check(comm, validate.fingerprint(collective, algorithm, timeout=timed, **fields),
                   watch, step)
    if earlier is not None:         # the same arguments: the calls before this one differ?
        history, previous = earlier
        mine = np.array([history, zlib.crc32(previous.encode())], np.int64)
        table = np.empty((comm.Get_size(), 2), np.int64)
        validate.wait(comm.Iallgather(mine, table), watch,
                      "the report of the earlier calls (MPI_Iallgather)", (mine, table))
        if len(set(table[:, 0].tolist())) > 1:
            raise ArgumentMismatch(
                f"{collective} {algorithm}: the ranks passed the same arguments, but their "
                "earlier calls on this communicator differ (a call made on some ranks only, "
                "or with other arguments, that completed anyway): the running hash of the "
                f"calls per rank {table[:, 0].tolist()}, of the previous call's arguments "
                f"{table[:, 1].tolist()}; on rank {comm.Get_rank()} the previous call was "
                f"{previous or 'none'!r}")
    raise ArgumentMismatch(f"{collective} {algorithm}: the ranks called it with "
                           f"different arguments (their hashes differ{': ' if seen else ''}"
                           f"{seen})")


def breaks(exc: BaseException) -> bool:
    """Whether ``exc``, raised by a call under way, leaves its communicator broken: a timeout,
    an interrupt, a death, or a mismatch or another rank's failure found after the transfers
    were posted."""
    return isinstance(exc, (CollectiveTimeout, KeyboardInterrupt, ProcessFailed)) or (
        isinstance(exc, (ArgumentMismatch, PeerError)) and exc.in_flight)


def interrupted(state: CommState | None, watch, on_timeout: str, comm: MPI.Comm,
                exc: BaseException, what: str) -> BaseException:
    """A call on ``state`` raised ``exc`` mid-way (every form's handler: ``Call``, the cached
    and persistent calls): mark the communicator broken if ``exc`` breaks it, and return the
    error to raise -- ``exc``, or for a raw ``MPI.Exception`` what it means: most often a
    peer died (its connections broke), so wait for the detector to name it (up to its
    heartbeat timeout) and give its ``ProcessFailed``; else a ``CommunicatorBroken`` quoting
    MPI's error. Never a live rank named, never a broken communicator left usable."""
    if isinstance(exc, MPI.Exception):
        error = None
        w = getattr(state, "watched", None)
        if w is not None:
            limit = time.monotonic() + (settings.get("MPICOLL_HEARTBEAT_TIMEOUT") or 0) + 1.0
            while not w.known and time.monotonic() < limit:
                time.sleep(0.01)
            error = detector.failure(state, what)
        exc = error or CommunicatorBroken(
            f"{what}: the MPI library failed inside the call ({exc}); no rank is known dead; "
            "mpicoll will not use this communicator again")
        failed(state, watch, on_timeout, comm, exc)
    elif breaks(exc):
        failed(state, watch, on_timeout, comm, exc)
    return exc


def failed(state: CommState | None, watch, on_timeout: str, comm: MPI.Comm,
           exc: BaseException) -> None:
    """``state``'s communicator broken after a call that failed mid-way with ``exc`` (the
    requests ``watch`` abandoned kept alive); the other ranks told (``notice``: a rank that
    completed the call learns of it in its next one); ``MPI_Abort`` with
    ``on_timeout="abort"``."""
    if state is not None:
        first = state.mark_broken(f"{type(exc).__name__}: {exc}", replace=True)
        if watch is not None:
            state.abandon(watch.abandoned)
            watch.abandoned = []
        if isinstance(exc, ProcessFailed):      # every survivor knows: no notice
            pass
        elif first and state.made and watch is not None and watch.number >= 0:
            call = state.absolute(watch.number)
            state.failed_here.add(call)
            try:
                notice.post(state, call, notice.RELAYED if isinstance(exc, PeerError)
                            else notice.BROKEN, f"{type(exc).__name__}: {exc}")
            except MPI.Exception:
                pass
    if on_timeout == "abort" and (isinstance(exc, (CollectiveTimeout, ProcessFailed)) or (
            isinstance(exc, ArgumentMismatch) and exc.in_flight)):
        abort(comm, exc)


def abort(comm: MPI.Comm, exc: BaseException) -> NoReturn:
    """Print ``exc``, call ``MPI_Abort``; never return, so no ``except`` of the caller's sees
    ``exc``: should ``MPI_Abort`` return or raise (MPI does not promise to end this process
    before the others), the process ends with ``os._exit``."""
    try:
        sys.stdout.flush()
        sys.stderr.write(f"mpicoll: rank {comm.Get_rank()}: {exc}\n"
                         f"mpicoll: on_timeout='abort': calling MPI_Abort({ABORT_CODE})\n")
        sys.stderr.flush()
        comm.Abort(ABORT_CODE)
    finally:
        os._exit(ABORT_CODE)


# ----------------------------------------------------------------------------- the options

def _timeout(timeout, name: str) -> float | None:
    """Seconds, or None for no timeout (``math.inf``)."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"{name} must be a positive number of seconds (inf: no timeout), "
                         f"got {timeout!r}")
    return None if timeout == math.inf else float(timeout)


def _on_timeout(on_timeout, name: str) -> str:
    if on_timeout not in ("exception", "abort"):
        raise ValueError(f"{name} must be 'exception' or 'abort', got {on_timeout!r}")
    return on_timeout


SITE_FRAMES = 4         # validate="callsite": this many callers' lines (a wrapper's is not enough)


def _callsite() -> str:
    """``file:line`` of the first ``SITE_FRAMES`` callers outside mpicoll, innermost first,
    joined by ``<`` (``validate="callsite"``): a collective called through a helper function
    is told apart by the helper's callers."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_globals.get("__name__", "").startswith("mpicoll"):
        frame = frame.f_back
    lines = []
    while frame is not None and len(lines) < SITE_FRAMES:
        lines.append(f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}")
        frame = frame.f_back
    return "<".join(lines) or "?"


def _validate(flag) -> bool:
    if not isinstance(flag, bool):
        raise TypeError(f"validate must be True or False, got {flag!r}")
    return flag
