"""mpi4py's buffer collectives run by mpicoll's algorithms: a drop-in for code written for mpi4py.

    comm = mpicoll.Comm(MPI.COMM_WORLD.Dup())     # or mpicoll.wrap(...)
    comm.Allreduce([sbuf, MPI.DOUBLE], [rbuf, MPI.DOUBLE], op=MPI.SUM)     # mpicoll's allreduce
    comm.algorithm = "ring"                      # every later call that has it (default "auto")
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

``Bcast`` and ``Allgather`` only copy, so they take any datatype (as bytes, or packed with
``MPI_Pack`` when it has holes). In place, ``Reduce_scatter_block`` leaves the rest of the
buffer as it was. ``algorithm`` is a name (each collective that has it runs it, the others
``auto``) or a ``{collective: name}`` mapping.

``comm.reproducible = True`` (or K, the slices per value; default False) makes every float SUM
of ``Allreduce`` and ``Reduce_scatter_block``, in each form, give the same bits whatever the
rank count, algorithm or node layout (``mpicoll.reproducible``). Their other ops and integer
sums are exact already and run as usual; a floating-point PROD raises ``ValueError`` (there is
no reproducible product).

An op, datatype or buffer mpicoll cannot do raises mpicoll's error (``TypeError`` or
``ValueError`` naming it; ``Unsupported`` for a datatype it doesn't reduce or device memory) on
the calling rank, before any communication: there is no silent fall-back to the MPI library.
(``algorithm="mpi"`` runs the library's own collective; so does ``fallback=True`` for what
raises ``Unsupported``, counted in ``Comm.fallbacks``.)

Requests are MPI requests: ``Iallreduce`` (...) returns a ``Request``, an MPI generalized
request that completes with mpicoll's collective, and ``Allreduce_init`` (...) a ``Prequest``,
an MPI persistent request whose ``Start()`` starts the collective and returns at once. ``MPI.Request.Waitall``,
``Testall``, ``Waitany`` ... take them (with mpicoll's progress thread, the default under
``MPI_THREAD_MULTIPLE``; under ``MPICOLL_PROGRESS=caller`` use ``Request.Waitall`` ..., which
move the collectives). docs/buffers.md has the details.
"""

from __future__ import annotations

import collections
import itertools
import os
from collections.abc import Mapping

import numpy as np
from mpi4py import MPI

from . import api, buffers, kernels, ops, persistent, recovery, registry
from .executors import progress

__all__ = ["Comm", "wrap", "Request", "Prequest", "Unsupported"]


# ----------------------------------------------------------------------------- buffer specs

_PREDEFINED: dict = {}      # handle -> how it is read, for MPI's predefined datatypes (they live
                            # as long as MPI; a derived one's handle can be reused once freed)
_COPY_ONLY = ("allgather", "bcast")


def _datatype(datatype, name: str, copy: bool):
    """How an MPI datatype (or an mpi4py typecode string) is read: a numpy dtype mpicoll
    reduces, or (``copy``: for a collective that only copies) ``("bytes", extent)`` for a
    dense type it doesn't (``MPI.LONG_DOUBLE``, a contiguous derived type), or ``("packed",
    datatype)`` for one with holes (an indexed type: ``MPI_Pack`` / ``MPI_Unpack``)."""
    how = _PREDEFINED.get(datatype.handle) if isinstance(datatype, MPI.Datatype) else None
    if how is None:
        shown = datatype
        try:
            if isinstance(datatype, str):
                datatype = MPI.Datatype.fromcode(datatype)
            if not isinstance(datatype, MPI.Datatype) or datatype == MPI.DATATYPE_NULL:
                raise TypeError("not a datatype")
            shown = datatype.Get_name() or repr(datatype)
        except (KeyError, ValueError, TypeError, AttributeError) as exc:
            raise TypeError(f"{name}: {shown!r} is not an MPI datatype ({exc})") from None
        from mpi4py.util import dtlib
        try:
            how = dtlib.to_numpy_dtype(datatype)
        except (KeyError, ValueError, TypeError) as exc:
            how = f"no numpy dtype: {exc}"
        if not isinstance(how, np.dtype) or how not in kernels.DTYPES:
            lb, extent = datatype.Get_extent()
            true_lb, true_extent = datatype.Get_true_extent()
            dense = lb == true_lb == 0 and datatype.Get_size() == extent == true_extent
            how = ("bytes", extent, f"{shown} ({how})") if dense else \
                ("packed", datatype, f"{shown} ({how})")
        if datatype.is_predefined:
            _PREDEFINED[datatype.handle] = how
    if not copy and not isinstance(how, np.dtype):
        raise Unsupported(f"{name}: MPI datatype {how[2]} is not one mpicoll reduces; "
                        f"supported: {ops.DTYPE_NAMES} (a broadcast or all-gather takes any "
                        "type: it only copies)")
    return how


