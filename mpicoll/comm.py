"""mpi4py's buffer collectives run by mpicoll's algorithms: a drop-in for code written for mpi4py.

    comm = mpicoll.Comm(MPI.COMM_WORLD.Dup())     # or mpicoll.wrap(...)
    comm.Allreduce([sbuf, MPI.DOUBLE], [rbuf, MPI.DOUBLE], op=MPI.SUM)     # mpicoll's allreduce
    comm.algorithm = "ring"                      # every later call (default "auto")
    comm.Get_rank(), comm.Barrier(), comm.allreduce(obj)    # the wrapped communicator's own

``Allreduce``, ``Reduce_scatter_block``, ``Allgather``, ``Bcast``, their nonblocking forms
(``Iallreduce`` ...) and persistent forms (``Allreduce_init`` ...) take mpi4py's arguments and
buffer specs: ``buf``; ``[buf, datatype]``; ``[buf, count]``; ``[buf, count, datatype]``;
``[buf, (count, displ), datatype]``; ``[buf, count, displ, datatype]`` (count and displacement
in elements of the datatype); ``MPI.IN_PLACE`` (or ``None``) as the send buffer. The MPI
datatype says how the bytes are read (``mpi4py.util.dtlib.to_numpy_dtype``), without a copy:
the result lands in the caller's buffer. ``buf`` is anything ``mpicoll.allreduce`` takes: a
numpy array, an object with the buffer protocol, ``__array_interface__`` or ``__dlpack__``.
Without a datatype the buffer's own dtype is used, so a bfloat16 array (which MPI has no
datatype for) works too. Counts that are not given are inferred as mpi4py does: the whole
buffer, split into ``comm.size`` blocks where the call has blocks (``Allgather``'s receive
buffer, ``Reduce_scatter_block``'s send buffer, or its receive buffer in place). As in mpi4py
the blocking calls return None.

An op, datatype or buffer mpicoll cannot do raises mpicoll's error (``TypeError`` or
``ValueError`` naming it) on the calling rank, before any communication: there is no silent
fall-back to the MPI library. (``algorithm="mpi"`` runs the library's own collective.)

Requests: ``Iallreduce`` (...) returns a ``Request`` with mpi4py's ``Wait()`` and
``Test()``, and ``Allreduce_init`` (...) a ``Prequest`` with ``Start()``, ``Wait()``,
``Test()``. These are not ``MPI.Request`` objects -- the collective runs in mpicoll's progress
engine, not inside MPI, so there is no MPI request handle that MPI could complete -- and
``MPI.Request.Waitall`` refuses them (``TypeError``). Use
``mpicoll.comm.Request.Waitall(requests)`` (also ``Testall``, ``Prequest.Startall``), which
takes mpicoll's and MPI's requests mixed.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from . import api, buffers, kernels, ops, persistent

__all__ = ["Comm", "wrap", "Request", "Prequest"]


# ----------------------------------------------------------------------------- buffer specs

_PREDEFINED: dict = {}      # handle -> numpy dtype, for MPI's predefined datatypes (they live
                            # as long as MPI; a derived one's handle can be reused once freed)


def _dtype(datatype, name: str) -> np.dtype:
    """The numpy dtype an MPI datatype (or an mpi4py typecode string) reads memory as."""
    if isinstance(datatype, MPI.Datatype):
        dtype = _PREDEFINED.get(datatype.handle)
        if dtype is not None:
            return dtype
    from mpi4py.util import dtlib
    shown = datatype
    try:
        if isinstance(datatype, str):
            datatype = MPI.Datatype.fromcode(datatype)
        shown = datatype.Get_name() or repr(datatype)
        dtype = dtlib.to_numpy_dtype(datatype)
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise TypeError(f"{name}: {shown!r} is not an MPI datatype mpicoll can map to a numpy "
                        f"dtype ({exc})") from None
    if dtype not in kernels.DTYPES:
        raise TypeError(f"{name}: MPI datatype {shown} (numpy {dtype}) is not one mpicoll "
                        f"reduces; supported: {ops.DTYPE_NAMES}")
    if datatype.is_predefined:
        _PREDEFINED[datatype.handle] = dtype
    return dtype


def _is_datatype(x) -> bool:
    return isinstance(x, (MPI.Datatype, str))


def _message(msg, name: str, blocks: int = 1) -> np.ndarray:
    """The elements a buffer spec names, as a numpy view of the caller's memory (no copy).

    ``blocks``: the call reads ``blocks`` blocks of ``count`` elements (an inferred count is
    the whole buffer, which must then split into ``blocks`` equal blocks)."""
    count = displ = datatype = None
    if isinstance(msg, (list, tuple)):
        if len(msg) == 2:
            buf, second = msg
            if _is_datatype(second):
                datatype = second
            elif isinstance(second, (list, tuple)):
                count, displ = second
            else:
                count = second
        elif len(msg) == 3:
            buf, count, datatype = msg
            if isinstance(count, (list, tuple)):
                count, displ = count
        elif len(msg) == 4:
            buf, count, displ, datatype = msg
        else:
            raise ValueError(f"{name}: a buffer spec is buf, [buf, datatype], [buf, count, "
                             f"datatype], [buf, (count, displ), datatype] or [buf, count, "
                             f"displ, datatype]; got a {type(msg).__name__} of {len(msg)} items")
    else:
        buf = msg
    arr = buf if isinstance(buf, np.ndarray) else buffers.view(buf, name)
    if count is None and displ is None and datatype is None:
        return arr                  # mpicoll checks it (dtype, contiguity, writability)
    if isinstance(arr, np.ma.MaskedArray) or not arr.flags.c_contiguous:
        buffers.array(arr, name)       # its error: masked, or not contiguous
    dtype = arr.dtype if datatype is None else _dtype(datatype, name)
    extent, raw = dtype.itemsize, arr.reshape(-1).view(np.uint8)
    displ = _nonnegative(displ, "displacement", name)
    offset = displ * extent
    if offset > raw.size:
        raise ValueError(f"{name}: displacement {displ} is past the end of the buffer "
                         f"({raw.size // extent} elements of {dtype})")
    available = raw.size - offset
    if count is None:
        if available % extent:
            raise ValueError(f"{name}: cannot infer the count: {available} bytes are not a "
                             f"whole number of {dtype} elements ({extent} bytes)")
        n = available // extent
        if n % blocks:
            raise ValueError(f"{name}: cannot infer the count: {n} elements do not split into "
                             f"{blocks} blocks (the communicator size)")
    else:
        n = _nonnegative(count, "count", name) * blocks
        if n * extent > available:
            raise ValueError(f"{name}: count {count}{f' x {blocks} blocks' if blocks > 1 else ''}"
                             f" of {dtype} needs {n * extent} bytes, the buffer has {available}"
                             f"{f' after displacement {displ}' if displ else ''}")
    return raw[offset:offset + n * extent].view(dtype)


def _nonnegative(value, what: str, name: str) -> int:
    if value is None:
        return 0
    if not isinstance(value, (int, np.integer)) or isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: the {what} must be an integer, got {value!r}")
    if value < 0:
        raise ValueError(f"{name}: negative {what} {value}")
    return int(value)


def _in_place(sendbuf) -> bool:
    return sendbuf is None or sendbuf is MPI.IN_PLACE


# ----------------------------------------------------------------------------- requests

class Request:
    """mpi4py's request interface over an mpicoll request (``Comm.Iallreduce``)."""

    def __init__(self, request):
        self._request = request

    def Wait(self, status=None) -> bool:
        """Wait until the collective is done (raises its error); True, as mpi4py's."""
        self._request.wait()
        return True

    def Test(self, status=None) -> bool:
        """Move the collective on if this thread progresses it; whether it is done."""
        return self._request.test()

    @staticmethod
    def Waitall(requests, statuses=None) -> bool:
        """``MPI.Request.Waitall`` for mpicoll's requests, MPI's ones mixed in."""
        for request in requests:
            request.Wait()
        return True

    @staticmethod
    def Testall(requests, statuses=None) -> bool:
        """``MPI.Request.Testall``: whether all are done (every one is tested)."""
        return all([request.Test() for request in requests])

    def __repr__(self) -> str:
        return f"<mpicoll.comm.Request {self._request!r}>"


