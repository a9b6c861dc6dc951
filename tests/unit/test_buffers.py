"""Buffers other than numpy arrays, on one rank: ``array.array``, ``memoryview``, ``bytearray``,
``bytes`` (send only), an object with only ``__array_interface__``, one with only
``__dlpack__`` -- each used in place (the result lands in the caller's memory, checked with
``np.shares_memory``), in every collective, its nonblocking and its persistent form; and the
errors that stay (lists, masked, non-contiguous, read-only, unsupported dtype, GPU memory)."""

import array

import numpy as np
import pytest
from mpi4py import MPI

import mpicoll
from mpicoll import kernels

COMM = MPI.COMM_SELF


def _typecode_dtype(code):
    try:
        return np.asarray(memoryview(array.array(code))).dtype
    except (TypeError, ValueError):
        return None


SUPPORTED_CODES = [c for c in array.typecodes if _typecode_dtype(c) in kernels.DTYPES]
UNSUPPORTED_CODES = [c for c in array.typecodes if c not in SUPPORTED_CODES]


def _memoryview_dtypes():
    out = []
    for dtype in kernels.DTYPES:
        try:
            memoryview(np.zeros(1, dtype))
        except (ValueError, TypeError, BufferError):    # e.g. bfloat16: no PEP 3118 format
            continue
        out.append(dtype)
    return out


class ArrayInterfaceOnly:
    """Exposes memory only through ``__array_interface__``."""

    def __init__(self, arr):
        self._arr = arr
        self.__array_interface__ = arr.__array_interface__


class DLPackOnly:
    """Exposes memory only through ``__dlpack__`` / ``__dlpack_device__`` (numpy's own)."""

    def __init__(self, arr, device=None):
        self._arr, self._device = arr, device

    def __dlpack__(self, **kwargs):
        return self._arr.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._device or self._arr.__dlpack_device__()


def values(dtype, n=6):
    return (np.arange(n) % 5 + 1).astype(dtype)


# ----------------------------------------------------------------------------- accepted, in place

@pytest.mark.parametrize("code", SUPPORTED_CODES)
def test_array_array_in_place_and_out_of_place(code):
    src = array.array(code, values(_typecode_dtype(code)).tolist())
    dst = array.array(code, [0] * len(src))
    out = mpicoll.allreduce(src, dst, comm=COMM)
    assert out.dtype == _typecode_dtype(code)
    assert np.shares_memory(out, np.asarray(memoryview(dst)))
    assert dst.tolist() == src.tolist()
    inplace = array.array(code, src)
    out = mpicoll.allreduce(MPI.IN_PLACE, inplace, comm=COMM)
    assert np.shares_memory(out, np.asarray(memoryview(inplace)))
    assert inplace.tolist() == src.tolist()


@pytest.mark.parametrize("code", UNSUPPORTED_CODES)
def test_array_array_of_an_unsupported_type_says_so(code):
    with pytest.raises(TypeError, match=r"sendbuf (has unsupported dtype|\(array.array\) has "
                                        r"buffer format)"):
        mpicoll.allreduce(array.array(code), comm=COMM)


@pytest.mark.parametrize("dtype", _memoryview_dtypes(), ids=str)
def test_memoryview_keeps_format_and_shape(dtype):
    op = kernels.ops_for(dtype)[0]          # bool has no sum: its first op
    base = np.zeros((2, 3), dtype)
    src = values(dtype).reshape(2, 3)
    out = mpicoll.allreduce(memoryview(src), memoryview(base), op=op, comm=COMM)
    assert out.shape == (2, 3) and out.dtype == dtype
    assert np.shares_memory(out, base)
    assert np.array_equal(base, src)
    new = mpicoll.allreduce(memoryview(src), op=op, comm=COMM)    # recvbuf=None: a new numpy array
    assert type(new) is np.ndarray and not np.shares_memory(new, src)
    assert np.array_equal(new, src)


def test_bytearray_is_uint8_and_bytes_is_send_only():
    uint8 = np.dtype(np.uint8)
    if uint8 not in kernels.DTYPES:
        with pytest.raises(TypeError, match="sendbuf has unsupported dtype uint8"):
            mpicoll.allreduce(bytearray(4), comm=COMM)
        with pytest.raises(TypeError, match="sendbuf has unsupported dtype uint8"):
            mpicoll.allreduce(b"\x01\x02", comm=COMM)
        return
    dst = bytearray(4)
    out = mpicoll.allreduce(b"\x01\x02\x03\xff", dst, comm=COMM)
    assert out.dtype == uint8 and np.shares_memory(out, np.frombuffer(dst, np.uint8))
    assert dst == bytearray(b"\x01\x02\x03\xff")
    with pytest.raises(ValueError, match="recvbuf is read-only"):
        mpicoll.allreduce(MPI.IN_PLACE, b"\x01\x02", comm=COMM)


@pytest.mark.parametrize("dtype", kernels.DTYPES, ids=str)
def test_array_interface_only_object(dtype):
    op = kernels.ops_for(dtype)[0]          # bool has no sum: its first op
    base = np.zeros(6, dtype)
    if np.asarray(ArrayInterfaceOnly(base)).dtype != dtype:    # bfloat16's typestr is '<V2'
        with pytest.raises(TypeError, match=r"sendbuf has unsupported dtype \|V"):
            mpicoll.allreduce(ArrayInterfaceOnly(values(dtype)), op=op, comm=COMM)
        return
    out = mpicoll.allreduce(ArrayInterfaceOnly(values(dtype)), ArrayInterfaceOnly(base),
                            op=op, comm=COMM)
    assert np.shares_memory(out, base) and np.array_equal(base, values(dtype))


