"""The Python executor: runs a schedule over mpi4py's buffer point-to-point calls.

For each step it posts the receives (reduced ones into scratch, copied ones straight into the
buffer), then the sends, waits for all of them, then reduces the scratch into the buffer with
the numba kernel -- an ``MPI_Sendrecv`` generalised to any number of transfers. Nothing is
allocated here: slices are views, and the scratch comes from the caller, sized by
``Schedule.scratch_elements``. The schedule's ``plan`` (its steps as plain tuples, computed
once per schedule) keeps the per-step Python work small.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .. import kernels
from .._runtime import loading
from .._runtime.context import new_traffic   # (the counters execute adds to)
from ..schedule import Schedule
from .step import reduce_received

__all__ = ["execute", "execute_by_name", "new_traffic"]


def execute(schedule: Schedule, buf: np.ndarray, comm: MPI.Comm, *, reduce_into, tag: int,
            scratch: np.ndarray, traffic: dict, watch=None) -> None:
    """Run ``schedule`` on the flat array ``buf`` over ``comm``; add to the ``traffic`` counters
    (``_runtime.context.new_traffic``; ``internode_bytes`` is the caller's: it counts them
    once per schedule).

    With a ``watch`` (``mpicoll._runtime.watch.Watch``) every wait is polled under its deadline;
    past it the call raises ``CollectiveTimeout`` naming the step and the missing ranks. A step of
    exactly one send and one receive, without a watch, is one ``Sendrecv`` call.
    """
    itemsize = buf.itemsize
    for index, (recvs, sends) in enumerate(schedule.plan):
        for _, lo, hi in sends:
            traffic["bytes_sent"] += (hi - lo) * itemsize
        traffic["messages_sent"] += len(sends)
        for _, lo, hi, *_ in recvs:
            traffic["bytes_received"] += (hi - lo) * itemsize
        if watch is None and len(recvs) == 1 and len(sends) == 1:
            (src, lo, hi, reduce, _, at, _), (dst, slo, shi) = recvs[0], sends[0]
            into = scratch[at:at + hi - lo] if reduce else buf[lo:hi]
            comm.Sendrecv(buf[slo:shi], dst, tag, into, src, tag)
        else:
            requests = [comm.Irecv(scratch[at:at + hi - lo] if reduce else buf[lo:hi], src, tag)
                        for src, lo, hi, reduce, _, at, _ in recvs]
            requests += [comm.Isend(buf[lo:hi], dst, tag) for dst, lo, hi in sends]
            if watch is None:
                MPI.Request.Waitall(requests)
            else:
                watch.wait(requests, index, len(schedule.plan),
                           [r[0] for r in recvs] + [s[0] for s in sends])
        reduce_received(buf, scratch, recvs, reduce_into)


def execute_by_name(schedule: Schedule, buf: np.ndarray, comm: MPI.Comm, *, op: str, tag: int,
                    scratch: np.ndarray, traffic: dict, watch=None) -> None:
    """``execute`` with the op by name (the compiled executor's signature), on the storage
    views of the buffers (``kernels.storage``: mpi4py can't send bfloat16)."""
    if not kernels.warm(op, buf.dtype):     # (else a thread started per call)
        loading.load(lambda: kernels.warmup(op, buf.dtype), watch)  # under the deadline (#22)
    execute(schedule, kernels.as_storage(buf), comm, reduce_into=kernels.kernel(op, buf.dtype),
            tag=tag, scratch=kernels.as_storage(scratch), traffic=traffic, watch=watch)
