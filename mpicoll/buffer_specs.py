"""mpi4py's buffer specs, read as mpicoll reads them (``mpicoll.Comm``; docs/buffers.md):
``buf``, ``[buf, datatype]``, ``[buf, count]``, ``[buf, count, datatype]``, ``[buf, (count,
displ), datatype]``, ``[buf, count, displ, datatype]`` become a numpy view of the caller's
memory (``message``), or, for a datatype with holes in a collective that only copies, a
``Packed`` buffer (``MPI_Pack`` / ``MPI_Unpack``). ``reduces`` is the one dtype check: what it
refuses in a reduction is ``Unsupported``."""

from __future__ import annotations

import numpy as np
from mpi4py import MPI
from mpi4py.util import dtlib

from . import buffers, kernels, ops

__all__ = ["Unsupported", "Packed", "Args", "message", "plain", "reducible", "reduces",
           "in_place", "as_bytes"]


_PREDEFINED: dict = {}      # handle -> how it is read, for MPI's predefined datatypes (they live
                            # as long as MPI; a derived one's handle can be reused once freed)


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
        try:
            how = dtlib.to_numpy_dtype(datatype)
        except (KeyError, ValueError, TypeError) as exc:
            how = f"no numpy dtype: {exc}"
        if not isinstance(how, np.dtype) or not reduces(how):
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


class Packed:
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


def message(msg, name: str, blocks: int = 1, copy: bool = False):
    """The elements a buffer spec names, as a numpy view of the caller's memory (no copy); or,
    for a datatype with holes (``copy`` only), a ``Packed``.

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
        if copy and not reduces(arr.dtype) and arr.flags.c_contiguous \
                and not isinstance(arr, np.ma.MaskedArray):
            return arr.reshape(-1).view(np.uint8)   # only copied: any dtype, as bytes
        return arr                  # mpicoll checks it (dtype, contiguity, writability)
    if isinstance(arr, np.ma.MaskedArray) or not arr.flags.c_contiguous:
        buffers.array(arr, name)       # its error: masked, or not contiguous
    how = arr.dtype if datatype is None else _datatype(datatype, name, copy)
    if isinstance(how, np.dtype):
        dtype = how
        if copy and not reduces(dtype):
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
        return Packed(raw[offset:], n, how[1], name)
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


def reduces(dtype) -> bool:
    """Whether mpicoll reduces ``dtype`` (one of ``kernels.DTYPES``): the one dtype check of
    the drop-in's buffers."""
    if dtype in _REDUCED:
        return True
    if dtype in kernels.DTYPES:
        _REDUCED.add(dtype)
        return True
    return False


def plain(msg):
    """The numpy array a reduction's buffer spec is, when it is one as it stands -- an exact
    numpy array of a dtype mpicoll reduces, or ``[array, datatype]`` with the array's own
    predefined datatype (seen before) -- else None (``message`` parses it). The common case,
    in a fraction of a microsecond: the call then finds its plan in the cache."""
    if type(msg) is np.ndarray:
        return msg if reduces(msg.dtype) else None
    if (type(msg) is list or type(msg) is tuple) and len(msg) == 2:
        buf, datatype = msg
        if type(buf) is np.ndarray and isinstance(datatype, MPI.Datatype) and \
                _PREDEFINED.get(datatype.handle) is buf.dtype and reduces(buf.dtype) and \
                buf.flags.c_contiguous:
            return buf
    return None


def reducible(x, name: str):
    """``x``, if mpicoll reduces its dtype (else ``Unsupported``: ``fallback`` may take it)."""
    dtype = getattr(x, "dtype", None)
    if dtype is not None and not reduces(dtype):
        raise Unsupported(f"{name} has dtype {dtype}, not one mpicoll reduces; supported: "
                          f"{ops.DTYPE_NAMES}")
    return x


def in_place(sendbuf) -> bool:
    return sendbuf is None or sendbuf is MPI.IN_PLACE


def as_bytes(x):
    """A copy-only collective's buffer as bytes: a ``Packed``'s packed bytes, an array's own."""
    if isinstance(x, Packed):
        return x.bytes
    return x if x is MPI.IN_PLACE else buffers.array(x, "buffer").reshape(-1).view(np.uint8)


class Args:
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