class Unsupported(TypeError):
    """What mpicoll can't run (a datatype it doesn't reduce, device memory): with
    ``Comm(..., fallback=True)`` the MPI library's own collective runs it instead."""


def _is_datatype(x) -> bool:
    return isinstance(x, (MPI.Datatype, str))


class _LegacyDLPack:
    """An object whose ``__dlpack__`` takes only ``stream`` (the protocol before DLPack 1.0), as
    numpy's ``from_dlpack`` asks for it (``max_version``, ``dl_device``, ``copy``)."""

    def __init__(self, x):
        self.x = x

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        if copy:
            raise BufferError("mpicoll reads the caller's memory: no copy")
        return self.x.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self.x.__dlpack_device__()


def _view(buf, name: str, typed: bool = True) -> np.ndarray:
    """``api._view``; an object with the older ``__dlpack__(stream=None)`` is read too: with
    ``typed=False`` (the spec's datatype says how to read it) as mpi4py reads it (its bytes,
    ``MPI.buffer``), else through numpy's ``from_dlpack``."""
    if hasattr(buf, "__cuda_array_interface__"):
        raise Unsupported(f"{name} ({buffers.kind(buf)}) has __cuda_array_interface__: device "
                          "memory, and mpicoll reduces host memory")
    try:
        return buffers.view(buf, name)
    except TypeError as exc:
        if not hasattr(buf, "__dlpack__") or hasattr(buf, "__array_interface__"):
            raise
        first = str(exc)        # not the exception: its traceback would hold ``buf`` in a
                                # cycle, freed only by the garbage collector
    try:
        if not typed:
            device = buf.__dlpack_device__() if hasattr(buf, "__dlpack_device__") else (1, 0)
            if device[0] == 1:                          # kDLCPU
                return np.asarray(MPI.buffer(buf))      # uint8, writable as mpi4py takes it
            raise TypeError(first)
        view = buffers.view(_LegacyDLPack(buf), name)
    except (TypeError, ValueError, BufferError):
        raise TypeError(first) from None
    if not view.flags.writeable:    # numpy can't tell (the old protocol has no read-only flag):
        view = np.asarray(_Writable(view))      # writable, as mpi4py takes it
    return view


class _Writable:
    """The memory of a read-only array, writable (it stays the array's base)."""

    def __init__(self, array: np.ndarray):
        interface = dict(array.__array_interface__)
        interface["data"] = (interface["data"][0], False)
        self.__array_interface__, self._array = interface, array


class _Packed:
    """``count`` elements of a datatype with holes, at the start of ``region`` (bytes): packed
    into contiguous ``bytes`` (``pack()``, MPI_Pack) and unpacked back (``unpack()``)."""

    def __init__(self, region: np.ndarray, count: int, datatype, name: str):
        _, extent = datatype.Get_extent()
        true_lb, true_extent = datatype.Get_true_extent()
        end = count and (count - 1) * extent + true_lb + true_extent
        if count and (true_lb < 0 or extent <= 0 or end > region.size
                      or count * extent > region.size):
            raise ValueError(f"{name}: {count} elements of datatype {datatype.Get_name()!r} "
                             f"(extent {extent}, true lower bound {true_lb}, true extent "
                             f"{true_extent}) reach past the buffer's {region.size} bytes")
        self.region = region[:count * extent]
        self.datatype, self.name = datatype, name
        self.bytes = np.empty(count * datatype.Get_size(), np.uint8)

    def pack(self) -> None:
        if self.bytes.size:
            n = self.datatype.Pack(self.region, self.bytes, 0, MPI.COMM_SELF)
            assert n == self.bytes.size, (n, self.bytes.size)

    def unpack(self) -> None:
        if self.bytes.size:
            self.datatype.Unpack(self.bytes, 0, self.region, MPI.COMM_SELF)


