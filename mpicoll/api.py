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

import array
import functools

import numpy as np
from mpi4py import MPI

from . import kernels, select, settings
from ._runtime.call import Call
from .executors.mpi import execute
from .registry import ALLREDUCE, Algorithm, lookup

__all__ = ["allreduce", "reduce_scatter_block", "allgather", "bcast", "ALGORITHMS"]

ALGORITHMS = tuple(ALLREDUCE)
_OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN}
_DTYPE_NAMES = ", ".join(str(d) for d in kernels.DTYPES)


# ----------------------------------------------------------------------------- argument checks

def _mpi_name(op) -> str:
    """``MPI.BAND`` for mpi4py's predefined op object, else its repr."""
    for name in dir(MPI):
        value = getattr(MPI, name)
        if isinstance(value, MPI.Op) and value == op and value != MPI.OP_NULL:
            return f"MPI.{name}"
    return repr(op)


def _op_name(op) -> str:
    if isinstance(op, str) and op.lower() in _OPS:
        return op.lower()
    if isinstance(op, MPI.Op):
        for name, mpi_op in _OPS.items():
            if op == mpi_op:
                return name
    shown = _mpi_name(op) if isinstance(op, MPI.Op) else repr(op)
    raise TypeError(f"unsupported op {shown}; expected MPI.SUM, MPI.PROD, MPI.MAX, MPI.MIN "
                    f"or one of {sorted(_OPS)}")


_BUFFERS = (memoryview, bytearray, bytes, array.array)


def _array(x, name: str, *, writable: bool = False) -> np.ndarray:
    if not isinstance(x, np.ndarray):
        how = (f"; wrap it without a copy: np.frombuffer({name}, dtype=...)"
               if isinstance(x, _BUFFERS) else
               f"; pass np.asarray({name})" if isinstance(x, (list, tuple)) else "")
        kind = type(x).__name__ if type(x).__module__ == "builtins" else \
            f"{type(x).__module__}.{type(x).__qualname__}"
        raise TypeError(f"{name} must be a numpy array, got {kind}{how}")
    if isinstance(x, np.ma.MaskedArray):
        raise TypeError(f"{name} is a masked array: mpicoll would reduce its masked values too; "
                        f"pass {name}.filled(value) (masked elements replaced) or "
                        f"np.asarray({name}) (all of them)")
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
#
# The order of every collective: this rank's own checks and the settings it needs (no
# communication); ``call.open()`` (collective on a communicator's first use); what needs the
# node layout (``auto``'s choice, the options of node-aware algorithms) and everything else that
# can still fail on this rank -- the schedule, the kernel, the scratch, copies; then the agreement
# step (``call.agree``); then only communication and copies that cannot fail. So a rank never
# raises after the others have passed the agreement step and wait for its messages.

_AUTO_SETTINGS = ("MPICOLL_TUNING", "MPICOLL_PROFILE", "MPICOLL_SHORT_MSG")


def _local_checks(algo: Algorithm | None, op: str | None, given: dict) -> None:
    """Read (parse and check) the settings this call will need, and check the algorithm's
    options given or set in the environment, all before any communication: a bad value raises
    here, naming it, on every rank that has it. (A default that depends on the node layout, and
    whether the options fit that layout, are checked once it is known.)"""
    if algo is None or algo.has("node-layout"):
        settings.get("MPICOLL_RANKS_PER_NODE")  # the node layout
    if algo is None:
        for name in _AUTO_SETTINGS:
            settings.get(name)
    if op is not None and (algo is None or not algo.library):
        kernels.kernel(op)                      # MPICOLL_KERNELS
    for option in algo.options if algo is not None else ():
        value = given.get(option.name)
        if value is None and option.env:
            value = settings.get(option.env)
        if value is not None:
            option.value(value)


@functools.lru_cache(maxsize=256)
def _schedule(algo: Algorithm, rank: int, size: int, count: int, options: tuple):
    return algo.schedule(rank, size, count, **dict(options))


def _prepare(call: Call, algo: Algorithm, count: int, dtype, op: str | None, options: dict):
    """What running ``algo``'s schedule needs -- the schedule, the kernel, the scratch -- made
    before the agreement step (None: nothing to run)."""
    comm = call.comm
    if algo.library or comm.Get_size() == 1 or count == 0:
        return None
    sched = _schedule(algo, comm.Get_rank(), comm.Get_size(), count, tuple(options.items()))
    reduce_into = kernels.kernel(op) if op is not None else None
    kernels.warmup()
    return sched, reduce_into, call.open().scratch(dtype, sched.scratch_elements)


def _run(call: Call, prepared, flat: np.ndarray) -> None:
    sched, reduce_into, scratch = prepared
    st = call.open()
    execute(sched, flat, st.comm, reduce_into=reduce_into, tag=call.tag, scratch=scratch,
            traffic=st.traffic, watch=call.watch)


def _options(call: Call, algo: Algorithm, given: dict) -> dict:
    """The algorithm's declared options, resolved and checked on this rank (before the
    agreement step), plus the node layout for node-aware algorithms."""
    nodes = call.open().nodes() if algo.has("node-layout") else None
    options = algo.resolve(given, nodes)
    if nodes is not None:
        options["nodes"] = nodes
    return options


