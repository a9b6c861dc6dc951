"""mpicoll.Comm on one rank: how buffer specs are read (count, displacement, the datatype
reinterpreting the bytes, blocks), their errors, the pass-through of every other attribute, the
``algorithm`` attribute, and the request classes. The collectives themselves, at N = 1..4, are
in tests/mpi/test_drop_in.py."""

import array

import numpy as np
import pytest
from mpi4py import MPI

import mpicoll
from mpicoll.comm import Prequest, Request, _message

COMM = MPI.COMM_SELF


def test_lazy_exports():
    assert mpicoll.Comm is mpicoll.comm.Comm and mpicoll.wrap is mpicoll.comm.wrap
    mc = mpicoll.wrap(COMM, algorithm="ring")
    assert isinstance(mc, mpicoll.Comm) and mc.algorithm == "ring" and mc.comm is COMM
    assert mpicoll.Comm(mc).comm is COMM            # wrapping a wrapper: the same communicator
    assert mpicoll.Comm().comm is MPI.COMM_WORLD


def test_every_other_attribute_is_the_communicators():
    mc = mpicoll.Comm(COMM)
    assert mc.Get_rank() == 0 and mc.size == 1 and mc.rank == 0
    assert mc.allreduce({"a": 1}) == {"a": 1}      # lowercase, pickled: mpi4py's
    mc.Barrier()
    with pytest.raises(AttributeError, match="no_such_thing"):
        mc.no_such_thing
    assert mc == COMM and COMM == mc and mc == mpicoll.Comm(COMM) and mc != MPI.COMM_WORLD
    assert bool(mc)


def test_the_algorithm_attribute_is_used_by_every_call():
    mc = mpicoll.Comm(COMM)
    mc.algorithm = "no_such_algorithm"
    x, out = np.ones(4), np.zeros(4)
    for call, collective in ((lambda: mc.Allreduce(x, out), "allreduce"),
                             (lambda: mc.Iallreduce(x, out), "allreduce"),
                             (lambda: mc.Allreduce_init(x, out), "allreduce"),
                             (lambda: mc.Reduce_scatter_block(x, out), "reduce_scatter_block"),
                             (lambda: mc.Ireduce_scatter_block(x, out), "reduce_scatter_block"),
                             (lambda: mc.Reduce_scatter_block_init(x, out),
                              "reduce_scatter_block"),
                             (lambda: mc.Allgather(x, out), "allgather"),
                             (lambda: mc.Iallgather(x, out), "allgather"),
                             (lambda: mc.Allgather_init(x, out), "allgather"),
                             (lambda: mc.Bcast(out), "bcast"),
                             (lambda: mc.Ibcast(out), "bcast"),
                             (lambda: mc.Bcast_init(out), "bcast")):
        with pytest.raises(ValueError, match=f"unknown {collective} algorithm "
                                             f"'no_such_algorithm'"):
            call()


def test_only_an_intracommunicator_is_wrapped():
    for comm in ("world", MPI.COMM_NULL):
        with pytest.raises(TypeError, match="wraps an MPI intracommunicator"):
            mpicoll.Comm(comm)


# ----------------------------------------------------------------------------- buffer specs

def test_the_datatype_decides_how_the_bytes_are_read():
    raw = bytearray(np.arange(4.0).tobytes())
    view = _message([raw, MPI.DOUBLE], "buf")
    assert view.dtype == np.float64 and view.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert np.shares_memory(view, np.frombuffer(raw, np.uint8))
    ints = np.arange(4, dtype=np.int64)
    as_int32 = _message([ints, MPI.INT], "buf")     # the bytes of 4 int64 as 8 int32
    assert as_int32.dtype == np.int32 and as_int32.size == 8
    assert _message([ints, "i"], "buf").dtype == np.int32      # an mpi4py typecode string


@pytest.mark.parametrize("spec, want", [
    (lambda a: a, [0, 1, 2, 3, 4, 5]),
    (lambda a: [a, MPI.DOUBLE], [0, 1, 2, 3, 4, 5]),
    (lambda a: [a, 3], [0, 1, 2]),
    (lambda a: [a, (2, 3)], [3, 4]),
    (lambda a: [a, 2, MPI.DOUBLE], [0, 1]),
    (lambda a: [a, (2, 1), MPI.DOUBLE], [1, 2]),
    (lambda a: [a, 2, 4, MPI.DOUBLE], [4, 5]),
    (lambda a: (a.data, 0, MPI.DOUBLE), []),
])
def test_count_and_displacement(spec, want):
    a = np.arange(6.0)
    view = _message(spec(a), "buf")
    assert view.tolist() == want
    assert view.size == 0 or np.shares_memory(view, a)


