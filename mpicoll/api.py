"""The public collectives: argument checks, buffer set-up, algorithm choice, execution.

Semantics follow MPI's: ``comm`` defaults to ``MPI.COMM_WORLD``; ``sendbuf=MPI.IN_PLACE`` means
``recvbuf`` holds the input and receives the result; ``recvbuf=None`` allocates and returns it;
out-of-place calls never modify ``sendbuf``; any C-contiguous numpy array is reduced element-wise
over its flat view. Bad input raises on the calling rank before any communication.

Every collective also takes three keyword-only reliability options (``mpicoll._runtime.call``;
docs/reliability.md): ``timeout`` (seconds; default ``MPICOLL_TIMEOUT``, else none) bounds every
wait and raises ``CollectiveTimeout`` naming the missing ranks; ``on_timeout="abort"`` (default
``MPICOLL_ON_TIMEOUT``) calls ``MPI_Abort`` instead; ``validate=True`` (default
``MPICOLL_VALIDATE``) first checks that every rank passed the same count, dtype, op, algorithm
and root, raising ``ArgumentMismatch`` on every rank if not.
"""

from __future__ import annotations

import functools

import numpy as np
from mpi4py import MPI

from . import kernels, select
from ._runtime.call import Call
from .executors.mpi import execute
from .registry import ALLREDUCE, Algorithm, lookup

__all__ = ["allreduce", "reduce_scatter_block", "allgather", "bcast", "ALGORITHMS"]

ALGORITHMS = tuple(ALLREDUCE)
_OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN}
_DTYPE_NAMES = ", ".join(str(d) for d in kernels.DTYPES)


# ----------------------------------------------------------------------------- argument checks

def _op_name(op) -> str:
    if isinstance(op, str) and op.lower() in _OPS:
        return op.lower()
    if isinstance(op, MPI.Op):
        for name, mpi_op in _OPS.items():
            if op == mpi_op:
                return name
    raise TypeError(f"unsupported op {op!r}; expected MPI.SUM, MPI.PROD, MPI.MAX, MPI.MIN "
                    f"or one of {sorted(_OPS)}")


def _array(x, name: str, *, writable: bool = False) -> np.ndarray:
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(x).__name__}")
    if x.dtype not in kernels.DTYPES:
        raise TypeError(f"{name} has unsupported dtype {x.dtype}; supported: {_DTYPE_NAMES}")
    if not x.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (got strides {x.strides} for shape "
                         f"{x.shape}); pass np.ascontiguousarray({name})")
    if writable and not x.flags.writeable:
        raise ValueError(f"{name} is read-only")
    return x


def _algorithm(collective: str, algorithm) -> Algorithm | None:
    """The declared algorithm (an alias is resolved), or None for ``auto``."""
    return None if algorithm == "auto" else lookup(collective, algorithm)


def _buffers(sendbuf, recvbuf, recv_count, recv_shape):
    """Check and pair the buffers: returns (input array or None for IN_PLACE, output array).

    ``recv_count(n)`` is the element count recvbuf must have for a sendbuf of n elements, and
    ``recv_shape(sendbuf)`` the shape of a recvbuf to allocate.
    """
    if sendbuf is MPI.IN_PLACE:
        if recvbuf is None:
            raise ValueError("sendbuf=MPI.IN_PLACE needs a recvbuf holding the input")
        return None, _array(recvbuf, "recvbuf", writable=True)
    send = _array(sendbuf, "sendbuf")
    want = recv_count(send.size)
    if recvbuf is None:
        return send, np.empty(recv_shape(send), send.dtype)
    recv = _array(recvbuf, "recvbuf", writable=True)
    if recv.dtype != send.dtype:
        raise ValueError(f"recvbuf dtype {recv.dtype} does not match sendbuf dtype {send.dtype}")
    if recv.size != want:
        raise ValueError(f"recvbuf has {recv.size} elements, expected {want} "
                         f"(sendbuf has {send.size})")
    if np.may_share_memory(send, recv):
        raise ValueError("sendbuf and recvbuf overlap; for an in-place call pass "
                         "sendbuf=MPI.IN_PLACE")
    return send, recv


# ----------------------------------------------------------------------------- execution

