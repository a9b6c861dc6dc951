"""Reproducible collectives as nested calls (``algorithm="mpi"`` / ``"shm"``, blocking: a MAX of
the bin codes, an exact integer SUM of the slices, one rounding, each phase one plain blocking
call), auto's settings, and the argument checks and local pieces every form shares."""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .. import buffers, cache, plan
from .._runtime.call import Call
from .._runtime.context import state
from ..buffers import array
from .binned import _CODE_DTYPE, BinnedSum, _check_terms, _format, _k, codes, rounded, slices
from .slice_kernels import _shift_into

# Above this many limb bytes per rank, ``auto`` reduce-scatters the slices and all-gathers the
# floats (3 collectives, fewer bytes); below, one all-reduce of the slices (fewer messages).
SPLIT_BYTES = 256 << 10
SPLIT = "nodes"     # when auto splits: "nodes" (ranks on several nodes), "always", "never"
# auto, large, an array of float32/float64, every rank on one node where shm runs: the values
# meet in shm's window (``Job._run_window``) instead of the exchange and the all-gather
WINDOW = True


def _options(op, compress, error_feedback):
    if not (op == MPI.SUM if isinstance(op, MPI.Op) else
            isinstance(op, str) and op.lower() == "sum"):
        raise ValueError(f"reproducible=True needs op SUM (MPI.SUM or 'sum'), got {op!r}")
    if compress is not None or error_feedback is not None:
        raise ValueError("reproducible=True can't be combined with compress= or "
                         "error_feedback= (they round on the wire)")


def _input(sendbuf, recvbuf, k, shape_of_recv, in_place_copy=True):
    """``(BinnedSum or array, recv array, k)`` from the caller's buffers (in place: a copy of
    recvbuf, or recvbuf itself with ``in_place_copy=False``)."""
    if isinstance(sendbuf, BinnedSum):
        if k is not None and _k(k, sendbuf.dtype) != sendbuf.k:
            raise ValueError(f"k={k} but the BinnedSum was made with k={sendbuf.k}")
        recv = _output(recvbuf, sendbuf, shape_of_recv, "the BinnedSum's")
        return sendbuf, recv, sendbuf.k
    if sendbuf is MPI.IN_PLACE:
        if recvbuf is None:
            raise ValueError("sendbuf=MPI.IN_PLACE needs a recvbuf holding the input")
        recv = array(recvbuf, "recvbuf", writable=True)
        send = recv.copy() if in_place_copy else recv
    else:
        send = array(sendbuf, "sendbuf")
        recv = _output(recvbuf, send, shape_of_recv, "sendbuf dtype")
    _format(send.dtype)
    return send, recv, _k(k, send.dtype)


def _output(recvbuf, source, shape_of_recv, whose: str) -> np.ndarray:
    """The call's result array: ``recvbuf`` (writable, of ``source``'s dtype), or a new one
    shaped by ``shape_of_recv`` from ``source`` (an array or a BinnedSum)."""
    if recvbuf is None:
        return np.empty(shape_of_recv(source.shape, source.size), source.dtype)
    recv = array(recvbuf, "recvbuf", writable=True)
    if recv.dtype != source.dtype:
        raise ValueError(f"recvbuf dtype {recv.dtype} does not match {whose} {source.dtype}")
    return recv


def _local_codes(src, code_dtype) -> np.ndarray:
    if isinstance(src, BinnedSum):
        return src.codes.astype(code_dtype)
    return codes(src, code_dtype)


def _local_slices(src, top, k, *, out=None, block=None, stride=None) -> np.ndarray:
    """This rank's slices below ``top`` (laid out as in ``_slices_into``)."""
    if not isinstance(src, BinnedSum):
        return slices(src, top, k, out=out, block=block, stride=stride)
    if out is None:
        out = np.empty(top.size * k, np.int64)
    block = (top.size or 1) if block is None else block
    stride = block * k if stride is None else stride
    _shift_into(src.codes, src.limbs, top, k, out, block, stride, False)
    return out


