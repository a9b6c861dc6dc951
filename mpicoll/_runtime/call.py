"""One collective call's reliability options: ``timeout``, ``on_timeout``, ``validate``.

    with Call("allreduce", algorithm, comm, timeout, on_timeout, validate) as call:
        ...                          # this rank's own argument checks
        call.agree(...)              # validate=True: the agreement step (_runtime.validate)
        call.open() ... call.mpi(...)  # communicate: mpicoll's duplicate, the deadline, the tag

Unset options come from the environment: ``MPICOLL_TIMEOUT`` (seconds; unset: none),
``MPICOLL_ON_TIMEOUT`` (``exception`` or ``abort``), ``MPICOLL_VALIDATE`` (``0`` or ``1``), read
once, at the first call (``mpicoll.settings``; ``settings.reload()`` reads them again).

With a timeout the clock starts here: the deadline covers everything after, the creation of
mpicoll's duplicate communicator (first call) included, except the time spent compiling or
loading a numba kernel (local work under a file lock, no other rank involved: ``api._warmup``
adds it to the deadline). On the way out the call
handles failures:

* with ``validate``, a rank whose own checks failed (a bad argument or option, a bad setting, any
  error before the agreement step) still takes part in the agreement step, flagged, so that the
  other ranks raise ``ArgumentMismatch`` naming it instead of waiting for it; it raises its own
  error. Nothing that can fail on one rank only runs after the agreement step (``api``);
* ``CollectiveTimeout`` (or an interrupt) marks the communicator broken -- messages of the
  failed call may still be in flight, so later calls raise ``CommunicatorBroken`` -- and with
  ``on_timeout="abort"`` prints the error and calls ``comm.Abort``, so a batch job ends (and
  ``os._exit``, should ``MPI_Abort`` return: the error never reaches the caller).
"""

from __future__ import annotations

import math
import os
import sys
from typing import NoReturn

from mpi4py import MPI

from .. import settings
from ..errors import ArgumentMismatch, CollectiveTimeout, CommunicatorBroken
from . import validate
from .context import CommState, attach
from .watch import Watch

__all__ = ["Call", "ABORT_CODE"]

ABORT_CODE = 124        # the job's MPI_Abort error code after a timeout (as timeout(1) exits)


class Call:
    def __init__(self, collective: str, algorithm: str, comm, timeout, on_timeout, validate):
        if comm is None:
            comm = MPI.COMM_WORLD
        if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
            raise TypeError(f"comm must be an MPI intracommunicator, got {comm!r}")
        self.collective, self.comm = collective, comm
        attach(comm)        # local: from now on freeing comm drops mpicoll's stray messages
        self.agreed, self.tag, self._state = False, 0, None
        self.watch, self.timeout, self.on_timeout = None, None, "exception"
        self.error: Exception | None = None     # a bad option: raised by __enter__
        try:
            self.validate = (settings.get("MPICOLL_VALIDATE") if validate is None
                             else _validate(validate)) and comm.Get_size() > 1
        except (TypeError, ValueError) as error:
            # whether the others validate is unknown; a truthy value most likely means they do
            self.validate, self.error = bool(validate) and comm.Get_size() > 1, error
        try:
            self.timeout = (settings.get("MPICOLL_TIMEOUT") if timeout is None
                            else _timeout(timeout, "timeout"))
            self.on_timeout = (settings.get("MPICOLL_ON_TIMEOUT") if on_timeout is None
                               else _on_timeout(on_timeout, "on_timeout"))
        except ValueError as error:
            self.error = self.error or error
        if self.timeout is not None:
            self.watch = Watch(self.timeout, f"{collective} {algorithm}", comm)

    def open(self) -> CommState:
        """mpicoll's state of the communicator, ready for this call; the first use takes the
        call's tag. Communicates: on a communicator's first use it completes mpicoll's
        duplicate and finds the node layout (collective), under the deadline if any."""
        if self._state is None:
            st = attach(self.comm)
            st.check(self.collective)
            self._state = st
            if not st.made:
                st.ready(self.watch)
            self.tag = st.next_tag()
            if self.watch is not None:
                self.watch.comm, self.watch.tag = st.comm, self.tag
        return self._state

    def agree(self, algorithm: str, **fields) -> None:
        """Name the algorithm about to run; with ``validate``, check every rank agrees on it all.

        ``fields`` are those of ``mpicoll.validate.fingerprint`` (op, dtype, count, root, ...).
        """
        if self.watch is not None:
            self.watch.what = f"{self.collective} {algorithm}"
        if self.validate and not self.agreed:
            self.agreed = True
            validate.check(self.open().comm, validate.fingerprint(
                self.collective, algorithm, timeout=self.timeout is not None, **fields),
                self.watch)

    def mpi(self, blocking, nonblocking, *args, **kwargs) -> None:
        """The MPI library's own collective on mpicoll's duplicate: ``blocking`` (e.g.
        ``MPI.Comm.Allreduce``) without a timeout, else ``nonblocking`` (``MPI.Comm.Iallreduce``)
        polled under the deadline."""
        comm = self.open().comm
        if self.watch is None:
            blocking(comm, *args, **kwargs)
        else:
            self.watch.wait([nonblocking(comm, *args, **kwargs)], "MPI_" + nonblocking.__name__)

    def __enter__(self) -> "Call":
        if self.error is not None:          # a bad option of this call: as a bad argument
            self._reject(self.error)
            raise self.error
        return self

    def __exit__(self, kind, exc, tb) -> bool:
        if isinstance(exc, (CollectiveTimeout, KeyboardInterrupt)):
            self._failed(exc)
        elif isinstance(exc, Exception) and not isinstance(exc, CommunicatorBroken):
            self._reject(exc)
        return False

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
        if self._state is not None:
            self._state.broken = f"{type(exc).__name__}: {exc}"
            if self.watch is not None:
                self._state.abandoned += self.watch.abandoned
        if isinstance(exc, CollectiveTimeout) and self.on_timeout == "abort":
            abort(self.comm, exc)


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


def _validate(flag) -> bool:
    if not isinstance(flag, bool):
        raise TypeError(f"validate must be True or False, got {flag!r}")
    return flag