# ----------------------------------------------------------------------------- collectives

def allreduce(sendbuf, recvbuf=None, *, op=MPI.SUM, algorithm="auto", comm=None,
              inner: str | None = None, outer: str | None = None, timeout=None,
              on_timeout=None, validate=None):
    """All-reduce: every rank gets ``op`` over all ranks' ``sendbuf``, element-wise.

    ``algorithm`` is one of ``ALGORITHMS`` or ``"auto"``. ``inner``/``outer`` choose the
    node-local and inter-node algorithms of ``hierarchical`` (also ``MPICOLL_HIER_INNER`` /
    ``MPICOLL_HIER_OUTER``). ``timeout``, ``on_timeout``, ``validate``: see the module's doc.
    Returns ``recvbuf``.
    """
    with Call("allreduce", algorithm, comm, timeout, on_timeout, validate) as call:
        opname = _op_name(op)
        algo = _algorithm("allreduce", algorithm)
        comm = call.comm
        send, recv = _buffers(sendbuf, recvbuf, lambda n: n, lambda s: s.shape)
        given = {"inner": inner, "outer": outer}
        if algo is None and any(v is not None for v in given.values()):
            raise ValueError("inner/outer apply only to an algorithm that declares them, "
                             "not to 'auto'")
        _local_checks(algo, opname, given)
        size, count = comm.Get_size(), recv.size
        if algo is None:
            algo = lookup("allreduce", select.allreduce(
                recv.nbytes, size, count, call.open().ranks_per_node if size > 1 else None))
        options = _options(call, algo, given)
        prepared = _prepare(call, algo, count, recv.dtype, opname, options)
        call.agree(algo.name, op=opname, dtype=recv.dtype, count=count,
                   inner=options.get("inner"), outer=options.get("outer"),
                   nodes=options.get("nodes"))
        if algo.library:
            call.mpi(MPI.Comm.Allreduce, MPI.Comm.Iallreduce,
                     MPI.IN_PLACE if send is None else send, recv, op=_OPS[opname])
            return recv
        if send is not None:        # same element count, any shape: copy over the flat views
            np.copyto(recv.reshape(-1), send.reshape(-1))
        if prepared is not None:
            _run(call, prepared, recv.reshape(-1))
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
        _local_checks(algo, opname, {})
        if algo is None:
            algo = lookup("reduce_scatter_block",
                          select.reduce_scatter_block(total * recv.itemsize, size))
        options = _options(call, algo, {})
        prepared = _prepare(call, algo, total if n else 0, recv.dtype, opname, options)
        work = None
        if not algo.library:        # the whole input, reduced in place (sendbuf is not modified)
            work = recv.reshape(-1) if send is None else send.reshape(-1).copy()
        call.agree(algo.name, op=opname, dtype=recv.dtype, count=n)
        if algo.library:
            call.mpi(MPI.Comm.Reduce_scatter_block, MPI.Comm.Ireduce_scatter_block,
                     MPI.IN_PLACE if send is None else send, recv, op=_OPS[opname])
            return recv
        if prepared is not None:
            _run(call, prepared, work)
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
        _local_checks(algo, None, {})
        if algo is None:
            algo = lookup("allgather", select.allgather(recv.nbytes, size))
        options = _options(call, algo, {})
        prepared = _prepare(call, algo, recv.size if n else 0, recv.dtype, None, options)
        call.agree(algo.name, dtype=recv.dtype, count=n)
        if algo.library:
            call.mpi(MPI.Comm.Allgather, MPI.Comm.Iallgather,
                     MPI.IN_PLACE if send is None else send, recv)
            return recv
        flat = recv.reshape(-1)
        if send is not None:
            np.copyto(flat[rank * n:(rank + 1) * n], send.reshape(-1))
        if prepared is not None:
            _run(call, prepared, flat)
        return recv


def bcast(buf, root=0, *, algorithm="auto", comm=None, timeout=None, on_timeout=None,
          validate=None):
    """Broadcast ``buf`` from ``root`` to every rank, in place. Returns ``buf``."""
    with Call("bcast", algorithm, comm, timeout, on_timeout, validate) as call:
        algo = _algorithm("bcast", algorithm)
        comm = call.comm
        buf = _array(buf, "buf", writable=True)
        size = comm.Get_size()
        if not isinstance(root, (int, np.integer)) or isinstance(root, (bool, np.bool_)):
            raise TypeError(f"root must be an integer rank, got {type(root).__name__} {root!r}")
        if not 0 <= root < size:
            raise ValueError(f"root {root!r} out of range for a communicator of size {size}")
        root = int(root)
        _local_checks(algo, None, {})
        if algo is None:
            algo = lookup("bcast", select.bcast(buf.nbytes, size))
        options = {**_options(call, algo, {}), "root": root}
        prepared = _prepare(call, algo, buf.size, buf.dtype, None, options)
        call.agree(algo.name, dtype=buf.dtype, count=buf.size, root=root)
        if algo.library:
            call.mpi(MPI.Comm.Bcast, MPI.Comm.Ibcast, buf, root=root)
            return buf
        if prepared is not None:
            _run(call, prepared, buf.reshape(-1))
        return buf
