"""The exceptions of mpicoll (see docs/reliability.md for when each is raised)."""

from __future__ import annotations

__all__ = ["CollectiveTimeout", "ArgumentMismatch", "CommunicatorBroken", "ProcessFailed",
           "PeerError", "ReportedMismatch", "ConcurrentCall"]


class CollectiveTimeout(TimeoutError):
    """A collective could not finish on this rank: its deadline passed, or another rank's did.

    ``peers`` are the ranks the call is waiting for: those the roll call did not hear from
    (never entered the call, exited, died) or found in another call; when every rank is in the
    call, the ranks this one's unfinished transfers were with (``waiting_on``).
    """

    def __init__(self, what: str, step, nsteps: int, *, waiting_on=(), missing=(),
                 elsewhere=(), gave_up=(), timeout: float | None = None):
        self.what, self.step, self.nsteps = what, step, nsteps
        self.waiting_on, self.missing = sorted(waiting_on), sorted(missing)
        self.elsewhere, self.gave_up = sorted(elsewhere), sorted(gave_up)
        self.peers = sorted(set(self.missing) | set(self.elsewhere)) or self.waiting_on
        where = step if isinstance(step, str) else f"step {step} of {nsteps}"
        if timeout is not None:
            text = f"{what}: timed out after {timeout:g} s in {where}"
        elif self.gave_up:
            text = f"{what}: gave up in {where} because rank(s) {self.gave_up} timed out"
        else:
            text = f"{what}: gave up in {where}, called by another rank's roll call"
        if self.waiting_on:
            text += f", waiting for rank(s) {self.waiting_on}"
        if self.missing:
            text += (f"; rank(s) {self.missing} did not answer the roll call (never entered "
                     "this call, exited or died)")
        if self.elsewhere:
            text += f"; rank(s) {self.elsewhere} are in another call on this communicator"
        if timeout is not None and not self.missing and not self.elsewhere:
            text += "; every rank answered from this call (a slow rank or network?)"
        super().__init__(text)


class ArgumentMismatch(ValueError):
    """Ranks called a collective with arguments that do not agree: found by ``validate=True``
    (before any transfer), by the argument check of the MPI library's own collectives under a
    deadline, or by the roll call once the deadline passed (the arguments' hash is in the
    message tags, so such calls wait instead of matching: ``_runtime/tags.py``).

    ``ranks`` are the disagreeing ranks (those outside the largest group of equal arguments);
    ``fields`` maps each differing argument to ``{value: [ranks]}``. ``in_flight``: found by
    the roll call, after transfers were posted -- the communicator is then broken, as after a
    ``CollectiveTimeout``.
    """

    def __init__(self, message: str, ranks=(), fields=None, *, in_flight: bool = False):
        self.ranks, self.fields = sorted(ranks), dict(fields or {})
        self.in_flight = in_flight
        super().__init__(message)


class CommunicatorBroken(RuntimeError):
    """An earlier call on this communicator failed mid-way; mpicoll will not use it again."""


class ProcessFailed(CommunicatorBroken):
    """A rank of the communicator died: found by the failure detector (``_runtime/detector.py``)
    within seconds, agreed by the survivors, and raised by every survivor's current or next call
    on the communicator, naming the same ranks. ``ranks``: the failed ranks (of this
    communicator; also ``peers``, as ``CollectiveTimeout``'s); ``hosts``: ``{rank: host}``.
    ``mpicoll.shrink(comm)``, on every survivor, returns a communicator of the survivors."""

    def __init__(self, message: str, ranks=(), hosts=None):
        self.ranks = self.peers = sorted(ranks)
        self.hosts = dict(hosts or {})
        super().__init__(message)


class PeerError(RuntimeError):
    """Another rank's call failed, and told this one (``_runtime/notice.py``): a rank whose own
    checks raised (a ``TypeError`` for a list, a bad count ...) before it communicated, or a rank
    that gave up on a call this one took part in. Raised while this rank waits (within a few
    tens of milliseconds of the notice's arrival), not at the deadline.

    ``ranks``: the ranks that failed; ``errors``: ``{rank: "TypeError: ..."}``, their own
    messages; ``call``: the call's number on the communicator (counted from 1); ``in_flight``:
    this rank's part of the call was under way (its messages may still be in flight), so the
    communicator is broken here, as after a ``CollectiveTimeout``.
    """

    def __init__(self, message: str, ranks=(), errors=None, call: int = 0, *,
                 in_flight: bool = True):
        self.ranks, self.errors, self.call = sorted(ranks), dict(errors or {}), call
        self.in_flight = in_flight
        super().__init__(message)


class ReportedMismatch(ArgumentMismatch, PeerError):
    """Another rank found that the ranks' arguments differ, and told this one before it found
    it itself (``shm``'s window, where one rank compares the hashes first): the call's
    ``ArgumentMismatch`` on this rank too, so every rank of the call raises the same kind.
    Also a ``PeerError``: ``ranks`` and ``errors`` are the reporting ranks and their messages
    (which name the differing fields); ``fields`` is empty here."""

    def __init__(self, message: str, ranks=(), errors=None, call: int = 0, *,
                 in_flight: bool = True):
        PeerError.__init__(self, message, ranks, errors, call, in_flight=in_flight)
        self.fields = {}


class ConcurrentCall(RuntimeError):
    """A second thread entered a collective on a communicator that another thread of this
    process is already in (MPI collectives on one communicator must be called in the same order
    on every rank; two threads racing cannot guarantee that). Raised on the calling thread
    before it touches the communicator; the call in progress is unaffected. Use one
    communicator per thread (``comm.Dup()``)."""