def _message(msg, name: str, blocks: int = 1, copy: bool = False):
    """The elements a buffer spec names, as a numpy view of the caller's memory (no copy); or,
    for a datatype with holes (``copy`` only), a ``_Packed``.

    ``blocks``: the call reads ``blocks`` blocks of ``count`` elements (an inferred count is
    the whole buffer, which must then split into ``blocks`` equal blocks). ``copy``: the
    collective only copies (bcast, allgather), so any datatype will do."""
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
    arr = buf if isinstance(buf, np.ndarray) else _view(buf, name, typed=datatype is None)
    if count is None and displ is None and datatype is None:
        if copy and arr.dtype not in kernels.DTYPES and arr.flags.c_contiguous \
                and not isinstance(arr, np.ma.MaskedArray):
            return arr.reshape(-1).view(np.uint8)   # only copied: any dtype, as bytes
        return arr                  # mpicoll checks it (dtype, contiguity, writability)
    if isinstance(arr, np.ma.MaskedArray) or not arr.flags.c_contiguous:
        buffers.array(arr, name)       # its error: masked, or not contiguous
    how = arr.dtype if datatype is None else _datatype(datatype, name, copy)
    if isinstance(how, np.dtype):
        dtype = how
        if copy and dtype not in kernels.DTYPES:
            how = ("bytes", dtype.itemsize, str(dtype))
    if not isinstance(how, np.dtype):
        dtype = np.dtype(np.uint8) if how[0] == "bytes" else None
        shown = how[2]
    extent = how.itemsize if isinstance(how, np.dtype) else \
        how[1] if how[0] == "bytes" else how[1].Get_extent()[1]
    shown = dtype if isinstance(how, np.dtype) else shown
    raw = arr.reshape(-1).view(np.uint8)
    displ = _nonnegative(displ, "displacement", name)
    offset = displ * extent
    if offset > raw.size:
        raise ValueError(f"{name}: displacement {displ} is past the end of the buffer "
                         f"({raw.size // extent} elements of {shown})")
    available = raw.size - offset
    if count is None:
        if available % extent:
            raise ValueError(f"{name}: cannot infer the count: {available} bytes are not a "
                             f"whole number of {shown} elements ({extent} bytes)")
        n = available // extent
        if n % blocks:
            raise ValueError(f"{name}: cannot infer the count: {n} elements do not split into "
                             f"{blocks} blocks (the communicator size)")
    else:
        n = _nonnegative(count, "count", name) * blocks
        if n * extent > available and not (isinstance(how, tuple) and how[0] == "packed"):
            raise ValueError(f"{name}: count {count}{f' x {blocks} blocks' if blocks > 1 else ''}"
                             f" of {shown} needs {n * extent} bytes, the buffer has {available}"
                             f"{f' after displacement {displ}' if displ else ''}")
    if isinstance(how, tuple) and how[0] == "packed":
        return _Packed(raw[offset:], n, how[1], name)
    return raw[offset:offset + n * extent].view(dtype)


def _nonnegative(value, what: str, name: str) -> int:
    if value is None:
        return 0
    if not isinstance(value, (int, np.integer)) or isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: the {what} must be an integer, got {value!r}")
    if value < 0:
        raise ValueError(f"{name}: negative {what} {value}")
    return int(value)


_REDUCED: set = set()       # dtypes found in kernels.DTYPES (checked once each: a set lookup)


def _reduces(dtype) -> bool:
    if dtype in _REDUCED:
        return True
    if dtype in kernels.DTYPES:
        _REDUCED.add(dtype)
        return True
    return False


def _plain(msg):
    """The numpy array a reduction's buffer spec is, when it is one as it stands -- an exact
    numpy array of a dtype mpicoll reduces, or ``[array, datatype]`` with the array's own
    predefined datatype (seen before) -- else None (``_message`` parses it). The common case,
    in a fraction of a microsecond: the call then finds its plan in the cache."""
    if type(msg) is np.ndarray:
        return msg if _reduces(msg.dtype) else None
    if (type(msg) is list or type(msg) is tuple) and len(msg) == 2:
        buf, datatype = msg
        if type(buf) is np.ndarray and isinstance(datatype, MPI.Datatype) and \
                _PREDEFINED.get(datatype.handle) is buf.dtype and _reduces(buf.dtype) and \
                buf.flags.c_contiguous:
            return buf
    return None


def _reducible(x, name: str):
    """``x``, if mpicoll reduces its dtype (else ``Unsupported``: ``fallback`` may take it)."""
    dtype = getattr(x, "dtype", None)
    if dtype is not None and dtype not in kernels.DTYPES:
        raise Unsupported(f"{name} has dtype {dtype}, not one mpicoll reduces; supported: "
                          f"{ops.DTYPE_NAMES}")
    return x


def _in_place(sendbuf) -> bool:
    return sendbuf is None or sendbuf is MPI.IN_PLACE


def _as_bytes(x):
    """A copy-only collective's buffer as bytes: a ``_Packed``'s packed bytes, an array's own."""
    if isinstance(x, _Packed):
        return x.bytes
    return x if x is MPI.IN_PLACE else buffers.array(x, "buffer").reshape(-1).view(np.uint8)


class _Args:
    """One call's arguments for mpicoll, and what to do around it: ``before()`` (packing, the
    in-place reduce-scatter's copy) right before each run, ``after()`` (unpacking) once it has
    completed."""

    __slots__ = ("args", "_before", "_after")

    def __init__(self, *args, before=(), after=()):
        self.args, self._before, self._after = args, before, after

    def before(self) -> None:
        for fn in self._before:
            fn()

    def after(self) -> None:
        for fn in self._after:
            fn()