def _terms(src) -> int:
    return src.terms if isinstance(src, BinnedSum) else 1


def allreduce(sendbuf, recvbuf=None, *, op="sum", algorithm="auto", comm=None, k=None,
              inner=None, outer=None, order=None, timeout=None, on_timeout=None, validate=None,
              compress=None, error_feedback=None):
    """Reproducible all-reduce (SUM): ``mpicoll.allreduce``'s arguments, and ``sendbuf`` may be
    a ``BinnedSum``; ``k``: slices per value (``DEFAULT_K``). The same bits for the same global
    multiset of values whatever the rank count, algorithm, executor, segments or nodes."""
    _options(op, compress, error_feedback)
    src, recv, k = _input(sendbuf, recvbuf, k, lambda shape, n: shape)
    if recv.size != src.size:
        raise ValueError(f"recvbuf has {recv.size} elements, expected {src.size}")
    common = dict(comm=comm, timeout=timeout, on_timeout=on_timeout, validate=validate)
    explicit = {"inner": inner, "outer": outer, "order": order} if algorithm != "auto" else {}
    given = {"inner": None, "outer": None, "order": None, **explicit}
    code_dtype = _CODE_DTYPE[algorithm == "shm" or inner == "shm"]
    n, dtype = src.size, recv.dtype
    # Phase 1: every element's top bin.
    top = _plain("allreduce", _local_codes(src, code_dtype), op=MPI.MAX, algorithm=algorithm,
                 given=given, **common)
    size = (comm or MPI.COMM_WORLD).Get_size()
    terms = _terms(src)
    large = _large(algorithm, size, src, k)
    if large and SPLIT != "never" and (SPLIT == "always" or _across_nodes(comm)):
        # Phase 2 (large, several nodes): reduce-scatter the slices (each block ends with the
        # term count), round this rank's block, all-gather the floats.
        block = -(-n // size)
        stride = block * k + 1
        buf = np.zeros(size * stride, np.int64)
        buf[stride - 1::stride] = terms
        _local_slices(src, top, k, out=buf, block=block, stride=stride)
        mine = _plain("reduce_scatter_block", buf, op=MPI.SUM, algorithm="auto", **common)
        _check_terms(int(mine[-1]))
        return _rounded_blocks(mine, block, top, k, recv, comm, common)
    # Phase 2: one all-reduce of the slices and the term count, with the caller's algorithm.
    buf = np.empty(n * k + 1, np.int64)
    _local_slices(src, top, k, out=buf[:n * k])
    buf[-1] = terms
    _plain("allreduce", MPI.IN_PLACE, buf, op=MPI.SUM, algorithm=algorithm, given=given,
           **common)
    _check_terms(int(buf[-1]))
    # Phase 3: one rounding; auto, large: each rank rounds its block, then an all-gather.
    if large:
        rank = (comm or MPI.COMM_WORLD).Get_rank()
        lo = min(rank * -(-n // size), n)
        return _rounded_blocks(buf[lo:], n, top, k, recv, comm, common)
    rounded(buf, top, k, dtype, out=recv.reshape(-1))
    return recv


def _rounded_blocks(limbs, step, top, k, recv, comm, common):
    """``auto``, large (the module's nested calls): this rank rounds its block of the n
    elements, whose slice sums are ``limbs`` (slice j of its element i at limbs[j * step + i]),
    then the floats are all-gathered into ``recv``; returns ``recv``."""
    comm = comm or MPI.COMM_WORLD
    n, size, rank = recv.size, comm.Get_size(), comm.Get_rank()
    block = -(-n // size)
    lo, hi = min(rank * block, n), min((rank + 1) * block, n)
    floats = np.zeros(size * block, recv.dtype)
    rounded(limbs, top[lo:hi], k, recv.dtype, block=step, out=floats[lo:hi])
    _plain("allgather", MPI.IN_PLACE, floats, algorithm="auto", **common)
    np.copyto(recv.reshape(-1), floats[:n])
    return recv


def _large(algorithm, size: int, src, k: int) -> bool:
    """Whether ``auto`` splits the work by blocks, each rank rounding its own (more than
    ``SPLIT_BYTES`` of slices per rank; an array's values then travel by the exchange)."""
    return algorithm == "auto" and size > 1 and src.size * k * 8 > SPLIT_BYTES


def _across_nodes(comm) -> bool:
    """Whether the ranks span several nodes (then ``auto`` splits the slices' sum: fewer bytes
    cross the network; on one node the shared-memory all-reduce of the slices is faster)."""
    return len(state(comm or MPI.COMM_WORLD).real_nodes) > 1


def reduce_scatter_block(sendbuf, recvbuf=None, *, op="sum", algorithm="auto", comm=None,
                         k=None, timeout=None, on_timeout=None, validate=None):
    """Reproducible reduce-scatter (SUM): ``mpicoll.reduce_scatter_block``'s arguments, and
    ``sendbuf`` may be a ``BinnedSum``; rank r gets block r of the reproducible sum."""
    _options(op, None, None)
    size = (comm or MPI.COMM_WORLD).Get_size()

    def block_shape(shape, total):
        return shape[1:] if len(shape) > 1 and shape[0] == size else (total // size,)

    src, recv, k = _input(sendbuf, recvbuf, k, block_shape)
    if src.size % size:
        raise ValueError(f"sendbuf has {src.size} elements, not a multiple of the "
                         f"communicator size {size}")
    n = src.size // size
    if recv.size != n:
        raise ValueError(f"recvbuf has {recv.size} elements, expected {n}")
    common = dict(comm=comm, timeout=timeout, on_timeout=on_timeout, validate=validate)
    top = _plain("allreduce", _local_codes(src, np.int8), op=MPI.MAX, algorithm="auto",
                 given={"inner": None, "outer": None, "order": None}, **common)
    stride = n * k + 1
    buf = np.zeros(size * stride, np.int64)
    buf[stride - 1::stride] = _terms(src)
    _local_slices(src, top, k, out=buf, block=n or 1, stride=stride)
    mine = _plain("reduce_scatter_block", buf, op=MPI.SUM, algorithm=algorithm, **common)
    _check_terms(int(mine[-1]))
    rank = (comm or MPI.COMM_WORLD).Get_rank()
    np.copyto(recv.reshape(-1), rounded(mine, top[rank * n:(rank + 1) * n], k, recv.dtype))
    return recv


# ----------------------------------------------------------------------------- every form


def _plain(collective: str, sendbuf, recvbuf=None, *, op="", algorithm, comm, timeout,
           on_timeout, validate, given=None):
    """One phase of the nested calls: the plain blocking ``collective`` as ``mpicoll.api`` runs
    it -- by its cached plan (``cache``) when the same call came before, else a ``Call``, the
    buffers' ``Layout``, ``plan.make`` and ``plan.run`` -- returns the result. ``op``: ``""``
    for the all-gather (none); ``given``: the all-reduce's inner, outer and order."""
    options = () if given is None else (given["inner"], given["outer"], given["order"])
    if collective == "allreduce":       # (the cache's all-reduce looks its key up itself)
        done = cache.allreduce(sendbuf, recvbuf, op, algorithm, options, timeout, on_timeout,
                               validate, comm)
        if done is not None:
            return done
    key = cache.key(collective, sendbuf, recvbuf, op, algorithm, options, timeout, on_timeout,
                    validate)           # (the plan's, for the cache to keep)
    if key is not None and collective != "allreduce":
        done = getattr(cache, collective)(key, sendbuf, recvbuf, comm)
        if done is not None:
            return done
    with Call(collective, algorithm, comm, timeout, on_timeout, validate) as call:
        if collective == "allreduce":
            layout = buffers.allreduce(sendbuf, recvbuf)
        else:
            layout = getattr(buffers, collective)(sendbuf, recvbuf, call.comm.Get_size(),
                                                  call.comm.Get_rank())
        p = plan.make(call, collective, algorithm, layout, op=op or None, given=given)
        return plan.run(call, p, layout, key)