def test_blocks_divide_an_inferred_count_and_multiply_a_given_one():
    a = np.arange(6.0)
    assert _message([a, MPI.DOUBLE], "recvbuf", blocks=3).size == 6
    assert _message([a, 1, MPI.DOUBLE], "recvbuf", blocks=3).tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(ValueError, match="6 elements do not split into 4 blocks"):
        _message([a, MPI.DOUBLE], "recvbuf", blocks=4)


@pytest.mark.parametrize("spec, exc, match", [
    ([np.zeros(4), 5, MPI.DOUBLE], ValueError,
     "sendbuf: count 5 of float64 needs 40 bytes, the buffer has 32"),
    ([np.zeros(4), 2, 3, MPI.DOUBLE], ValueError, "needs 16 bytes, the buffer has 8 after "
                                                  "displacement 3"),
    ([np.zeros(4), (1, 5), MPI.DOUBLE], ValueError, "displacement 5 is past the end"),
    ([np.zeros(4), -1, MPI.DOUBLE], ValueError, "negative count -1"),
    ([np.zeros(4), 1.5, MPI.DOUBLE], TypeError, "the count must be an integer, got 1.5"),
    ([bytearray(6), MPI.DOUBLE], ValueError, "6 bytes are not a whole number of float64"),
    ([np.zeros(4), 1, 2, 3, 4], ValueError, "a buffer spec is buf, .*got a list of 5 items"),
    ([np.zeros(4), MPI.DOUBLE_INT], TypeError, "MPI datatype MPI_DOUBLE_INT .* is not one "
                                               "mpicoll reduces; supported: "),
    ([np.zeros(4), MPI.CHAR], TypeError, "MPI datatype MPI_CHAR .* is not one mpicoll"),
    ([np.zeros(4), "Z"], TypeError, "'Z' is not an MPI datatype mpicoll can map"),
    ([np.zeros(8)[::2], MPI.DOUBLE], ValueError, "must be C-contiguous"),
    ([np.ma.masked_array([1.0, 2.0]), MPI.DOUBLE], TypeError, "is a masked array"),
    ([[1.0, 2.0], MPI.DOUBLE], TypeError, "must be an array, got list"),
])
def test_bad_specs_name_the_problem(spec, exc, match):
    with pytest.raises(exc, match=match):
        _message(spec, "sendbuf")


def test_read_only_memory_is_send_only():
    mc = mpicoll.Comm(COMM)
    out = np.zeros(2)
    mc.Allreduce([bytes(np.arange(2.0).tobytes()), MPI.DOUBLE], [out, MPI.DOUBLE])
    assert out.tolist() == [0.0, 1.0]
    with pytest.raises(ValueError, match="recvbuf is read-only"):
        mc.Allreduce([np.ones(2), MPI.DOUBLE], [bytes(16), MPI.DOUBLE])


def test_none_sendbuf_is_in_place_as_in_mpi4py():
    mc = mpicoll.Comm(COMM)
    buf = array.array("d", [1.0, 2.0])
    mc.Allreduce(None, [buf, MPI.DOUBLE])
    assert buf.tolist() == [1.0, 2.0]


# ----------------------------------------------------------------------------- requests

def test_requests_wait_test_and_waitall_with_mpi_requests_mixed_in():
    mc = mpicoll.Comm(COMM)
    x, out = np.arange(3.0), np.zeros(3)
    request = mc.Iallreduce([x, MPI.DOUBLE], [out, MPI.DOUBLE])
    assert isinstance(request, Request) and not isinstance(request, MPI.Request)
    barrier = COMM.Ibarrier()
    assert Request.Waitall([request, barrier]) is True
    assert out.tolist() == [0.0, 1.0, 2.0]
    assert request.Test() is True and request.Wait() is True
    pending = [mc.Iallreduce(MPI.IN_PLACE, [out, MPI.DOUBLE]), COMM.Ibarrier()]
    for _ in range(100000):
        if Request.Testall(pending):
            break
    assert Request.Testall(pending) is True


def test_persistent_request_start_wait_test_startall():
    mc = mpicoll.Comm(COMM)
    x, out = np.arange(3.0), np.zeros(3)
    handles = [mc.Allreduce_init(x, out), mc.Allreduce_init(MPI.IN_PLACE, np.ones(2))]
    assert all(isinstance(h, Prequest) for h in handles)
    for step in range(3):
        x[:] = step
        Prequest.Startall(handles)
        assert Prequest.Waitall(handles) is True
        assert out.tolist() == [step] * 3 and handles[0].Test() is True
    assert np.shares_memory(handles[0].result, out)
    for h in handles:
        h.Free()
    with pytest.raises(ValueError, match="freed"):
        handles[0].Start()
