"""Buffers: what a collective's arguments point at, read as numpy views, and how each
collective lays its input, work buffer and output out over them.

``view``/``array`` read anything with ``__array_interface__``, ``__dlpack__`` (a CPU tensor) or
the buffer protocol as a numpy array over the caller's own memory, never a copy, and check it
(dtype, C-contiguous, writable where written). ``allreduce``, ``reduce_scatter_block``,
``allgather`` and ``bcast`` pair the buffers of one call and return its ``Layout``: the flat
array the schedule runs on (``work``), the copies before and after the run, and the result.
Every form of a collective (blocking, nonblocking, persistent) runs the same layout.
"""

from __future__ import annotations

import array
from typing import NamedTuple

import numpy as np
from mpi4py import MPI

from . import kernels
from .ops import DTYPE_NAMES

__all__ = ["view", "as_numpy", "array", "pair", "root", "Layout", "allreduce", "reduce_scatter_block",
           "allgather", "bcast"]

_DLPACK_CPU = 1         # DLPack's kDLCPU


def kind(x) -> str:
    t = type(x)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


_DLPACK_CPU = 1         # DLPack's kDLCPU


def view(x, name: str) -> np.ndarray:
    """A numpy array over ``x``'s own memory, never a copy: ``x`` has ``__array_interface__``
    (or ``__array_struct__``), ``__dlpack__`` (a CPU tensor: PyTorch, JAX ...) or the buffer
    protocol (``array.array``, ``memoryview``: their format gives the dtype; ``bytearray`` and
    ``bytes`` are uint8, ``bytes`` read-only)."""
    if type(x) in _BUFFER_TYPES:                # the buffer protocol's usual objects, first
        return _from_buffer(x if type(x) is memoryview else memoryview(x), x, name)
    if isinstance(x, (list, tuple)):
        raise TypeError(f"{name} must be an array, got {type(x).__name__}; pass "
                        f"np.asarray({name}) (a copy: a result would not land in the "
                        f"{type(x).__name__})")
    if isinstance(x, np.generic):               # a scalar: immutable, so read-only here
        view = np.array(x)
        view.flags.writeable = False
        return view
    if hasattr(x, "__array_interface__") or hasattr(x, "__array_struct__"):
        return np.asarray(x)                    # numpy maps the interface: no copy
    if hasattr(x, "__dlpack__"):
        device = x.__dlpack_device__() if hasattr(x, "__dlpack_device__") else None
        if device is not None and device[0] != _DLPACK_CPU:
            raise TypeError(f"{name} ({kind(x)}) lives on DLPack device {tuple(device)}, not "
                            f"the CPU: mpicoll reduces host memory; pass a CPU tensor")
        try:
            return np.from_dlpack(x, copy=False)
        except (BufferError, TypeError, ValueError, RuntimeError) as exc:
            raise TypeError(f"{name} ({kind(x)}) cannot be read through DLPack without a "
                            f"copy: {exc}") from None
    try:
        memory = memoryview(x)
    except TypeError:
        raise TypeError(f"{name} must be an array (numpy, or an object with the buffer "
                        f"protocol, __array_interface__ or __dlpack__), got {kind(x)}") from None
    return _from_buffer(memory, x, name)


def _from_buffer(memory: memoryview, x, name: str) -> np.ndarray:
    try:
        return np.asarray(memory)
    except (TypeError, ValueError, NotImplementedError) as exc:
        raise TypeError(f"{name} ({kind(x)}) has buffer format {memory.format!r}, which numpy "
                        f"cannot read: {exc}") from None


_BUFFER_TYPES = frozenset({memoryview, bytearray, bytes, array.array})


def as_numpy(x):
    """``x`` as a numpy view of its memory where it can be read as one (a buffer object,
    ``__array_interface__``, ``__dlpack__``), so that a call with it finds its plan in the
    cache as a numpy array's would; else ``x`` itself (the full path then names what is wrong,
    on the rank that passed it, inside the call)."""
    kind_of = type(x)
    if kind_of in _BUFFER_TYPES:
        try:
            return np.asarray(x if kind_of is memoryview else memoryview(x))
        except (TypeError, ValueError, NotImplementedError):
            return x
    if x is None or x is MPI.IN_PLACE or isinstance(x, (np.ndarray, list, tuple)):
        return x
    try:
        return view(x, "buffer")
    except (TypeError, ValueError, BufferError):
        return x


def array(x, name: str, *, writable: bool = False) -> np.ndarray:
    if not isinstance(x, np.ndarray):           # numpy first: its path is unchanged
        x = view(x, name)
    if isinstance(x, np.ma.MaskedArray):
        raise TypeError(f"{name} is a masked array: mpicoll would reduce its masked values too; "
                        f"pass {name}.filled(value) (masked elements replaced) or "
                        f"np.asarray({name}) (all of them)")
    if x.dtype not in kernels.DTYPES:
        raise TypeError(f"{name} has unsupported dtype {x.dtype}; supported: {DTYPE_NAMES}")
    if not x.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (got strides {x.strides} for shape "
                         f"{x.shape}); pass np.ascontiguousarray({name})")
    if writable and not x.flags.writeable:
        raise ValueError(f"{name} is read-only")
    return x