@functools.lru_cache(maxsize=256)
def _plan(algo: Algorithm, rank: int, size: int, count: int, options: tuple, nodes: tuple):
    """The schedule, and how many elements it sends to ranks on other nodes (for the traffic
    counters: counted once per schedule, not per message)."""
    kwargs = dict(options, **({"nodes": nodes} if algo.has("node-layout") else {}))
    sched = algo.schedule(rank, size, count, **kwargs)
    node_of = {r: j for j, members in enumerate(nodes) for r in members}
    internode = sum(hi - lo for _, sends in sched.plan for peer, lo, hi in sends
                    if node_of[peer] != node_of[rank])
    return sched, internode


def _run(call: Call, algo: Algorithm, flat: np.ndarray, op: str, options: dict) -> None:
    st, comm = call.open(), call.comm
    sched, internode = _plan(algo, comm.Get_rank(), comm.Get_size(), flat.size,
                             tuple(options.items()), st.nodes())
    kernels.warmup()
    execute(sched, flat, st.comm, reduce_into=kernels.kernel(op), tag=call.tag,
            scratch=st.scratch(flat.dtype, sched.scratch_elements), traffic=st.traffic,
            watch=call.watch, internode_elements=internode)


def _options(call: Call, algo: Algorithm, given: dict, auto: bool = False) -> dict:
    """The algorithm's declared options, resolved and checked on this rank (before any
    agreement or message); ``auto``: in the order ``select`` gives rings across nodes. The node
    layout itself is added by ``_run``."""
    nodes = call.open().nodes() if algo.has("node-layout") else None
    if auto and "order" in {o.name for o in algo.options}:
        given = {**given, "order": select.ring_order(nodes)}
    return algo.resolve(given, nodes)


# ----------------------------------------------------------------------------- collectives

def allreduce(sendbuf, recvbuf=None, *, op=MPI.SUM, algorithm="auto", comm=None,
              inner: str | None = None, outer: str | None = None, order: str | None = None,
              timeout=None, on_timeout=None, validate=None):
    """All-reduce: every rank gets ``op`` over all ranks' ``sendbuf``, element-wise.

    ``algorithm`` is one of ``ALGORITHMS`` or ``"auto"``. ``inner``/``outer`` choose the
    node-local and inter-node algorithms of ``hierarchical`` (also ``MPICOLL_HIER_INNER`` /
    ``MPICOLL_HIER_OUTER``); ``order`` the order ``ring`` visits the ranks, ``"rank"``,
    ``"node"`` or ``"rail"`` (also ``MPICOLL_RING_ORDER``; ``mpicoll.topology.ring_order``).
    ``timeout``, ``on_timeout``, ``validate``: see the module's doc.
    Returns ``recvbuf``.
    """
    with Call("allreduce", algorithm, comm, timeout, on_timeout, validate) as call:
        opname = _op_name(op)
        algo = _algorithm("allreduce", algorithm)
        comm = call.comm
        send, recv = _buffers(sendbuf, recvbuf, lambda n: n, lambda s: s.shape)
        given = {"inner": inner, "outer": outer, "order": order}
        auto = algo is None
        if auto and any(v is not None for v in given.values()):
            raise ValueError("inner/outer/order apply only to an algorithm that declares them, "
                             "not to 'auto'")
        size, count = comm.Get_size(), recv.size
        if auto:
            algo = lookup("allreduce", select.allreduce(
                recv.nbytes, size, count, call.open().ranks_per_node if size > 1 else None))
        options = _options(call, algo, given, auto)
        call.agree(algo.name, op=opname, dtype=recv.dtype, count=count,
                   inner=options.get("inner"), outer=options.get("outer"))
        if algo.library:
            call.mpi(MPI.Comm.Allreduce, MPI.Comm.Iallreduce,
                     MPI.IN_PLACE if send is None else send, recv, op=_OPS[opname])
            return recv
        if send is not None:        # same element count, any shape: copy over the flat views
            np.copyto(recv.reshape(-1), send.reshape(-1))
        if size > 1 and count > 0:
            _run(call, algo, recv.reshape(-1), opname, options)
        return recv