# ----------------------------------------------------------------------------- requests

def _query(status, holder) -> None:
    """A completed collective's status (MPI's for a collective: no source, tag or data)."""
    status.source, status.tag, status.error = MPI.ANY_SOURCE, MPI.ANY_TAG, MPI.SUCCESS
    status.Set_elements(MPI.BYTE, 0)
    status.Set_cancelled(False)
    error = holder._error_seen
    if error is not None:
        raise error


class Request(MPI.Grequest):
    """An mpicoll nonblocking collective as an MPI request (``Comm.Iallreduce`` ...).

    A real ``MPI.Request`` (an MPI generalized request, completed when mpicoll's collective
    completes): ``Wait``, ``Test``, ``Get_status``, ``Free``, ``Cancel`` (a no-op, as for
    MPI's collectives) and MPI's ``MPI.Request.Waitall`` / ``Testall`` / ``Waitany`` ...
    take it, mixed with MPI's own requests. After ``Wait`` it is ``MPI.REQUEST_NULL``
    (``bool(req)`` is False). mpicoll's error (a timeout, mismatched arguments) is raised by
    ``Wait`` / ``Test``; MPI's ``Waitall`` reports it as an ``MPI.Exception``
    (``MPI_ERR_OTHER``). MPI's own wait functions can't move mpicoll's collective: with
    mpicoll's progress thread (the default when MPI gives ``MPI_THREAD_MULTIPLE``, as mpi4py
    asks for) they just wait for it; under ``MPICOLL_PROGRESS=caller`` use this class's
    ``Wait``, ``Test`` or its ``Request.Waitall`` (...), which move it."""

    @classmethod
    def _start(cls, start, args: _Args) -> "Request":
        """Run ``args.before()``, start mpicoll's request (``start(*args.args)``), and return it
        as an MPI request, which completes (after ``args.after()``) with mpicoll's."""
        holder = _Holder()
        request = cls(MPI.Grequest.Start(_query, None, None, args=(holder,)))
        request._holder = holder
        args.before()
        try:
            inner = start(*args.args)
        except BaseException:
            request.Complete()
            request.Free()
            raise
        request._inner = inner
        inner.when_done(lambda error: holder.finish(request, error, args))
        return request

    def Wait(self, status=None) -> bool:
        """Wait until the collective is done (raises mpicoll's error); True, as mpi4py's."""
        try:
            self._inner.wait()
            self._inner.release()
            error = self._holder._error_seen
            if error is not None:
                raise error
        except BaseException:
            with _suppress_mpi():
                MPI.Grequest.Wait(self)
            raise
        return MPI.Grequest.Wait(self, status)

    def Test(self, status=None) -> bool:
        """Move the collective on (``caller`` progress) and say whether it is done."""
        try:
            if not self._inner.test():
                return False
        except BaseException:   # noqa: BLE001 - Wait frees the MPI request, then raises it
            pass
        return self.Wait(status)

    def Get_status(self, status=None) -> bool:
        """Whether it is done (and its status), without freeing it."""
        try:
            self._inner.test()
        except BaseException:   # noqa: BLE001 - Wait raises it
            pass
        return MPI.Grequest.Get_status(self, status)

    @staticmethod
    def _move(requests) -> None:
        for request in requests:
            if isinstance(request, Request):
                try:
                    request._inner.test()
                except BaseException:   # noqa: BLE001 - raised by Wait
                    pass

    @staticmethod
    def Waitall(requests, statuses=None) -> bool:
        """``MPI.Request.Waitall``, moving mpicoll's collectives (any progress mode)."""
        for request in requests:
            if isinstance(request, Request):
                request._inner.wait()
        return MPI.Request.Waitall(requests, statuses)

    @staticmethod
    def Testall(requests, statuses=None) -> bool:
        """``MPI.Request.Testall``, moving mpicoll's collectives first."""
        Request._move(requests)
        return MPI.Request.Testall(requests, statuses)

    @staticmethod
    def Waitany(requests, status=None) -> int:
        """``MPI.Request.Waitany``, moving mpicoll's collectives while it waits."""
        while True:
            Request._move(requests)
            index, done = MPI.Request.Testany(requests, status)
            if done:
                return index
            os.sched_yield()

    @staticmethod
    def Testany(requests, status=None):
        """``MPI.Request.Testany``, moving mpicoll's collectives first."""
        Request._move(requests)
        return MPI.Request.Testany(requests, status)


