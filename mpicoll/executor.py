"""The MPI executor: runs a schedule over mpi4py's buffer point-to-point calls.

For each step it posts the receives (reduced ones into scratch, copied ones straight into the
buffer), then the sends, waits for all of them, then reduces the scratch into the buffer with
the numba kernel -- an ``MPI_Sendrecv`` generalised to any number of transfers. Nothing is
allocated here: slices are views, and the scratch comes from the caller, sized by
``Schedule.scratch_elements()``.
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from .errors import CollectiveTimeout
from .schedule import Recv, Schedule, Send

__all__ = ["execute", "traffic"]

# What this process has sent and received through ``execute``, for the benchmark's byte counts.
traffic = {"bytes_sent": 0, "bytes_received": 0, "messages_sent": 0}


def execute(schedule: Schedule, buf: np.ndarray, comm: MPI.Comm, *, reduce_into, tag: int,
            scratch: np.ndarray, deadline: float | None = None, what: str = "") -> None:
    """Run ``schedule`` on the flat array ``buf`` over ``comm``.

    ``deadline`` (a ``time.monotonic()`` value) bounds every wait; past it the call raises
    ``CollectiveTimeout`` naming the step and the peers whose transfers had not completed.
    """
    for index, step in enumerate(schedule.steps):
        requests, peers, pending = [], [], []
        offset = 0
        for op in step:
            if isinstance(op, Recv):
                if op.reduce:
                    tmp = scratch[offset:offset + op.hi - op.lo]
                    offset += op.hi - op.lo
                    pending.append((op, tmp))
                else:
                    tmp = buf[op.lo:op.hi]
                requests.append(comm.Irecv(tmp, op.peer, tag))
                peers.append(op.peer)
                traffic["bytes_received"] += tmp.nbytes
        for op in step:
            if isinstance(op, Send):
                requests.append(comm.Isend(buf[op.lo:op.hi], op.peer, tag))
                peers.append(op.peer)
                traffic["bytes_sent"] += (op.hi - op.lo) * buf.itemsize
                traffic["messages_sent"] += 1
        if deadline is None:
            MPI.Request.Waitall(requests)
        else:
            _wait_until(requests, peers, deadline, what, index, len(schedule.steps))
        for op, tmp in pending:
            acc = buf[op.lo:op.hi]
            if op.left:                     # acc = op(incoming, acc)
                reduce_into(tmp, acc)
                acc[...] = tmp
            else:                           # acc = op(acc, incoming)
                reduce_into(acc, tmp)


def _wait_until(requests, peers, deadline, what, index, nsteps) -> None:
    """Poll ``requests`` until all complete or ``deadline`` passes (sleeping 50 us .. 1 ms)."""
    pause = 5e-5
    while not MPI.Request.Testall(requests):
        if time.monotonic() > deadline:
            done = [r.Test() for r in requests]       # Testall left them all untouched
            missing = sorted({p for p, ok in zip(peers, done) if not ok})
            raise CollectiveTimeout(what, index, nsteps, missing)
        time.sleep(pause)
        pause = min(2 * pause, 1e-3)