def pair(sendbuf, recvbuf, recv_count, recv_shape):
    """Check and pair the buffers: returns (input array or None for IN_PLACE, output array).

    ``recv_count(n)`` is the element count recvbuf must have for a sendbuf of n elements, and
    ``recv_shape(sendbuf)`` the shape of a recvbuf to allocate.
    """
    if sendbuf is MPI.IN_PLACE:
        if recvbuf is None:
            raise ValueError("sendbuf=MPI.IN_PLACE needs a recvbuf holding the input")
        return None, array(recvbuf, "recvbuf", writable=True)
    send = array(sendbuf, "sendbuf")
    want = recv_count(send.size)
    if recvbuf is None:
        return send, np.empty(recv_shape(send), send.dtype)
    recv = array(recvbuf, "recvbuf", writable=True)
    if recv.dtype != send.dtype:
        raise ValueError(f"recvbuf dtype {recv.dtype} does not match sendbuf dtype {send.dtype}")
    if recv.size != want:
        raise ValueError(f"recvbuf has {recv.size} elements, expected {want} "
                         f"(sendbuf has {send.size})")
    if np.may_share_memory(send, recv):
        raise ValueError("sendbuf and recvbuf overlap; for an in-place call pass "
                         "sendbuf=MPI.IN_PLACE")
    return send, recv


def _reduce_scatter_pair(sendbuf, recvbuf, size: int):
    """reduce_scatter_block's buffers: ``(send or None, recv, total elements, block size)``."""
    def block_shape(s):
        return s.shape[1:] if s.ndim > 1 and s.shape[0] == size else (s.size // size,)

    send, recv = pair(sendbuf, recvbuf, lambda n: n // size, block_shape)
    total = recv.size if send is None else send.size
    if total % size:
        raise ValueError(f"{'recvbuf' if send is None else 'sendbuf'} has {total} elements, "
                         f"not a multiple of the communicator size {size}")
    return send, recv, total, total // size


def _allgather_pair(sendbuf, recvbuf, size: int):
    """allgather's buffers: ``(send or None, recv, block size)``."""
    send, recv = pair(sendbuf, recvbuf, lambda n: n * size, lambda s: (size,) + s.shape)
    if recv.size % size:
        raise ValueError(f"recvbuf has {recv.size} elements, not a multiple of the "
                         f"communicator size {size}")
    return send, recv, recv.size // size


def root(root, size: int) -> int:
    if not isinstance(root, (int, np.integer)) or isinstance(root, (bool, np.bool_)):
        raise TypeError(f"root must be an integer rank, got {type(root).__name__} {root!r}")
    if not 0 <= root < size:
        raise ValueError(f"root {root!r} out of range for a communicator of size {size}")
    return int(root)


class Layout(NamedTuple):
    """One call's buffers: ``work`` (flat) is what a schedule runs on; ``before`` and ``after``
    are ``(dst, src)`` copies around the run; ``result`` is what the call returns; ``send``
    (None: in place) and ``recv`` are what the MPI library's own collective takes; ``block``
    is the elements of one rank's block (reduce_scatter_block, allgather; else the count).

    ``source`` (flat), where ``before`` copies a whole input into ``work``: an executor that
    reads the input itself where no step wrote yet (``compiled``: ``Schedule.first_touch``)
    runs on ``work`` without that copy; ``kept``: the ``(lo, hi)`` of ``work`` the call keeps
    (None: all of it)."""

    work: np.ndarray
    before: tuple
    after: tuple
    result: np.ndarray
    send: np.ndarray | None
    recv: np.ndarray
    block: int
    source: np.ndarray | None = None
    kept: tuple | None = None

    def copy_in(self) -> None:
        for dst, src in self.before:
            np.copyto(dst, src)

    def copy_out(self) -> None:
        for dst, src in self.after:
            np.copyto(dst, src)


def allreduce(sendbuf, recvbuf) -> Layout:
    """The result lands in recvbuf; the schedule runs on it, the input copied in first (or
    read where no step wrote yet: ``Layout.source``)."""
    send, recv = pair(sendbuf, recvbuf, lambda n: n, lambda s: s.shape)
    work = recv.reshape(-1)
    source = None if send is None else send.reshape(-1)
    before = () if send is None else ((work, source),)
    return Layout(work, before, (), recv, send, recv, recv.size, source)


def reduce_scatter_block(sendbuf, recvbuf, size: int, rank: int) -> Layout:
    """The schedule runs on a buffer of the whole input's size (sendbuf is never modified; in
    place, recvbuf keeps everything but its first block, as MPICH and Open MPI leave it): a copy
    of it, or (``Layout.source``) the input read where no step wrote yet. Block ``rank`` of it
    lands in recvbuf's first block."""
    send, recv, total, n = _reduce_scatter_pair(sendbuf, recvbuf, size)
    work = np.empty(total, recv.dtype)
    source = (recv if send is None else send).reshape(-1)
    after = ((recv.reshape(-1)[:n], work[rank * n:(rank + 1) * n]),)
    return Layout(work, ((work, source),), after, recv, send, recv, n, source,
                  (rank * n, (rank + 1) * n))


def allgather(sendbuf, recvbuf, size: int, rank: int) -> Layout:
    """The schedule runs on recvbuf, this rank's block copied in first (unless in place)."""
    send, recv, n = _allgather_pair(sendbuf, recvbuf, size)
    work = recv.reshape(-1)
    before = () if send is None else ((work[rank * n:(rank + 1) * n], send.reshape(-1)),)
    return Layout(work, before, (), recv, send, recv, n)


def bcast(buf) -> Layout:
    """In place on ``buf``."""
    buf = array(buf, "buf", writable=True)
    return Layout(buf.reshape(-1), (), (), buf, None, buf, buf.size)