class _Holder:
    """What the completion callback leaves for ``_query`` and ``Wait``."""

    __slots__ = ("_error_seen",)

    def __init__(self):
        self._error_seen = None

    def finish(self, request: Request, error, args: _Args) -> None:
        """mpicoll's request is done (``error``: None or why not): unpack, complete the MPI
        request. Runs in whichever thread finished it; never raises."""
        if error is None:
            try:
                args.after()
            except BaseException as exc:   # noqa: BLE001 - raised by Wait
                error = exc
        self._error_seen = error
        try:
            MPI.Grequest.Complete(request)
        except MPI.Exception:
            pass


class _suppress_mpi:
    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        return kind is not None and issubclass(kind, MPI.Exception)


_EMPTY = bytearray(0)


class Prequest(MPI.Prequest):
    """An mpicoll persistent collective as an MPI persistent request (``Comm.Allreduce_init``).

    ``Start()`` starts mpicoll's persistent collective (``mpicoll.persistent``) and returns at
    once; the progress thread runs it. The MPI request this object is, a persistent receive of
    an empty message on a communicator of this process alone, completes when the collective
    does: its last step sends that message (one byte, which the receive cannot hold, if the
    collective failed, so that ``MPI.Request.Waitall`` raises ``MPI_ERR_TRUNCATE``; this
    class's ``Wait`` and ``Test`` raise mpicoll's own error). So ``Wait``, ``Test``, ``Free``,
    ``MPI.Request.Waitall`` ... behave as for MPI's persistent requests. Start it with its own
    ``Start()`` or ``Prequest.Startall`` (``MPI.Prequest.Startall`` would start only the MPI
    request, not the collective).

    Under ``MPICOLL_PROGRESS=caller`` (no progress thread) nothing would move the collective
    inside MPI's own wait: there ``Start()`` runs the whole collective, then starts a receive
    from ``MPI.PROC_NULL``, which completes at once."""

    @classmethod
    def _make(cls, handle, args: _Args) -> "Prequest":
        if progress.mode() == "thread":
            comm, tag = _signals()
            request = cls(comm.Recv_init([_EMPTY, 0, MPI.BYTE], 0, tag))
            request._signal = (comm, tag)
        else:
            request = cls(MPI.COMM_SELF.Recv_init([_EMPTY, 0, MPI.BYTE], MPI.PROC_NULL))
            request._signal = None
        request._handle, request._args, request._started = handle, args, False
        request._error = None               # (_end: unpacking the result failed)
        return request

    def Start(self) -> None:
        """Start the collective (or, without the progress thread, run it), then the MPI
        request, which completes with it."""
        if self._handle is None or not self:
            raise ValueError("Start() on a persistent request that was freed")
        if self._started:       # a run that MPI's own wait completed: its error, if any,
            self._join()        # MPI's wait reported (ERR_TRUNCATE); the communicator refuses
        self._args.before()     # further calls after a failure
        if self._signal is None:
            self._handle()      # on this thread: the buffers' owners see no other thread
            self._args.after()
            MPI.Prequest.Start(self)
            return
        MPI.Prequest.Start(self)            # posted before the collective can end
        try:
            self._handle.start()
        except BaseException as exc:
            self._signal_end(exc)           # (the receive completes: the request is inactive)
            with _suppress_mpi():
                MPI.Prequest.Wait(self)
            raise
        self._started = True
        self._handle.when_done(self._end)

    def _end(self, error) -> None:
        """The collective is done (``error``: None or why not), in whichever thread finished
        it: unpack, then complete the MPI request. Never raises."""
        if error is None:
            try:
                self._args.after()
            except BaseException as exc:    # noqa: BLE001 - Wait raises it
                error = self._error = exc
        self._signal_end(error)

    def _signal_end(self, error) -> None:
        comm, tag = self._signal
        with _suppress_mpi():
            comm.Isend([_ONE, 1 if error is not None else 0, MPI.BYTE], 0, tag).Free()

    def _join(self) -> BaseException | None:
        """Close the started run: wait for mpicoll's collective and let go of it (the caller's
        thread then frees the buffers); its error, or unpacking's (``_end``), or None."""
        self._started = False
        try:
            self._handle.wait()
            error = self._error
        except BaseException as exc:    # noqa: BLE001 - the caller raises or drops it
            error = exc
        finally:
            self._handle.release()
        self._error = None
        return error

    def Wait(self, status=None) -> bool:
        """Wait until the collective is done; raises mpicoll's error if it failed."""
        if self._started:
            error = self._join()
            if error is not None:           # (the MPI request completes, truncated)
                with _suppress_mpi():
                    MPI.Prequest.Wait(self)
                raise error
        return MPI.Prequest.Wait(self, status)

    def Test(self, status=None) -> bool:
        """Whether the collective is done (raises mpicoll's error if it failed)."""
        if self._started:
            try:
                if not self._handle.test():
                    return False
            except BaseException:   # noqa: BLE001 - Wait completes the MPI request, raises it
                pass
            return self.Wait(status)
        return MPI.Prequest.Test(self, status)

    def Free(self) -> None:
        """Free the MPI request and drop mpicoll's handle (``REQUEST_NULL`` after); one still
        running completes first."""
        if self._started:
            error = self._join()
            with _suppress_mpi():
                MPI.Prequest.Wait(self)
            if error is not None:
                raise error
        if self._handle is not None:
            self._handle.free()
        self._handle = None
        MPI.Prequest.Free(self)

    @staticmethod
    def Startall(requests) -> None:
        for request in requests:
            request.Start()

    @property
    def result(self) -> np.ndarray:
        """The receive buffer (a numpy view of it)."""
        return self._handle.result