def reduce_scatter_block(sendbuf, recvbuf=None, *, op=MPI.SUM, algorithm="auto", comm=None,
                         timeout=None, on_timeout=None, validate=None):
    """Reduce-scatter: rank r gets block r (``sendbuf.size / comm.size`` elements) of the reduction.

    With ``MPI.IN_PLACE`` the input is the whole ``recvbuf`` and the result lands in its first
    block. A new ``recvbuf`` has shape ``sendbuf.shape[1:]`` when ``sendbuf.shape[0]`` equals the
    communicator size, else it is flat.
    """
    with Call("reduce_scatter_block", algorithm, comm, timeout, on_timeout, validate) as call:
        opname = _op_name(op)
        algo = _algorithm("reduce_scatter_block", algorithm)
        comm = call.comm
        size = comm.Get_size()

        def block_shape(s):
            return s.shape[1:] if s.ndim > 1 and s.shape[0] == size else (s.size // size,)

        send, recv = _buffers(sendbuf, recvbuf, lambda n: n // size, block_shape)
        total = recv.size if send is None else send.size
        if total % size:
            raise ValueError(f"{'recvbuf' if send is None else 'sendbuf'} has {total} elements, "
                             f"not a multiple of the communicator size {size}")
        n = total // size
        auto = algo is None
        if auto:
            algo = lookup("reduce_scatter_block",
                          select.reduce_scatter_block(total * recv.itemsize, size))
        options = _options(call, algo, {}, auto)
        call.agree(algo.name, op=opname, dtype=recv.dtype, count=n)
        if algo.library:
            call.mpi(MPI.Comm.Reduce_scatter_block, MPI.Comm.Ireduce_scatter_block,
                     MPI.IN_PLACE if send is None else send, recv, op=_OPS[opname])
            return recv
        work = recv.reshape(-1) if send is None else send.reshape(-1).copy()
        if size > 1 and n > 0:
            _run(call, algo, work, opname, options)
        rank = comm.Get_rank()
        np.copyto(recv.reshape(-1)[:n], work[rank * n:(rank + 1) * n])
        return recv


def allgather(sendbuf, recvbuf=None, *, algorithm="auto", comm=None, timeout=None,
              on_timeout=None, validate=None):
    """All-gather: every rank gets all ranks' ``sendbuf`` concatenated in rank order.

    With ``MPI.IN_PLACE`` rank r's input is block r of ``recvbuf``. A new ``recvbuf`` has shape
    ``(comm.size,) + sendbuf.shape``.
    """
    with Call("allgather", algorithm, comm, timeout, on_timeout, validate) as call:
        algo = _algorithm("allgather", algorithm)
        comm = call.comm
        size, rank = comm.Get_size(), comm.Get_rank()
        send, recv = _buffers(sendbuf, recvbuf, lambda n: n * size,
                              lambda s: (size,) + s.shape)
        if recv.size % size:
            raise ValueError(f"recvbuf has {recv.size} elements, not a multiple of the "
                             f"communicator size {size}")
        n = recv.size // size
        auto = algo is None
        if auto:
            algo = lookup("allgather", select.allgather(recv.nbytes, size))
        options = _options(call, algo, {}, auto)
        call.agree(algo.name, dtype=recv.dtype, count=n)
        if algo.library:
            call.mpi(MPI.Comm.Allgather, MPI.Comm.Iallgather,
                     MPI.IN_PLACE if send is None else send, recv)
            return recv
        flat = recv.reshape(-1)
        if send is not None:
            np.copyto(flat[rank * n:(rank + 1) * n], send.reshape(-1))
        if size > 1 and n > 0:
            _run(call, algo, flat, "sum", options)
        return recv


def bcast(buf, root=0, *, algorithm="auto", comm=None, timeout=None, on_timeout=None,
          validate=None):
    """Broadcast ``buf`` from ``root`` to every rank, in place. Returns ``buf``."""
    with Call("bcast", algorithm, comm, timeout, on_timeout, validate) as call:
        algo = _algorithm("bcast", algorithm)
        comm = call.comm
        buf = _array(buf, "buf", writable=True)
        size = comm.Get_size()
        if not isinstance(root, (int, np.integer)) or isinstance(root, (bool, np.bool_)) \
                or not 0 <= root < size:
            raise ValueError(f"root {root!r} out of range for a communicator of size {size}")
        root = int(root)
        if algo is None:
            algo = lookup("bcast", select.bcast(buf.nbytes, size))
        options = {**_options(call, algo, {}), "root": root}
        call.agree(algo.name, dtype=buf.dtype, count=buf.size, root=root)
        if algo.library:
            call.mpi(MPI.Comm.Bcast, MPI.Comm.Ibcast, buf, root=root)
            return buf
        if size > 1 and buf.size > 0:
            _run(call, algo, buf.reshape(-1), "sum", options)
        return buf
