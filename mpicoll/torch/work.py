"""A torch collective in flight: ``Work`` (what ``dist.all_reduce(..., async_op=True)`` and the
other calls of the backend return), and the ``_completer`` that keeps every ``Work`` in flight
for ``drain``. ``mpicoll.torch.backend``'s module doc says how a ``Work`` ends: the thread that
ends its last request completes its future (``Request.then``), and ``wait()`` waits in the
caller's thread.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from datetime import timedelta

import torch
import torch.distributed as dist

from mpicoll.errors import CommunicatorBroken

__all__ = ["Work"]


def _seconds(timeout) -> float | None:
    """c10d's per-call timeout (a timedelta; negative or zero: unset) in seconds, or None."""
    if timeout is None:
        return None
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    return seconds if seconds > 0 else None


class _Flag:
    """A ``threading.Event`` for a Work finished at birth (no thread ever waits on it)."""

    __slots__ = ("_set",)

    def __init__(self):
        self._set = False

    def set(self):
        self._set = True

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout=None) -> bool:
        return self._set


_NO_LOCK = contextlib.nullcontext()


def _failure(what: str, exc: BaseException) -> RuntimeError:
    error = RuntimeError(f"mpicoll backend, {what}: {type(exc).__name__}: {exc}")
    error.__cause__ = exc
    error.peers = getattr(exc, "peers", getattr(exc, "ranks", []))
    return error


class Work(dist._Work):
    """One torch collective in flight: mpicoll ``Request`` s, and what to do when they end.

    ``wait()`` returns True or raises ``RuntimeError`` (the collective's failure);
    ``get_future()`` completes with the collective's output tensors at the same moment. The
    future is made when first asked for (a blocking ``dist.all_reduce`` never asks: making and
    completing one cost about 4 us of its call).
    """

    def __init__(self, what: str, requests=(), result=None, after=None, error=None):
        super().__init__()
        self._what, self._requests, self._result, self._after = what, list(requests), \
            result, after
        self._future = None
        self._lock = _NO_LOCK if not self._requests else threading.Lock()
        self._done = _Flag() if not self._requests else threading.Event()
        self._error: RuntimeError | None = None
        if not self._requests:
            self._finish(error)

    def __repr__(self) -> str:
        state = "failed" if self._error else "done" if self._done.is_set() else "in flight"
        return f"<mpicoll Work {self._what}: {state}>"

    def _finish(self, error) -> None:
        with self._lock:                # the first to get here completes the future
            if self._done.is_set():
                return
            if error is None and self._after is not None:
                try:
                    self._after()
                except Exception as exc:        # noqa: BLE001 -- reported through the Work
                    error = exc
            self._error = None if error is None else (
                error if isinstance(error, RuntimeError) and not isinstance(
                    error, CommunicatorBroken) else _failure(self._what, error))
            self._done.set()
            future = self._future
        if future is not None:          # (else get_future completes it when it makes it)
            self._settle(future)

    def _settle(self, future) -> None:
        """Complete ``future`` as the Work ended (outside the lock: its callbacks run now)."""
        if self._error is None:
            future.set_result(self._result)
        else:
            future.set_exception(self._error)

    def _complete(self, timeout: float | None = None) -> None:
        """Wait for the requests (``timeout`` tightens their deadline) and finish."""
        error = None
        try:
            for request in self._requests:
                request.wait(timeout)
        except Exception as exc:                # noqa: BLE001 -- reported through the Work
            error = exc
        self._finish(error)
        self._done.wait()

    def wait(self, timeout=None) -> bool:
        self._complete(_seconds(timeout))
        if self._error is not None:
            raise self._error
        return True

    def get_future(self):
        with self._lock:
            future, made = self._future, self._future is None
            if made:
                future = self._future = torch.futures.Future()
            ended = self._done.is_set()
        if made and ended:              # (else _finish completes it)
            self._settle(future)
        elif made:                      # the thread that ends the last request completes it
            for request in self._requests:
                request.then(self._ended)
        return future

    def _ended(self, _error) -> None:
        """A request ended (``Request.then``): once all have, finish, with the first error."""
        if all(r.done for r in self._requests):
            self._finish(_error_of(self._requests))

    def _poll(self) -> bool:
        """Whether the Work has ended; finishes it here if its requests have."""
        if not self._done.is_set() and all(r.done for r in self._requests):
            self._complete()
        return self._done.is_set()

    def is_completed(self) -> bool:
        return self._poll()

    def is_success(self) -> bool:
        return self._poll() and self._error is None

    def exception(self):
        self._poll()
        return self._error

    def result(self):
        return self._result


def _error_of(requests) -> Exception | None:
    """The first error of ended ``requests``, or None."""
    for request in requests:
        try:
            request.test()
        except Exception as exc:                # noqa: BLE001 -- reported through the Work
            return exc
    return None


class _Completer:
    """Keeps every ``Work`` in flight (``track``), for ``drain``. (No thread: the thread that
    ends a Work's last request completes its future, ``Request.then``.)"""

    def __init__(self):
        self._flight: collections.deque = collections.deque()
        self._ready = threading.Lock()

    def track(self, work: Work) -> None:
        """``work`` is in flight (for ``drain``); forget those at the front that have ended."""
        with self._ready:
            flight = self._flight
            head = flight[0] if flight else None
        while head is not None and head._poll():    # (outside the lock: it may finish it)
            with self._ready:
                if flight and flight[0] is head:
                    flight.popleft()
                head = flight[0] if flight else None
        with self._ready:
            self._flight.append(work)

    def drain(self) -> None:
        """Finish every Work in flight so far (waiting for it in this thread)."""
        with self._ready:
            pending, self._flight = list(self._flight), collections.deque()
        for work in pending:
            work._complete()


_completer = _Completer()