_ONE = bytearray(1)
_signal_comm: list = []             # [this process's communicator of Prequest's messages]
_signal_tags = itertools.count(1)


def _signals() -> tuple:
    """(a duplicate of ``COMM_SELF``, a tag of its own) for one ``Prequest``'s message."""
    if not _signal_comm:
        _signal_comm.append(MPI.COMM_SELF.Dup())
    tag = next(_signal_tags) % MPI.COMM_SELF.Get_attr(MPI.TAG_UB)
    return _signal_comm[0], tag


# ----------------------------------------------------------------------------- algorithms

_COLLECTIVES = tuple(registry.COLLECTIVES)


def _per_collective(algorithm) -> dict:
    """``Comm.algorithm`` as ``{collective: name}``: a name applies to each collective that has
    it, ``auto`` to the others; a mapping names some collectives (the others: ``auto``)."""
    if isinstance(algorithm, str):
        if algorithm == "auto":
            return dict.fromkeys(_COLLECTIVES, "auto")
        chosen = {}
        for collective in _COLLECTIVES:
            try:
                registry.lookup(collective, algorithm)
                chosen[collective] = algorithm
            except ValueError:
                chosen[collective] = "auto"
        if set(chosen.values()) == {"auto"}:
            known = sorted({a.name for t in registry.COLLECTIVES.values() for a in t.values()})
            raise ValueError(f"mpicoll.Comm: unknown algorithm {algorithm!r} (no collective has "
                             f"it); known: auto, {', '.join(known)}")
        return chosen
    if isinstance(algorithm, Mapping):
        unknown = set(algorithm) - set(_COLLECTIVES)
        if unknown:
            raise ValueError(f"mpicoll.Comm: algorithm maps {sorted(unknown)}, not collectives; "
                             f"the collectives are {', '.join(_COLLECTIVES)}")
        chosen = dict.fromkeys(_COLLECTIVES, "auto")
        for collective, name in algorithm.items():
            if name != "auto":
                registry.lookup(collective, name)      # its error names the known ones
            chosen[collective] = name
        return chosen
    raise TypeError(f"mpicoll.Comm: algorithm is a name or a {{collective: name}} mapping, got "
                    f"{type(algorithm).__name__}")


# ----------------------------------------------------------------------------- the wrapper

