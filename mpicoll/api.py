"""The public collectives: each is a ``Call``, a ``Layout`` of its buffers, a ``Plan``, and a verb.

Semantics follow MPI's: ``comm`` defaults to ``MPI.COMM_WORLD``; ``sendbuf=MPI.IN_PLACE`` means
``recvbuf`` holds the input and receives the result; ``recvbuf=None`` allocates and returns it;
out-of-place calls never modify ``sendbuf``; any C-contiguous numpy array is reduced element-wise
over its flat view. Bad input raises on the calling rank before any communication.

Every form of a collective -- the blocking call here, its nonblocking ``i*`` form, its persistent
``*_init`` form (``mpicoll.persistent``), ``Buckets``, ``mpicoll.Comm`` -- makes the same plan
(``mpicoll.plan``: checks, ``auto``'s choice and every option the decision table sets, the
executor, the signature every rank agrees on) and differs only in the verb that runs it: ``run``,
``start`` or ``bind``. A plain call that comes again with the same arguments finds its plan in
the cache (``mpicoll.cache``).

Every collective also takes three keyword-only reliability options (``mpicoll._runtime.call``;
docs/reliability.md): ``timeout`` (seconds; default ``MPICOLL_TIMEOUT``, else 600; ``math.inf``:
none) bounds every wait and raises ``CollectiveTimeout`` naming the missing ranks (or
``ArgumentMismatch`` when the ranks' arguments, hashed into the message tags, differ);
``on_timeout="abort"`` (default ``MPICOLL_ON_TIMEOUT``) calls ``MPI_Abort`` instead;
``validate=True`` (default ``MPICOLL_VALIDATE``) first checks that every rank passed the same
count, dtype, op, algorithm and root, raising ``ArgumentMismatch`` on every rank if not.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from . import buffers, cache, compression, plan
from ._runtime.call import Call
from .executors.progress import Request
from .registry import ALLREDUCE
from .reproducible.forms import dispatch

__all__ = ["allreduce", "reduce_scatter_block", "allgather", "bcast", "ALGORITHMS",
           "iallreduce", "ireduce_scatter_block", "iallgather", "ibcast", "waitall", "Request"]

ALGORITHMS = tuple(ALLREDUCE)


# ----------------------------------------------------------------------------- blocking

def allreduce(sendbuf, recvbuf=None, *, op=MPI.SUM, algorithm="auto", comm=None,
              inner: str | None = None, outer: str | None = None, order: str | None = None,
              timeout=None, on_timeout=None, validate=None, compress=None, error_feedback=None,
              reproducible=False, average=False):
    """All-reduce: every rank gets ``op`` over all ranks' ``sendbuf``, element-wise.

    ``algorithm`` is one of ``ALGORITHMS`` or ``"auto"``. ``inner``/``outer`` choose the
    node-local and inter-node algorithms of ``hierarchical`` (also ``MPICOLL_HIER_INNER`` /
    ``MPICOLL_HIER_OUTER``); ``order`` the order ``ring`` visits the ranks, ``"rank"``,
    ``"node"`` or ``"rail"`` (also ``MPICOLL_RING_ORDER``; ``mpicoll.topology.ring_order``).
    ``timeout``, ``on_timeout``, ``validate``: see the module's doc.
    ``compress`` / ``error_feedback``: see ``iallreduce`` (the call is ``iallreduce(...).wait()``).
    ``reproducible=True`` (or K, the slices per value): a SUM with the same bits whatever the
    rank count, algorithm or layout (``mpicoll.reproducible``; ``sendbuf`` may be a BinnedSum).
    ``average=True``: the sum divided by the number of ranks (floating-point or complex values,
    op SUM; not with ``reproducible``), a field of the call's signature as ``op`` is.
    Returns ``recvbuf``.
    """
    if reproducible is not False:
        _no_average(average)
        return dispatch("blocking", "allreduce", reproducible, sendbuf, recvbuf, op=op,
                        algorithm=algorithm, comm=comm,
                        given={"inner": inner, "outer": outer, "order": order},
                        timeout=timeout, on_timeout=on_timeout, validate=validate,
                        compress=compress, error_feedback=error_feedback)
    if compress is not None or error_feedback is not None:
        return iallreduce(sendbuf, recvbuf, op=op, algorithm=algorithm, comm=comm, inner=inner,
                          outer=outer, order=order, timeout=timeout, on_timeout=on_timeout,
                          validate=validate, compress=compress,
                          error_feedback=error_feedback, average=average).wait()
    if type(sendbuf) is not np.ndarray or type(recvbuf) is not np.ndarray:
        sendbuf, recvbuf = buffers.as_numpy(sendbuf), buffers.as_numpy(recvbuf)
    if not average:
        done = cache.allreduce(sendbuf, recvbuf, op, algorithm, (inner, outer, order), timeout,
                               on_timeout, validate, comm)
        if done is not None:
            return done
    key = None if average else cache.key("allreduce", sendbuf, recvbuf, op, algorithm,
                                         (inner, outer, order), timeout, on_timeout, validate)
    with Call("allreduce", algorithm, comm, timeout, on_timeout, validate) as call:
        layout = buffers.allreduce(sendbuf, recvbuf)
        p = plan.make(call, "allreduce", algorithm, layout, op=op,
                      given={"inner": inner, "outer": outer, "order": order}, average=average)
        return plan.run(call, p, layout, key)


def _no_average(average) -> None:
    if average:
        raise NotImplementedError("average=True with reproducible=: divide the reproducible "
                                  "sum by the number of ranks yourself")


def reduce_scatter_block(sendbuf, recvbuf=None, *, op=MPI.SUM, algorithm="auto", comm=None,
                         timeout=None, on_timeout=None, validate=None, reproducible=False,
                         average=False):
    """Reduce-scatter: rank r gets block r (``sendbuf.size / comm.size`` elements) of the reduction.

    With ``MPI.IN_PLACE`` the input is the whole ``recvbuf``; the result lands in its first
    block and the rest of it is left as it was. A new ``recvbuf`` has shape
    ``sendbuf.shape[1:]`` when ``sendbuf.shape[0]`` equals the communicator size, else it is flat.
    ``reproducible``, ``average``: as ``allreduce``'s.
    """
    if reproducible is not False:
        _no_average(average)
        return dispatch("blocking", "reduce_scatter_block", reproducible, sendbuf, recvbuf,
                        op=op, algorithm=algorithm, comm=comm, timeout=timeout,
                        on_timeout=on_timeout, validate=validate)
    if type(sendbuf) is not np.ndarray or type(recvbuf) is not np.ndarray:
        sendbuf, recvbuf = buffers.as_numpy(sendbuf), buffers.as_numpy(recvbuf)
    key = None if average else cache.key("reduce_scatter_block", sendbuf, recvbuf, op,
                                         algorithm, (), timeout, on_timeout, validate)
    if key is not None:
        done = cache.reduce_scatter_block(key, sendbuf, recvbuf, comm)
        if done is not None:
            return done
    with Call("reduce_scatter_block", algorithm, comm, timeout, on_timeout, validate) as call:
        layout = buffers.reduce_scatter_block(sendbuf, recvbuf, call.comm.Get_size(),
                                              call.comm.Get_rank())
        p = plan.make(call, "reduce_scatter_block", algorithm, layout, op=op, average=average)
        return plan.run(call, p, layout, key)


def allgather(sendbuf, recvbuf=None, *, algorithm="auto", comm=None, timeout=None,
              on_timeout=None, validate=None):
    """All-gather: every rank gets all ranks' ``sendbuf`` concatenated in rank order.

    With ``MPI.IN_PLACE`` rank r's input is block r of ``recvbuf``. A new ``recvbuf`` has shape
    ``(comm.size,) + sendbuf.shape``.
    """
    if type(sendbuf) is not np.ndarray or type(recvbuf) is not np.ndarray:
        sendbuf, recvbuf = buffers.as_numpy(sendbuf), buffers.as_numpy(recvbuf)
    key = cache.key("allgather", sendbuf, recvbuf, "", algorithm, (), timeout, on_timeout,
                    validate)
    if key is not None:
        done = cache.allgather(key, sendbuf, recvbuf, comm)
        if done is not None:
            return done
    with Call("allgather", algorithm, comm, timeout, on_timeout, validate) as call:
        layout = buffers.allgather(sendbuf, recvbuf, call.comm.Get_size(), call.comm.Get_rank())
        p = plan.make(call, "allgather", algorithm, layout)
        return plan.run(call, p, layout, key)


def bcast(buf, root=0, *, algorithm="auto", comm=None, timeout=None, on_timeout=None,
          validate=None):
    """Broadcast ``buf`` from ``root`` to every rank, in place. Returns ``buf``."""
    if type(buf) is not np.ndarray:
        buf = buffers.as_numpy(buf)
    key = None if type(root) is not int else cache.key(
        "bcast", MPI.IN_PLACE, buf, "", algorithm, (root,), timeout, on_timeout, validate)
    if key is not None:
        done = cache.bcast(key, buf, comm)
        if done is not None:
            return done
    with Call("bcast", algorithm, comm, timeout, on_timeout, validate) as call:
        layout = buffers.bcast(buf)
        p = plan.make(call, "bcast", algorithm, layout,
                      root=buffers.root(root, call.comm.Get_size()))
        return plan.run(call, p, layout, key)


# ----------------------------------------------------------------------------- nonblocking

def waitall(requests) -> list:
    """Wait for every request (in the order given: any order is safe); return their results."""
    return [r.wait() for r in requests]


def iallreduce(sendbuf, recvbuf=None, *, op=MPI.SUM, algorithm="auto", comm=None,
               inner: str | None = None, outer: str | None = None, order: str | None = None,
               compress=None,
               error_feedback=None, timeout=None, on_timeout=None, validate=None,
               reproducible=False, average=False) -> Request:
    """Start an all-reduce; returns a ``Request`` (``wait()`` returns ``recvbuf``).

    Arguments as ``allreduce``. Do not touch ``sendbuf`` or ``recvbuf`` until the request is
    done. ``compress="bf16" | "fp16" | "int8"`` sends fp32 data narrowed and reduces in fp32 at
    each hop (``mpicoll.compression``: where it rounds, and why every rank still ends with the
    same bits); ``error_feedback=ErrorFeedback(n)`` adds the residual of the previous call
    into this one's input first. Compression needs float32 and ``op="sum"``.
    ``timeout`` runs from this call; ``validate=True`` agrees here, before the request starts.
    ``reproducible=True`` (or K): the blocking call's bits (``mpicoll.reproducible.Job``, run
    whole by the progress engine; one of mpicoll's schedules, not ``mpi`` or ``shm``).
    """
    if reproducible is not False:
        _no_average(average)
        return dispatch("nonblocking", "allreduce", reproducible, sendbuf, recvbuf, op=op,
                        algorithm=algorithm, comm=comm,
                        given={"inner": inner, "outer": outer, "order": order},
                        timeout=timeout, on_timeout=on_timeout, validate=validate,
                        compress=compress, error_feedback=error_feedback)
    with Call("allreduce", algorithm, comm, timeout, on_timeout, validate) as call:
        layout = buffers.allreduce(sendbuf, recvbuf)
        compression.check_feedback(error_feedback, compress, layout.work.size)
        return plan.begin(call, "allreduce", algorithm, layout, op=op, compress=compress,
                          given={"inner": inner, "outer": outer, "order": order},
                          error_feedback=error_feedback, average=average)


def ireduce_scatter_block(sendbuf, recvbuf=None, *, op=MPI.SUM, algorithm="auto", comm=None,
                          timeout=None, on_timeout=None, validate=None,
                          reproducible=False, average=False) -> Request:
    """Start a reduce-scatter (arguments as ``reduce_scatter_block``); returns a ``Request``."""
    if reproducible is not False:
        _no_average(average)
        return dispatch("nonblocking", "reduce_scatter_block", reproducible, sendbuf, recvbuf,
                        op=op, algorithm=algorithm, comm=comm, timeout=timeout,
                        on_timeout=on_timeout, validate=validate)
    with Call("reduce_scatter_block", algorithm, comm, timeout, on_timeout, validate) as call:
        layout = buffers.reduce_scatter_block(sendbuf, recvbuf, call.comm.Get_size(),
                                              call.comm.Get_rank())
        return plan.begin(call, "reduce_scatter_block", algorithm, layout, op=op,
                          average=average)


def iallgather(sendbuf, recvbuf=None, *, algorithm="auto", comm=None, timeout=None,
               on_timeout=None, validate=None) -> Request:
    """Start an all-gather (arguments as ``allgather``); returns a ``Request``."""
    with Call("allgather", algorithm, comm, timeout, on_timeout, validate) as call:
        layout = buffers.allgather(sendbuf, recvbuf, call.comm.Get_size(), call.comm.Get_rank())
        return plan.begin(call, "allgather", algorithm, layout)


def ibcast(buf, root=0, *, algorithm="auto", comm=None, timeout=None, on_timeout=None,
           validate=None) -> Request:
    """Start a broadcast of ``buf`` from ``root``, in place; returns a ``Request``."""
    with Call("bcast", algorithm, comm, timeout, on_timeout, validate) as call:
        layout = buffers.bcast(buf)
        return plan.begin(call, "bcast", algorithm, layout,
                          root=buffers.root(root, call.comm.Get_size()))
