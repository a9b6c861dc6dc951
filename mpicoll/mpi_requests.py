"""mpicoll's nonblocking and persistent collectives as MPI requests (``mpicoll.Comm``'s
``Iallreduce`` ... and ``Allreduce_init`` ...; docs/buffers.md): ``Request``, an MPI generalized
request completed with mpicoll's collective, and ``Prequest``, an MPI persistent request whose
``Start()`` starts it. ``mpicoll.comm`` re-exports both."""

from __future__ import annotations

import itertools
import os

import numpy as np
from mpi4py import MPI

from .buffer_specs import Args
from .executors import progress

__all__ = ["Request", "Prequest"]


def _query(status, holder) -> None:
    """A completed collective's status (MPI's for a collective: no source, tag or data)."""
    status.source, status.tag, status.error = MPI.ANY_SOURCE, MPI.ANY_TAG, MPI.SUCCESS
    status.Set_elements(MPI.BYTE, 0)
    status.Set_cancelled(False)
    error = holder._error_seen
    if error is not None:
        raise error


class Request(MPI.Grequest):
    """An mpicoll nonblocking collective as an MPI request (``Comm.Iallreduce`` ...).

    A real ``MPI.Request`` (an MPI generalized request, completed when mpicoll's collective
    completes): ``Wait``, ``Test``, ``Get_status``, ``Free``, ``Cancel`` (a no-op, as for
    MPI's collectives) and MPI's ``MPI.Request.Waitall`` / ``Testall`` / ``Waitany`` ...
    take it, mixed with MPI's own requests. After ``Wait`` it is ``MPI.REQUEST_NULL``
    (``bool(req)`` is False). mpicoll's error (a timeout, mismatched arguments) is raised by
    ``Wait`` / ``Test``; MPI's ``Waitall`` reports it as an ``MPI.Exception``
    (``MPI_ERR_OTHER``). MPI's own wait functions can't move mpicoll's collective: with
    mpicoll's progress thread (the default when MPI gives ``MPI_THREAD_MULTIPLE``, as mpi4py
    asks for) they just wait for it; under ``MPICOLL_PROGRESS=caller`` use this class's
    ``Wait``, ``Test`` or its ``Request.Waitall`` (...), which move it."""

    @classmethod
    def _start(cls, start, args: Args) -> "Request":
        """Run ``args.before()``, start mpicoll's request (``start(*args.args)``), and return it
        as an MPI request, which completes (after ``args.after()``) with mpicoll's."""
        holder = _Holder()
        request = cls(MPI.Grequest.Start(_query, None, None, args=(holder,)))
        request._holder = holder
        args.before()
        try:
            inner = start(*args.args)
        except BaseException:
            request.Complete()
            request.Free()
            raise
        request._inner = inner
        inner.when_done(lambda error: holder.finish(request, error, args))
        return request

    def Wait(self, status=None) -> bool:
        """Wait until the collective is done (raises mpicoll's error); True, as mpi4py's."""
        try:
            self._inner.wait()
            self._inner.release()
            error = self._holder._error_seen
            if error is not None:
                raise error
        except BaseException:
            with _suppress_mpi():
                MPI.Grequest.Wait(self)
            raise
        return MPI.Grequest.Wait(self, status)

    def Test(self, status=None) -> bool:
        """Move the collective on (``caller`` progress) and say whether it is done."""
        try:
            if not self._inner.test():
                return False
        except BaseException:   # noqa: BLE001 - Wait frees the MPI request, then raises it
            pass
        return self.Wait(status)

    def Get_status(self, status=None) -> bool:
        """Whether it is done (and its status), without freeing it."""
        try:
            self._inner.test()
        except BaseException:   # noqa: BLE001 - Wait raises it
            pass
        return MPI.Grequest.Get_status(self, status)

    @staticmethod
    def _move(requests) -> None:
        for request in requests:
            if isinstance(request, Request):
                try:
                    request._inner.test()
                except BaseException:   # noqa: BLE001 - raised by Wait
                    pass

    @staticmethod
    def Waitall(requests, statuses=None) -> bool:
        """``MPI.Request.Waitall``, moving mpicoll's collectives (any progress mode)."""
        for request in requests:
            if isinstance(request, Request):
                request._inner.wait()
        return MPI.Request.Waitall(requests, statuses)

    @staticmethod
    def Testall(requests, statuses=None) -> bool:
        """``MPI.Request.Testall``, moving mpicoll's collectives first."""
        Request._move(requests)
        return MPI.Request.Testall(requests, statuses)

    @staticmethod
    def Waitany(requests, status=None) -> int:
        """``MPI.Request.Waitany``, moving mpicoll's collectives while it waits."""
        while True:
            Request._move(requests)
            index, done = MPI.Request.Testany(requests, status)
            if done:
                return index
            os.sched_yield()

    @staticmethod
    def Testany(requests, status=None):
        """``MPI.Request.Testany``, moving mpicoll's collectives first."""
        Request._move(requests)
        return MPI.Request.Testany(requests, status)


class _Holder:
    """What the completion callback leaves for ``_query`` and ``Wait``."""

    __slots__ = ("_error_seen",)

    def __init__(self):
        self._error_seen = None

    def finish(self, request: Request, error, args: Args) -> None:
        """mpicoll's request is done (``error``: None or why not): unpack, complete the MPI
        request. Runs in whichever thread finished it; never raises."""
        if error is None:
            try:
                args.after()
            except BaseException as exc:   # noqa: BLE001 - raised by Wait
                error = exc
        self._error_seen = error
        try:
            MPI.Grequest.Complete(request)
        except MPI.Exception:
            pass