class Comm:
    """An mpi4py communicator whose buffer collectives mpicoll runs; see the module's doc.

    ``algorithm`` (default ``"auto"``, settable) is used by every call: a name goes to each
    collective that has an algorithm of that name, and the others use ``auto``
    (``"recursive_doubling"``: all-reduce and all-gather; reduce-scatter and broadcast
    ``auto``); a mapping (``{"allreduce": "ring", "bcast": "binomial"}``) names them one by
    one (those left out: ``auto``). Every other attribute is the wrapped communicator's
    (``self.comm``). It is not an ``MPI.Comm`` itself: where one is required (another
    library, ``comm=`` of mpicoll's functions), pass ``self.comm``."""

    def __init__(self, comm=None, algorithm="auto", *, fallback: bool = False,
                 reproducible=False):
        if isinstance(comm, Comm):
            comm = comm.comm
        comm = MPI.COMM_WORLD if comm is None else comm
        if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
            raise TypeError(f"mpicoll.Comm wraps an MPI intracommunicator, got {comm!r}")
        self.comm = comm
        self.algorithm = algorithm
        self.reproducible = reproducible
        self.fallback = bool(fallback)
        self.fallbacks: collections.Counter = collections.Counter()

    @property
    def algorithm(self):
        """The name or mapping given (see the class's doc)."""
        return self._algorithm

    @algorithm.setter
    def algorithm(self, value) -> None:
        self._per = _per_collective(value)
        self._algorithm = value

    @property
    def reproducible(self):
        """False, True or K: see the module's doc."""
        return self._reproducible

    @reproducible.setter
    def reproducible(self, value) -> None:
        self._reproducible = ops.reproducible_setting(value, "mpicoll.Comm")

    def algorithm_for(self, collective: str) -> str:
        """The algorithm a collective (``"bcast"`` ...) runs with."""
        return self._per[collective]

    def __getattr__(self, name: str):          # only for what this class does not define
        if name in ("comm", "_per", "_algorithm", "_reproducible", "fallback", "fallbacks"):    # not set yet (unpickling, a failed __init__)
            raise AttributeError(name)
        return getattr(self.comm, name)

    def __repr__(self) -> str:
        extra = "" if self._reproducible is False else f" reproducible={self._reproducible!r}"
        return f"<mpicoll.Comm algorithm={self.algorithm!r}{extra} over {self.comm!r}>"

    # what Python looks up on the type, not through __getattr__: as the communicator's
    def __eq__(self, other) -> bool:
        return self.comm == (other.comm if isinstance(other, Comm) else other)

    def __ne__(self, other) -> bool:
        return not self == other

    __hash__ = None             # as mpi4py's communicators

    def __bool__(self) -> bool:
        return bool(self.comm)

    # the buffers of each collective, read as mpi4py reads them (see the module's doc)

    def _how(self, collective: str, args=None, op=None) -> dict:
        how = {"algorithm": self._per[collective], "comm": self.comm}
        if self._reproducible is not False and op is not None:
            how.update(ops.reproducible_for(self._reproducible, args.args[1].dtype,
                                            _op_name(op), "mpicoll.Comm"))
        return how

    def _reduce_args(self, sendbuf, recvbuf) -> _Args:
        recv = _reducible(_message(recvbuf, "recvbuf"), "recvbuf")
        send = MPI.IN_PLACE if _in_place(sendbuf) else \
            _reducible(_message(sendbuf, "sendbuf"), "sendbuf")
        return _Args(send, recv)

    def _scatter_args(self, sendbuf, recvbuf) -> _Args:
        size = self.comm.Get_size()
        if not _in_place(sendbuf):
            return _Args(_reducible(_message(sendbuf, "sendbuf", size), "sendbuf"),
                         _reducible(_message(recvbuf, "recvbuf"), "recvbuf"))
        # In place: the input is the whole recvbuf (size blocks), the result its first block,
        # the rest left as it was (as MPICH and Open MPI do): buffers.reduce_scatter_block's
        # layout runs on a copy of it and writes back only the first block.
        return _Args(MPI.IN_PLACE, _reducible(_message(recvbuf, "recvbuf", size), "recvbuf"))

    def _gather_args(self, sendbuf, recvbuf) -> _Args:
        size = self.comm.Get_size()
        recv = _message(recvbuf, "recvbuf", size, copy=True)
        send = MPI.IN_PLACE if _in_place(sendbuf) else _message(sendbuf, "sendbuf", copy=True)
        if not (isinstance(recv, _Packed) or isinstance(send, _Packed)):
            if send is MPI.IN_PLACE or send.dtype == recv.dtype or \
                    (send.dtype in kernels.DTYPES and recv.dtype in kernels.DTYPES):
                return _Args(send, recv)
        before, after = [], []
        if isinstance(send, _Packed):
            before.append(send.pack)
        if isinstance(recv, _Packed):
            if send is MPI.IN_PLACE:
                before.append(recv.pack)        # this rank's block, packed in place
            after.append(recv.unpack)
        return _Args(_as_bytes(send), _as_bytes(recv), before=before, after=after)

    def _bcast_args(self, buf, root) -> _Args:
        msg = _message(buf, "buf", copy=True)
        if not isinstance(msg, _Packed):
            return _Args(msg, root)
        mine = self.comm.Get_rank() == root
        return _Args(msg.bytes, root, before=(msg.pack,) if mine else (),
                     after=() if mine else (msg.unpack,))

    def _args(self, method: str, make, *given):
        """``make(*given)``, or None when mpicoll can't run the call and ``fallback`` is on."""
        try:
            return make(*given)
        except Unsupported:
            if not self.fallback:
                raise
            self.fallbacks[method] += 1
            return None

    def _run(self, method: str, fn, make, given: tuple, collective: str, **kwargs) -> None:
        args = self._args(method, make, *given)
        if args is None:
            return getattr(self.comm, method)(*given, **kwargs)
        how = self._how(collective, args, kwargs.get("op"))
        args.before()
        fn(*args.args, **kwargs, **how)
        args.after()

    def _start(self, method: str, fn, make, given: tuple, collective: str, **kwargs):
        args = self._args(method, make, *given)
        if args is None:
            return getattr(self.comm, method)(*given, **kwargs)
        how = self._how(collective, args, kwargs.get("op"))
        return Request._start(lambda *a: fn(*a, **kwargs, **how), args)

    def _init(self, method: str, fn, make, given: tuple, collective: str, **kwargs):
        args = self._args(method, make, *given)
        if args is None:
            return getattr(self.comm, method)(*given, **kwargs)
        return Prequest._make(fn(*args.args, **kwargs,
                                 **self._how(collective, args, kwargs.get("op"))), args)

    # blocking (None, as mpi4py's), nonblocking (Request), persistent (Prequest)

    def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM) -> None:
        recv = _plain(recvbuf)
        send = MPI.IN_PLACE if _in_place(sendbuf) else _plain(sendbuf)
        if recv is not None and send is not None and self._reproducible is False:
            api.allreduce(send, recv, op=op, algorithm=self._per["allreduce"], comm=self.comm)
            return
        self._run("Allreduce", api.allreduce, self._reduce_args, (sendbuf, recvbuf),
                  "allreduce", op=op)

    def Iallreduce(self, sendbuf, recvbuf, op=MPI.SUM) -> Request:
        return self._start("Iallreduce", api.iallreduce, self._reduce_args, (sendbuf, recvbuf),
                           "allreduce", op=op)

    def Allreduce_init(self, sendbuf, recvbuf, op=MPI.SUM, info=None) -> Prequest:
        return self._init("Allreduce_init", persistent.allreduce_init, self._reduce_args,
                          (sendbuf, recvbuf), "allreduce", op=op)

    def Reduce_scatter_block(self, sendbuf, recvbuf, op=MPI.SUM) -> None:
        self._run("Reduce_scatter_block", api.reduce_scatter_block, self._scatter_args,
                  (sendbuf, recvbuf), "reduce_scatter_block", op=op)

    def Ireduce_scatter_block(self, sendbuf, recvbuf, op=MPI.SUM) -> Request:
        return self._start("Ireduce_scatter_block", api.ireduce_scatter_block,
                           self._scatter_args, (sendbuf, recvbuf), "reduce_scatter_block", op=op)

    def Reduce_scatter_block_init(self, sendbuf, recvbuf, op=MPI.SUM, info=None) -> Prequest:
        return self._init("Reduce_scatter_block_init", persistent.reduce_scatter_block_init,
                          self._scatter_args, (sendbuf, recvbuf), "reduce_scatter_block", op=op)

    def Allgather(self, sendbuf, recvbuf) -> None:
        self._run("Allgather", api.allgather, self._gather_args, (sendbuf, recvbuf),
                  "allgather")

    def Iallgather(self, sendbuf, recvbuf) -> Request:
        return self._start("Iallgather", api.iallgather, self._gather_args, (sendbuf, recvbuf),
                           "allgather")

    def Allgather_init(self, sendbuf, recvbuf, info=None) -> Prequest:
        return self._init("Allgather_init", persistent.allgather_init, self._gather_args,
                          (sendbuf, recvbuf), "allgather")

    def Bcast(self, buf, root: int = 0) -> None:
        self._run("Bcast", api.bcast, self._bcast_args, (buf, root), "bcast")

    def Ibcast(self, buf, root: int = 0) -> Request:
        return self._start("Ibcast", api.ibcast, self._bcast_args, (buf, root), "bcast")

    def Bcast_init(self, buf, root: int = 0, info=None) -> Prequest:
        return self._init("Bcast_init", persistent.bcast_init, self._bcast_args, (buf, root),
                          "bcast")


    # ULFM's calls, implemented by mpicoll (mpicoll.recovery; docs/reliability.md)

    def Revoke(self) -> None:
        """Every rank's current and later mpicoll calls on this communicator fail."""
        recovery.revoke(self.comm)

    def Is_revoked(self) -> bool:
        return recovery.is_revoked(self.comm)

    def Shrink(self) -> "Comm":
        """A ``Comm`` (same algorithm choice) of the living ranks, in rank order."""
        return Comm(recovery.shrink(self.comm), self.algorithm, fallback=self.fallback,
                    reproducible=self.reproducible)

    def Agree(self, flag: int) -> int:
        """The bitwise AND of ``flag`` over the living ranks, the same on each of them."""
        return recovery.agree(self.comm, flag)

    def Get_failed(self) -> MPI.Group:
        """The group of this communicator's ranks known dead here."""
        return recovery.get_failed(self.comm)

    def Ack_failed(self, num_to_ack: int | None = None) -> int:
        """Acknowledge the failures known here (``num_to_ack`` of them); how many are."""
        return recovery.ack_failed(self.comm, num_to_ack)


def wrap(comm=None, algorithm="auto", *, fallback: bool = False, reproducible=False) -> Comm:
    """``Comm(comm, algorithm, fallback=fallback, reproducible=reproducible)``."""
    return Comm(comm, algorithm, fallback=fallback, reproducible=reproducible)


def _op_name(op):
    """The op's name, or None for one mpicoll does not reduce with (the call then says so)."""
    try:
        return ops.name(op)
    except TypeError:
        return None