@pytest.mark.parametrize("dtype", kernels.DTYPES, ids=str)
def test_dlpack_only_object(dtype):
    op = kernels.ops_for(dtype)[0]          # bool has no sum: its first op
    base = np.zeros(6, dtype)
    try:
        base.__dlpack__()
    except BufferError:         # DLPack has no such type (bfloat16 in numpy): a clear error
        with pytest.raises(TypeError, match=r"sendbuf \(test_buffers.DLPackOnly\) cannot be "
                                            r"read through DLPack without a copy: "):
            mpicoll.allreduce(DLPackOnly(values(dtype)), op=op, comm=COMM)
        return
    out = mpicoll.allreduce(DLPackOnly(values(dtype)), DLPackOnly(base), op=op, comm=COMM)
    assert np.shares_memory(out, base) and np.array_equal(base, values(dtype))
    inplace = values(dtype)
    out = mpicoll.allreduce(MPI.IN_PLACE, DLPackOnly(inplace), op=op, comm=COMM)
    assert np.shares_memory(out, inplace)


def test_every_collective_and_its_nonblocking_and_persistent_forms_take_buffers():
    """At N = 1 every result is a copy of the input: it must land in the caller's object.
    (bcast's buffer starts as the input; the others' start as zeros.)"""
    src = array.array("d", [1.0, 2.0, 3.0, 4.0])
    dlpack = lambda out: DLPackOnly(np.asarray(memoryview(out)))    # noqa: E731
    cases = {
        "allreduce": lambda out: mpicoll.allreduce(src, out, comm=COMM),
        "reduce_scatter_block": lambda out: mpicoll.reduce_scatter_block(src, out, comm=COMM),
        "allgather": lambda out: mpicoll.allgather(src, out, comm=COMM),
        "bcast": lambda out: mpicoll.bcast(dlpack(out), 0, comm=COMM),
        "iallreduce": lambda out: mpicoll.iallreduce(src, out, comm=COMM).wait(),
        "ireduce_scatter_block": lambda out: mpicoll.ireduce_scatter_block(
            memoryview(src), memoryview(out), comm=COMM).wait(),
        "iallgather": lambda out: mpicoll.iallgather(src, dlpack(out), comm=COMM).wait(),
        "ibcast": lambda out: mpicoll.ibcast(out, comm=COMM).wait(),
        "allreduce_init": lambda out: mpicoll.allreduce_init(src, out, comm=COMM)(),
        "reduce_scatter_block_init": lambda out: mpicoll.reduce_scatter_block_init(
            src, out, comm=COMM)(),
        "allgather_init": lambda out: mpicoll.allgather_init(src, out, comm=COMM)(),
        "bcast_init": lambda out: mpicoll.bcast_init(out, comm=COMM)(),
    }
    for name, run in cases.items():
        out = array.array("d", src if "bcast" in name else [0.0] * len(src))
        result = run(out)
        assert out.tolist() == src.tolist(), name
        assert np.shares_memory(result, np.asarray(memoryview(out))), name


# ----------------------------------------------------------------------------- refused

@pytest.mark.parametrize("make, match", [
    (lambda: [1.0], r"must be an array, got list; pass np.asarray"),
    (lambda: (1.0,), r"must be an array, got tuple; pass np.asarray"),
    (lambda: "abc", r"must be an array \(numpy, or an object with the buffer protocol, "
                    r"__array_interface__ or __dlpack__\), got str"),
    (lambda: object(), r"must be an array .*, got object"),
    (lambda: memoryview(np.arange(6.0))[::2], r"must be C-contiguous"),
    (lambda: np.ma.masked_array([1.0], mask=[1]), r"is a masked array"),
    (lambda: DLPackOnly(np.zeros(2), device=(2, 0)),
     r"\(test_buffers.DLPackOnly\) lives on DLPack device \(2, 0\), not the CPU"),
])
def test_refused_buffers_name_the_problem(make, match):
    with pytest.raises((TypeError, ValueError), match="sendbuf " + match):
        mpicoll.allreduce(make(), comm=COMM)


def test_read_only_buffers_are_send_only():
    ro = np.arange(3.0)
    ro.flags.writeable = False
    for recvbuf in (memoryview(ro), DLPackOnly(ro), ArrayInterfaceOnly(ro)):
        out = mpicoll.allreduce(recvbuf, comm=COMM)         # as sendbuf: fine
        assert out.tolist() == [0.0, 1.0, 2.0]
        with pytest.raises(ValueError, match="recvbuf is read-only"):
            mpicoll.allreduce(np.arange(3.0), recvbuf, comm=COMM)
        with pytest.raises(ValueError, match="buf is read-only"):
            mpicoll.bcast(recvbuf, comm=COMM)


def test_a_numpy_scalar_is_a_sendbuf_only():
    out = mpicoll.allreduce(np.float64(2.5), comm=COMM)
    assert out.shape == () and out == 2.5
    with pytest.raises(ValueError, match="recvbuf is read-only"):
        mpicoll.allreduce(MPI.IN_PLACE, np.float64(2.5), comm=COMM)


def test_a_buffer_that_aliases_the_other_one_needs_in_place():
    x = array.array("d", [1.0, 2.0])
    with pytest.raises(ValueError, match="overlap"):
        mpicoll.allreduce(x, memoryview(x), comm=COMM)