class _suppress_mpi:
    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        return kind is not None and issubclass(kind, MPI.Exception)


_EMPTY = bytearray(0)


class Prequest(MPI.Prequest):
    """An mpicoll persistent collective as an MPI persistent request (``Comm.Allreduce_init``).

    ``Start()`` starts mpicoll's persistent collective (``mpicoll.persistent``) and returns at
    once; the progress thread runs it. The MPI request this object is, a persistent receive of
    an empty message on a communicator of this process alone, completes when the collective
    does: its last step sends that message (one byte, which the receive cannot hold, if the
    collective failed, so that ``MPI.Request.Waitall`` raises ``MPI_ERR_TRUNCATE``; this
    class's ``Wait`` and ``Test`` raise mpicoll's own error). So ``Wait``, ``Test``, ``Free``,
    ``MPI.Request.Waitall`` ... behave as for MPI's persistent requests. Start it with its own
    ``Start()`` or ``Prequest.Startall`` (``MPI.Prequest.Startall`` would start only the MPI
    request, not the collective).

    Under ``MPICOLL_PROGRESS=caller`` (no progress thread) nothing would move the collective
    inside MPI's own wait: there ``Start()`` runs the whole collective, then starts a receive
    from ``MPI.PROC_NULL``, which completes at once."""

    @classmethod
    def _make(cls, handle, args: Args) -> "Prequest":
        if progress.mode() == "thread":
            comm, tag = _signals()
            request = cls(comm.Recv_init([_EMPTY, 0, MPI.BYTE], 0, tag))
            request._signal = (comm, tag)
        else:
            request = cls(MPI.COMM_SELF.Recv_init([_EMPTY, 0, MPI.BYTE], MPI.PROC_NULL))
            request._signal = None
        request._handle, request._args, request._started = handle, args, False
        request._error = None               # (_end: unpacking the result failed)
        return request

    def Start(self) -> None:
        """Start the collective (or, without the progress thread, run it), then the MPI
        request, which completes with it."""
        if self._handle is None or not self:
            raise ValueError("Start() on a persistent request that was freed")
        if self._started:       # a run that MPI's own wait completed: its error, if any,
            self._join()        # MPI's wait reported (ERR_TRUNCATE); the communicator refuses
        self._args.before()     # further calls after a failure
        if self._signal is None:
            self._handle()      # on this thread: the buffers' owners see no other thread
            self._args.after()
            MPI.Prequest.Start(self)
            return
        MPI.Prequest.Start(self)            # posted before the collective can end
        try:
            self._handle.start()
        except BaseException as exc:
            self._signal_end(exc)           # (the receive completes: the request is inactive)
            with _suppress_mpi():
                MPI.Prequest.Wait(self)
            raise
        self._started = True
        self._handle.when_done(self._end)

    def _end(self, error) -> None:
        """The collective is done (``error``: None or why not), in whichever thread finished
        it: unpack, then complete the MPI request. Never raises."""
        if error is None:
            try:
                self._args.after()
            except BaseException as exc:    # noqa: BLE001 - Wait raises it
                error = self._error = exc
        self._signal_end(error)

    def _signal_end(self, error) -> None:
        comm, tag = self._signal
        with _suppress_mpi():
            comm.Isend([_ONE, 1 if error is not None else 0, MPI.BYTE], 0, tag).Free()

    def _join(self) -> BaseException | None:
        """Close the started run: wait for mpicoll's collective and let go of it (the caller's
        thread then frees the buffers); its error, or unpacking's (``_end``), or None."""
        self._started = False
        try:
            self._handle.wait()
            error = self._error
        except BaseException as exc:    # noqa: BLE001 - the caller raises or drops it
            error = exc
        finally:
            self._handle.release()
        self._error = None
        return error

    def Wait(self, status=None) -> bool:
        """Wait until the collective is done; raises mpicoll's error if it failed."""
        if self._started:
            error = self._join()
            if error is not None:           # (the MPI request completes, truncated)
                with _suppress_mpi():
                    MPI.Prequest.Wait(self)
                raise error
        return MPI.Prequest.Wait(self, status)

    def Test(self, status=None) -> bool:
        """Whether the collective is done (raises mpicoll's error if it failed)."""
        if self._started:
            try:
                if not self._handle.test():
                    return False
            except BaseException:   # noqa: BLE001 - Wait completes the MPI request, raises it
                pass
            return self.Wait(status)
        return MPI.Prequest.Test(self, status)

    def Free(self) -> None:
        """Free the MPI request and drop mpicoll's handle (``REQUEST_NULL`` after); one still
        running completes first."""
        if self._started:
            error = self._join()
            with _suppress_mpi():
                MPI.Prequest.Wait(self)
            if error is not None:
                raise error
        if self._handle is not None:
            self._handle.free()
        self._handle = None
        MPI.Prequest.Free(self)

    @staticmethod
    def Startall(requests) -> None:
        for request in requests:
            request.Start()

    @property
    def result(self) -> np.ndarray:
        """The receive buffer (a numpy view of it)."""
        return self._handle.result


_ONE = bytearray(1)
_signal_comm: list = []             # [this process's communicator of Prequest's messages]
_signal_tags = itertools.count(1)


def _signals() -> tuple:
    """(a duplicate of ``COMM_SELF``, a tag of its own) for one ``Prequest``'s message."""
    if not _signal_comm:
        _signal_comm.append(MPI.COMM_SELF.Dup())
    tag = next(_signal_tags) % MPI.COMM_SELF.Get_attr(MPI.TAG_UB)
    return _signal_comm[0], tag
