"""The progress thread: one daemon thread per process that advances every request in flight
(``progress.Request``), the lock the requests and the callers' threads share with it, and the
callers' priority over it.

Each pass of the thread (``_loop``) advances every active request once (``advance_all``), under
``lock``; ``Request.then`` functions run after it lets the lock go (``run_ready``). When nothing
moved it backs off: ``sched_yield`` for ``_YIELDS`` looks, then sleeps of 10 us doubling to 1 ms
(a newly started request wakes it at once: ``wake``) -- except while a step moves more than
``PIPELINED`` (64 KiB), which moves only inside looks of both ranks (MPICH's shared-memory
pieces, or its CMA copy after the handshake): then it keeps yielding for up to ``SPIN`` (2 ms)
after the last step completed. Past 8 ms without a move the sleeps grow to 1/8 of the time
waited, up to 16 ms: a request whose peer is 200 ms late costs ~40 looks, not a core
(docs/training.md, "What waiting costs"). A crowded process (``idle.crowded``: more ranks on
the node than cores) sleeps without yielding first (nor while pipelined): the rank waited for
most often needs this core (``MPICOLL_YIELD_WHEN_IDLE``).
"""

from __future__ import annotations

import atexit
import os
import threading
import time
import traceback

from .. import idle

__all__ = ["lock", "wake", "active", "ready", "priority", "turn", "run_ready", "advance_all",
           "ensure_thread", "in_thread", "thread_alive"]

_YIELDS = 20                    # looks with sched_yield before the thread starts sleeping
_CROWDED_YIELDS = 0             # ... when crowded
PIPELINED = 64 << 10            # a step moving more bytes than this ...
SPIN = 2e-3                     # ... keeps the thread yielding this long after a step completed
SLEEP_MIN, _SLEEP_MAX = 1e-5, 1e-3
_SLEEP_SHARE, _SLEEP_LONG = 0.125, 0.016    # a long wait sleeps up to 1/8 of it, up to 16 ms
GIVE_WAY = 2e-3                 # the longest the thread stays out of a caller's way per pass

lock = threading.Lock()         # held while any request is advanced or started
wake = threading.Condition(lock)
active: list = []               # the requests in flight (those their callers keep too)
ready: list = []                # (fn, error) of Request.then, run once lock is let go
_callers = 0                    # callers' threads inside mpicoll (see priority)
_callers_lock = threading.Lock()
_thread: threading.Thread | None = None
_stopping = False


class priority:
    """``with priority():`` -- the caller's thread does local work for a request (makes it,
    starts it, takes ``lock``) and the progress thread keeps off the GIL and ``lock`` for up to
    GIVE_WAY seconds after each of its passes, until the caller is done. Why: while requests
    keep moving the thread holds the GIL almost all the time, a caller's thread that lets it go
    waits up to the interpreter's switch interval (5 ms) to get it back, and ``threading.Lock``
    is not fair: on 4 ranks on 2 cores that kept one rank's ``iallreduce`` calls in start() for
    tens of seconds while the other ranks waited on it. Only local work takes it (never a wait
    for other ranks: their requests may need this thread's passes). Nested uses count.
    """

    def __enter__(self):
        global _callers
        with _callers_lock:
            _callers += 1

    def __exit__(self, *exc) -> None:
        global _callers
        with _callers_lock:
            _callers -= 1


class turn(priority):
    """``with turn():`` -- ``lock``, taken by a caller's thread, with ``priority``."""

    def __enter__(self):
        super().__enter__()
        try:
            lock.acquire()
        except BaseException:           # (a KeyboardInterrupt while waiting for it)
            super().__exit__()
            raise

    def __exit__(self, *exc) -> None:
        lock.release()
        super().__exit__()
        run_ready()


def run_ready() -> None:
    """Run the ``Request.then`` functions whose requests have ended (``lock`` not held)."""
    while ready:
        try:
            fn, error = ready.pop(0)
        except IndexError:              # (another thread took the last one)
            return
        try:
            fn(error)
        except Exception:               # noqa: BLE001 - not the engine's, nor its caller's
            traceback.print_exc()


def advance_all() -> bool:
    """Advance every active request once (lock held), but those their callers keep; drop the
    finished ones."""
    moved = False
    for req in list(active):
        if not req.done and not req._kept:
            try:
                moved |= req._advance()
            except BaseException as exc:    # noqa: BLE001 - kept for wait() to raise
                req._fail(exc)
                moved = True
    active[:] = [r for r in active if not r.done]
    return moved


def _loop() -> None:
    pause, looks, moved_at = SLEEP_MIN, 0, time.monotonic()
    stepped_at = -SPIN          # when a step last completed: only that keeps the thread yielding
    while True:
        with lock:
            while not _stopping and all(r._kept for r in active):    # (none, or callers')
                wake.wait()
                moved_at = time.monotonic()
            if _stopping:
                return
            moved = advance_all()
            in_flight = len(active)
            pipelined = any(r._step_bytes() > PIPELINED for r in active if not r._kept)
        run_ready()
        now = time.monotonic()
        give_way_until = now + GIVE_WAY
        while _callers and time.monotonic() < give_way_until:   # a caller works: let it
            time.sleep(SLEEP_MIN)
        crowded = idle.crowded()
        if moved:
            pause, looks, moved_at, stepped_at = SLEEP_MIN, 0, now, now
        elif looks < (_CROWDED_YIELDS if crowded else _YIELDS) \
                or pipelined and not crowded and now - stepped_at < SPIN:
            looks += 1
            os.sched_yield()
        else:
            with lock:                  # a request started meanwhile wakes it (start: notify)
                woken = len(active) != in_flight or _stopping or wake.wait(pause)
            if woken:
                pause, looks, moved_at = SLEEP_MIN, 0, time.monotonic()
            else:
                waited = time.monotonic() - moved_at
                pause = min(2 * pause, _SLEEP_LONG, max(_SLEEP_MAX, _SLEEP_SHARE * waited))


def ensure_thread() -> None:
    global _thread
    if _thread is None or not _thread.is_alive():
        _thread = threading.Thread(target=_loop, name="mpicoll-progress", daemon=True)
        _thread.start()


def in_thread() -> bool:
    """Whether the calling thread is the progress thread."""
    return threading.current_thread() is _thread


def thread_alive() -> bool:
    return _thread is not None and _thread.is_alive()


@atexit.register
def _stop() -> None:
    """Stop the thread before mpi4py's own atexit hook finalizes MPI (hooks run last-first)."""
    global _stopping
    with lock:
        _stopping = True
        wake.notify()
    if _thread is not None:
        _thread.join(timeout=5)
