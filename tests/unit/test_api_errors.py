"""Bad input raises on the calling rank, before any communication, naming the problem."""

import array

import ml_dtypes
import numpy as np
import pytest
from mpi4py import MPI

import mpicoll

COMM = MPI.COMM_SELF


def call(fn, *args, **kwargs):
    return fn(*args, comm=kwargs.pop("comm", COMM), **kwargs)


@pytest.mark.parametrize("args, kwargs, exc, match", [
    (([1.0, 2.0],), {}, TypeError, "sendbuf must be an array, got list"),
    ((np.array(["a", "b"]),), {}, TypeError, "unsupported dtype <U1; supported: float32"),
    ((np.arange(3, dtype=np.complex128),), {"op": "max"}, TypeError,
     r"op 'max' does not apply to dtype complex128 .*; ops for complex128: sum, prod"),
    ((np.arange(3.0),), {"op": MPI.BAND}, TypeError,
     r"op 'band' does not apply to dtype float64 .*: sum, prod, max, min"),
    ((np.zeros(3, bool),), {}, TypeError, "ops for bool: land, lor, lxor"),
    ((np.zeros(3, ml_dtypes.bfloat16),), {"algorithm": "mpi"}, TypeError,
     "the MPI library has no datatype for bfloat16.*'ring'"),
    ((np.arange(3.0),), {"op": MPI.MAXLOC}, TypeError,
     r"op MPI.MAXLOC is not supported: it reduces \(value, index\) pairs"),
    ((np.arange(3.0),), {"op": "minloc"}, TypeError, "allreduce\\(x, op=MPI.MIN\\)"),
    ((np.arange(3.0),), {"op": "avg"}, TypeError, "unsupported op 'avg'"),
    ((np.arange(3.0),), {"algorithm": "butterfly"}, ValueError,
     "unknown allreduce algorithm 'butterfly'"),
    ((np.arange(6.0)[::2],), {}, ValueError, "sendbuf must be C-contiguous"),
    ((np.arange(3.0), np.zeros(4)), {}, ValueError, "recvbuf has 4 elements, expected 3"),
    ((np.arange(3.0), np.zeros(3, np.float32)), {}, ValueError,
     "recvbuf dtype float32 does not match sendbuf dtype float64"),
    ((MPI.IN_PLACE,), {}, ValueError, "IN_PLACE needs a recvbuf"),
    ((None, np.zeros(3)), {}, TypeError, "sendbuf must be an array .*, got NoneType"),
    ((np.arange(3.0),), {"algorithm": "ring", "inner": "ring"}, ValueError,
     "inner/outer apply to algorithm='hierarchical'"),
    ((np.arange(3.0),), {"comm": "world"}, TypeError, "comm must be an MPI intracommunicator"),
])
def test_allreduce_bad_input(args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        call(mpicoll.allreduce, *args, **kwargs)


def test_read_only_recvbuf():
    out = np.zeros(3)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="recvbuf is read-only"):
        mpicoll.allreduce(np.arange(3.0), out, comm=COMM)


def test_aliased_buffers_need_in_place():
    x = np.arange(4.0)
    with pytest.raises(ValueError, match="overlap.*IN_PLACE"):
        mpicoll.allreduce(x, x, comm=COMM)
    with pytest.raises(ValueError, match="overlap"):
        mpicoll.allreduce(x[:2], x[1:3], comm=COMM)


def test_sendbuf_untouched_and_recvbuf_returned():
    x = np.arange(5, dtype=np.int32)
    out = np.empty(5, np.int32)
    assert mpicoll.allreduce(x, out, comm=COMM) is out
    assert out.tolist() == x.tolist()
    y = x.copy()
    assert mpicoll.allreduce(MPI.IN_PLACE, y, comm=COMM) is y


def test_other_collectives_bad_input():
    with pytest.raises(ValueError, match="root 1 out of range for a communicator of size 1"):
        mpicoll.bcast(np.zeros(3), 1, comm=COMM)
    with pytest.raises(ValueError, match="root -1 out of range"):
        mpicoll.bcast(np.zeros(3), -1, comm=COMM)
    with pytest.raises(ValueError, match="unknown bcast algorithm 'recursive_halving'"):
        mpicoll.bcast(np.zeros(3), algorithm="recursive_halving", comm=COMM)
    with pytest.raises(ValueError, match="unknown allgather algorithm"):
        mpicoll.allgather(np.zeros(3), algorithm="binomial", comm=COMM)
    with pytest.raises(ValueError, match="recvbuf has 2 elements, expected 3"):
        mpicoll.allgather(np.zeros(3), np.zeros(2), comm=COMM)
    with pytest.raises(ValueError, match="recvbuf has 5 elements, expected 3"):
        mpicoll.reduce_scatter_block(np.zeros(3), np.zeros(5), comm=COMM)
    ro = np.zeros(3)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="buf is read-only"):
        mpicoll.bcast(ro, comm=COMM)


def test_algorithms_listed():
    assert mpicoll.ALGORITHMS == ("ring", "recursive_halving", "recursive_doubling", "binomial",
                                  "hierarchical", "double_binary_tree", "naive", "shm", "mpi")



def test_unsupported_mpi_op_is_named():
    for op, name in ((MPI.REPLACE, "MPI.REPLACE"), (MPI.NO_OP, "MPI.NO_OP")):
        with pytest.raises(TypeError, match=rf"unsupported op {name}; expected one of MPI.SUM"):
            mpicoll.allreduce(np.arange(3.0), op=op, comm=COMM)
    with pytest.raises(TypeError, match=r"unsupported op MPI.REPLACE") as info:
        mpicoll.reduce_scatter_block(np.arange(3.0), op=MPI.REPLACE, comm=COMM)
    assert "object at 0x" not in str(info.value)


@pytest.mark.parametrize("make, kind", [(lambda: [1.0, 2.0], "list"),
                                        (lambda: (1.0, 2.0), "tuple")])
def test_lists_and_tuples_say_how_to_pass_them(make, kind):
    with pytest.raises(TypeError, match=rf"sendbuf must be an array, got {kind}; "
                                        rf"pass np.asarray\(sendbuf\) \(a copy"):
        mpicoll.allreduce(make(), comm=COMM)
    with pytest.raises(TypeError, match=rf"buf must be an array, got {kind}; "
                                        rf"pass np.asarray\(buf\)"):
        mpicoll.bcast(make(), comm=COMM)


def test_masked_arrays_are_refused():
    x = np.ma.masked_array([1.0, 2.0, 3.0], mask=[0, 1, 0])
    for fn, args in ((mpicoll.allreduce, (x,)), (mpicoll.allgather, (x,)),
                     (mpicoll.reduce_scatter_block, (x,)), (mpicoll.bcast, (x,)),
                     (mpicoll.allreduce, (np.zeros(3), x))):
        with pytest.raises(TypeError, match=r"is a masked array: mpicoll would reduce its masked "
                                            r"values too; pass \w+\.filled\(value\)"):
            fn(*args, comm=COMM)


@pytest.mark.parametrize("root", [True, False, np.bool_(True), 0.0, "0", None])
def test_bcast_root_must_be_an_integer_not_a_bool(root):
    with pytest.raises(TypeError, match=r"root must be an integer rank, got"):
        mpicoll.bcast(np.zeros(3), root, comm=MPI.COMM_WORLD)


def test_bcast_numpy_integer_root_is_accepted():
    buf = np.arange(3.0)
    assert mpicoll.bcast(buf, np.int64(0), comm=COMM) is buf
    assert buf.tolist() == [0.0, 1.0, 2.0]