class Prequest(Request):
    """mpi4py's persistent request interface over ``mpicoll.allreduce_init``'s handle.

    ``Start()`` runs the whole collective (``mpicoll.persistent``: no background progress), so
    ``Test()`` is always True and ``Wait()`` returns at once."""

    def Start(self) -> None:
        if self._request is None:
            raise ValueError("Start() on a persistent request that was freed")
        self._request.start()

    def Wait(self, status=None) -> bool:
        self._request.wait()
        return True

    def Test(self, status=None) -> bool:
        self._request.wait()
        return True

    def Free(self) -> None:
        """Drop the handle (mpicoll's persistent handles hold no MPI request of their own,
        except with ``algorithm="mpi"``, which MPI frees with the handle)."""
        self._request = None

    @staticmethod
    def Startall(requests) -> None:
        for request in requests:
            request.Start()

    @property
    def result(self) -> np.ndarray:
        """The receive buffer (a numpy view of it)."""
        return self._request.result


# ----------------------------------------------------------------------------- the wrapper

class Comm:
    """An mpi4py communicator whose buffer collectives mpicoll runs; see the module's doc.

    ``algorithm`` (default ``"auto"``, settable) is used by every call. Every other attribute
    is the wrapped communicator's (``self.comm``). It is not an ``MPI.Comm`` itself: where one
    is required (another library, ``comm=`` of mpicoll's functions), pass ``self.comm``."""

    def __init__(self, comm=None, algorithm: str = "auto"):
        if isinstance(comm, Comm):
            comm = comm.comm
        comm = MPI.COMM_WORLD if comm is None else comm
        if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
            raise TypeError(f"mpicoll.Comm wraps an MPI intracommunicator, got {comm!r}")
        self.comm = comm
        self.algorithm = algorithm

    def __getattr__(self, name: str):          # only for what this class does not define
        if name == "comm":                      # not set yet (unpickling, a failed __init__)
            raise AttributeError(name)
        return getattr(self.comm, name)

    def __repr__(self) -> str:
        return f"<mpicoll.Comm algorithm={self.algorithm!r} over {self.comm!r}>"

    # what Python looks up on the type, not through __getattr__: as the communicator's
    def __eq__(self, other) -> bool:
        return self.comm == (other.comm if isinstance(other, Comm) else other)

    def __ne__(self, other) -> bool:
        return not self == other

    __hash__ = None             # as mpi4py's communicators

    def __bool__(self) -> bool:
        return bool(self.comm)

    # the buffers of each collective, read as mpi4py reads them (see the module's doc)

    def _pair(self, sendbuf, recvbuf, send_blocks=1, recv_blocks=1):
        recv = _message(recvbuf, "recvbuf", recv_blocks)
        send = MPI.IN_PLACE if _in_place(sendbuf) else _message(sendbuf, "sendbuf", send_blocks)
        return send, recv

    def _scatter_pair(self, sendbuf, recvbuf):
        size = self.comm.Get_size()
        if _in_place(sendbuf):      # the whole input in recvbuf: size blocks
            return MPI.IN_PLACE, _message(recvbuf, "recvbuf", size)
        return self._pair(sendbuf, recvbuf, send_blocks=size)

    def _gather_pair(self, sendbuf, recvbuf):
        return self._pair(sendbuf, recvbuf, recv_blocks=self.comm.Get_size())

    @property
    def _how(self) -> dict:
        return {"algorithm": self.algorithm, "comm": self.comm}

    # blocking (None, as mpi4py's), nonblocking (Request), persistent (Prequest)

    def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM) -> None:
        api.allreduce(*self._pair(sendbuf, recvbuf), op=op, **self._how)

    def Iallreduce(self, sendbuf, recvbuf, op=MPI.SUM) -> Request:
        return Request(api.iallreduce(*self._pair(sendbuf, recvbuf), op=op, **self._how))

    def Allreduce_init(self, sendbuf, recvbuf, op=MPI.SUM, info=None) -> Prequest:
        return Prequest(persistent.allreduce_init(*self._pair(sendbuf, recvbuf), op=op,
                                                  **self._how))

    def Reduce_scatter_block(self, sendbuf, recvbuf, op=MPI.SUM) -> None:
        api.reduce_scatter_block(*self._scatter_pair(sendbuf, recvbuf), op=op, **self._how)

    def Ireduce_scatter_block(self, sendbuf, recvbuf, op=MPI.SUM) -> Request:
        return Request(api.ireduce_scatter_block(*self._scatter_pair(sendbuf, recvbuf), op=op,
                                                 **self._how))

    def Reduce_scatter_block_init(self, sendbuf, recvbuf, op=MPI.SUM, info=None) -> Prequest:
        return Prequest(persistent.reduce_scatter_block_init(
            *self._scatter_pair(sendbuf, recvbuf), op=op, **self._how))

    def Allgather(self, sendbuf, recvbuf) -> None:
        api.allgather(*self._gather_pair(sendbuf, recvbuf), **self._how)

    def Iallgather(self, sendbuf, recvbuf) -> Request:
        return Request(api.iallgather(*self._gather_pair(sendbuf, recvbuf), **self._how))

    def Allgather_init(self, sendbuf, recvbuf, info=None) -> Prequest:
        return Prequest(persistent.allgather_init(*self._gather_pair(sendbuf, recvbuf),
                                                  **self._how))

    def Bcast(self, buf, root: int = 0) -> None:
        api.bcast(_message(buf, "buf"), root, **self._how)

    def Ibcast(self, buf, root: int = 0) -> Request:
        return Request(api.ibcast(_message(buf, "buf"), root, **self._how))

    def Bcast_init(self, buf, root: int = 0, info=None) -> Prequest:
        return Prequest(persistent.bcast_init(_message(buf, "buf"), root, **self._how))


def wrap(comm=None, algorithm: str = "auto") -> Comm:
    """``Comm(comm, algorithm)``."""
    return Comm(comm, algorithm)
