"""Who keeps the others waiting: ``mpicoll.stats(comm)`` and ``MPICOLL_STRAGGLERS``.

Every rank notes when it enters each call (``CommState.next_number`` into ``CommState.entered``:
one clock read, ~50 ns). ``stats`` (collective) puts those times on one clock and charges, per
call, the last rank to arrive with how long it held the others. A rank that is slow but not
dead -- the seeds' straggler, "dragging the whole job to its speed" -- is named.
"""

from __future__ import annotations

import atexit
import json
import sys
import time

import numpy as np
from mpi4py import MPI

from .. import settings
from ..errors import CollectiveTimeout
from . import notice
from .watch import kept

__all__ = ["stats", "deadline", "communicator", "STRAGGLER_MIN", "write_at_exit",
           "RECENT_ENTRIES"]

RECENT_ENTRIES = 256        # calls whose entry times a CommState keeps
RECENT_ENTRIES_MASK = RECENT_ENTRIES - 1

STRAGGLER_MIN = 50e-6       # seconds: a straggler held each call up at least this long on average


def deadline(timeout) -> float:
    """``timeout`` seconds from now (default ``MPICOLL_TIMEOUT``; none: far away)."""
    seconds = settings.get("MPICOLL_TIMEOUT") if timeout is None else timeout
    return time.monotonic() + (seconds or 1e9)


def communicator(comm) -> MPI.Intracomm:
    """The MPI communicator of ``comm`` (an ``mpicoll.Comm``'s, ``COMM_WORLD`` for None)."""
    comm = MPI.COMM_WORLD if comm is None else getattr(comm, "comm", comm)
    if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
        raise TypeError(f"comm must be a live MPI intracommunicator, got {comm!r}")
    return comm


def stats(comm=None, *, window: int = RECENT_ENTRIES,
          timeout: float | None = None) -> dict:
    """Who kept the others waiting over ``comm``'s last ``window`` calls (at most 256);
    collective.

    Every rank notes when it enters each call; here the ranks put those times on one clock
    (rank 0's, from five barriers: the median gap) and, per call, charge the last rank to
    arrive with how long it held the others (its arrival minus the one before it). Returns
    ``{"straggler": rank or None, "calls": n, "ranks": {rank: {"calls", "mean", "p99"}}}``
    (seconds). The straggler held the others longest on average, at least twice as long as any
    other rank and at least ``STRAGGLER_MIN``; None when no rank stands out."""
    comm = communicator(comm)
    st = notice.lookup(comm)
    size = comm.Get_size()
    if st is None or not st.made or size == 1:
        return {"straggler": None, "calls": 0, "ranks": {}}
    dup, end = st.comm, deadline(timeout)
    clocks = np.empty((5, size))
    for k in range(5):
        _wait(dup.Ibarrier(), end, st, ())
        mine = np.array([time.monotonic()])
        _wait(dup.Iallgather(mine, clocks[k]), end, st, (mine, clocks))
    offsets = np.median(clocks - clocks[:, :1], axis=0)         # rank r's clock - rank 0's
    n = min(window, RECENT_ENTRIES)
    mine = np.array([st.calls] + [st.entered[c & RECENT_ENTRIES_MASK]
                                  for c in range(st.calls - n + 1, st.calls + 1)])
    table = np.empty((size, n + 1))
    _wait(dup.Iallgather(mine, table), end, st, (mine, table))
    calls = int(table[:, 0].min())
    n = min(n, calls, *(int(c) for c in table[:, 0]))
    times = table[:, -n:] - offsets[:, None] if n else np.empty((size, 0))
    held = np.zeros_like(times)
    if n and size > 1:
        order = np.argsort(times, axis=0)
        last, before = order[-1], order[-2]
        cols = np.arange(n)
        held[last, cols] = times[last, cols] - times[before, cols]
    ranks = {r: {"calls": n, "mean": float(held[r].mean()) if n else 0.0,
                 "p99": float(np.percentile(held[r], 99)) if n else 0.0} for r in range(size)}
    means = sorted(((v["mean"], r) for r, v in ranks.items()), reverse=True)
    straggler = None
    if n and means[0][0] >= STRAGGLER_MIN and (len(means) == 1 or means[0][0] >= 2 * means[1][0]):
        straggler = means[0][1]
    return {"straggler": straggler, "calls": n, "ranks": ranks}


def _wait(request: MPI.Request, end: float, st, buffers: tuple) -> None:
    """Complete ``stats``' collective ``request`` on ``buffers``; if it fails, keep both alive
    and break the communicator (the collective left pending would match another's later)."""
    try:
        while not request.Test():
            if st.watched is not None and st.watched.known:
                st.check("mpicoll.stats")
            if time.monotonic() > end:
                raise CollectiveTimeout("mpicoll.stats", "its exchange of arrival times", 0)
            time.sleep(1e-4)
    except BaseException as exc:
        st.abandon([kept([request], buffers)])
        st.mark_broken(f"{type(exc).__name__}: {exc}")
        raise


_registered = False


def write_at_exit() -> None:
    """With ``MPICOLL_STRAGGLERS`` set, have ``_write`` run at exit (before MPI finalizes:
    hooks run last-first, and mpi4py's was registered first); once."""
    global _registered
    if not _registered and settings.get("MPICOLL_STRAGGLERS") is not None:
        _registered = True
        atexit.register(_write)


def _write() -> None:
    """``MPICOLL_STRAGGLERS=FILE``: rank 0 writes ``stats(COMM_WORLD)`` to FILE at exit."""
    path = settings.get("MPICOLL_STRAGGLERS")
    if path is None or MPI.Is_finalized():
        return
    st = notice.lookup(MPI.COMM_WORLD)
    if st is None or not st.made or st.broken:
        return
    try:
        result = stats(MPI.COMM_WORLD, timeout=10.0)
    except Exception as exc:            # noqa: BLE001 - at exit: say so, never raise
        sys.stderr.write(f"mpicoll: MPICOLL_STRAGGLERS: not written ({exc})\n")
        return
    if MPI.COMM_WORLD.Get_rank() == 0:
        result = {"kind": "mpicoll-stragglers", **result,
                  "ranks": {str(r): v for r, v in result["ranks"].items()}}
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
