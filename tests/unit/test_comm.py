"""mpicoll.Comm on one rank: how buffer specs are read (count, displacement, the datatype
reinterpreting the bytes, blocks), their errors, the pass-through of every other attribute, the
``algorithm`` attribute, and the request classes. The collectives themselves, at N = 1..4, are
in tests/mpi/test_drop_in.py."""

import array

import numpy as np
import pytest
from mpi4py import MPI

import mpicoll
from mpicoll.buffer_specs import message as _message
from mpicoll.comm import Prequest, Request

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


class _Seen(Exception):
    pass


def _algorithm_seen(*args, algorithm, **kwargs):
    raise _Seen(algorithm)


def test_the_algorithm_attribute_is_used_by_every_call(monkeypatch):
    """A name applies to each collective that has it, auto to the others (the user guide's
    "recursive_doubling" has no reduce-scatter or broadcast); a mapping names them one by one;
    a name no collective has is refused when it is set (issue 21)."""
    from mpicoll import api, persistent
    for module, names in ((api, ("allreduce", "iallreduce", "reduce_scatter_block",
                                 "ireduce_scatter_block", "allgather", "iallgather", "bcast",
                                 "ibcast")),
                          (persistent, ("allreduce_init", "reduce_scatter_block_init",
                                        "allgather_init", "bcast_init"))):
        for name in names:
            monkeypatch.setattr(module, name, _algorithm_seen)
    mc = mpicoll.Comm(COMM)
    x, out = np.ones(4), np.zeros(4)
    calls = ((lambda: mc.Allreduce(x, out), "allreduce"),
             (lambda: mc.Iallreduce(x, out), "allreduce"),
             (lambda: mc.Allreduce_init(x, out), "allreduce"),
             (lambda: mc.Reduce_scatter_block(x, out), "reduce_scatter_block"),
             (lambda: mc.Ireduce_scatter_block(x, out), "reduce_scatter_block"),
             (lambda: mc.Reduce_scatter_block_init(x, out), "reduce_scatter_block"),
             (lambda: mc.Allgather(x, out), "allgather"),
             (lambda: mc.Iallgather(x, out), "allgather"),
             (lambda: mc.Allgather_init(x, out), "allgather"),
             (lambda: mc.Bcast(out), "bcast"),
             (lambda: mc.Ibcast(out), "bcast"),
             (lambda: mc.Bcast_init(out), "bcast"))
    for setting, expected in (
            ("recursive_doubling", {"allreduce": "recursive_doubling", "allgather":
                                    "recursive_doubling", "reduce_scatter_block": "auto",
                                    "bcast": "auto"}),
            ("binomial", {"allreduce": "binomial", "bcast": "binomial",
                          "reduce_scatter_block": "auto", "allgather": "auto"}),
            ("ring", dict.fromkeys(("allreduce", "reduce_scatter_block", "allgather", "bcast"),
                                   "ring")),
            ({"bcast": "scatter_ring_allgather", "allreduce": "hierarchical"},
             {"bcast": "scatter_ring_allgather", "allreduce": "hierarchical",
              "reduce_scatter_block": "auto", "allgather": "auto"})):
        mc.algorithm = setting
        assert mc.algorithm == setting
        for call, collective in calls:
            assert mc.algorithm_for(collective) == expected[collective]
            with pytest.raises(_Seen) as seen:
                call()
            assert seen.value.args == (expected[collective],), (setting, collective)
    with pytest.raises(ValueError, match="unknown algorithm 'no_such_algorithm' .no "
                                         "collective has it.; known: auto, binomial"):
        mc.algorithm = "no_such_algorithm"
    with pytest.raises(ValueError, match="unknown bcast algorithm 'recursive_doubling'"):
        mc.algorithm = {"bcast": "recursive_doubling"}
    with pytest.raises(ValueError, match=r"maps \['reduce'\], not collectives"):
        mc.algorithm = {"reduce": "ring"}
    with pytest.raises(TypeError, match="a name or a"):
        mpicoll.Comm(COMM, algorithm=3)
    assert mc.algorithm == {"bcast": "scatter_ring_allgather", "allreduce": "hierarchical"}


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
    ([np.zeros(4), "Z"], TypeError, "'Z' is not an MPI datatype"),
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

def test_requests_are_mpi_requests():
    """Iallreduce (...) returns a real MPI.Request (a generalized request, completed with
    mpicoll's collective): MPI's Waitall / Testall / Waitany take it, mixed with MPI's own, and
    after Wait it is REQUEST_NULL, as mpi4py's (issue 21)."""
    mc = mpicoll.Comm(COMM)
    x, out = np.arange(3.0), np.zeros(3)
    request = mc.Iallreduce([x, MPI.DOUBLE], [out, MPI.DOUBLE])
    assert isinstance(request, Request) and isinstance(request, MPI.Request)
    barrier = COMM.Ibarrier()
    MPI.Request.Waitall([request, barrier])
    assert out.tolist() == [0.0, 1.0, 2.0]
    assert not request and request == MPI.REQUEST_NULL and not barrier
    assert request.Test() is True and request.Wait() is True       # as mpi4py's on a null one
    pending = [mc.Iallreduce(MPI.IN_PLACE, [out, MPI.DOUBLE]), COMM.Ibarrier()]
    for _ in range(100000):
        if MPI.Request.Testall(pending):
            break
    assert all(r == MPI.REQUEST_NULL for r in pending)
    pending = [COMM.Ibarrier(), mc.Ibcast([out, MPI.DOUBLE])]
    done = set()
    while len(done) < 2:
        done.add(MPI.Request.Waitany(pending))
    assert done == {0, 1} and out.tolist() == [0.0, 1.0, 2.0]
    request = mc.Iallgather(x, np.zeros(3))
    status = MPI.Status()
    for _ in range(100000):
        if request.Get_status(status):
            break
    assert request and status.Get_count(MPI.BYTE) == 0 and not status.Is_cancelled()
    assert request.Wait() is True and not request
    request = mc.Ireduce_scatter_block(x, np.zeros(3))
    request.Free()                          # MPI_Request_free: the collective completes anyway
    assert request == MPI.REQUEST_NULL and request.Wait() is True
    # mpicoll's own helpers (which move the collectives in the caller-progress mode too)
    pending = [mc.Iallreduce(x, out), COMM.Ibarrier()]
    assert Request.Waitall(pending) is True and not any(pending)
    pending = [mc.Iallreduce(x, out), COMM.Ibarrier()]
    while not Request.Testall(pending):
        pass
    assert Request.Waitany([mc.Iallreduce(x, out)]) == 0


def test_request_errors_are_raised_by_wait(monkeypatch):
    """A request whose collective fails raises mpicoll's error from Wait, and MPI's Waitall
    reports it (MPI_ERR_OTHER) instead of hanging."""
    from mpicoll import buffer_specs
    mc = mpicoll.Comm(COMM)
    x, out = np.arange(3.0), np.zeros(3)
    real = buffer_specs.Args.after

    def failing_after(self):
        raise RuntimeError("unpacking failed")
    monkeypatch.setattr(buffer_specs.Args, "after", failing_after)
    request = mc.Iallreduce(x, out)
    with pytest.raises(RuntimeError, match="unpacking failed"):
        request.Wait()
    assert request == MPI.REQUEST_NULL
    request = mc.Iallreduce(x, out)
    with pytest.raises(MPI.Exception):
        MPI.Request.Waitall([request])
    monkeypatch.setattr(buffer_specs.Args, "after", real)


def test_persistent_request_errors_are_raised_by_wait(monkeypatch):
    """A persistent request whose collective fails raises mpicoll's error from Wait and Test,
    and MPI's Waitall reports it (its receive is truncated) instead of returning success; the
    request is inactive after, and starts again."""
    from mpicoll import buffer_specs
    from mpicoll.executors import progress
    mc = mpicoll.Comm(COMM)
    x, out = np.arange(3.0), np.zeros(3)
    real = buffer_specs.Args.after

    def failing_after(self):
        raise RuntimeError("unpacking failed")
    handle = mc.Allreduce_init(x, out)
    monkeypatch.setattr(buffer_specs.Args, "after", failing_after)
    if progress.mode() == "thread":
        handle.Start()
        with pytest.raises(RuntimeError, match="unpacking failed"):
            handle.Wait()
        handle.Start()
        with pytest.raises(RuntimeError, match="unpacking failed"):
            while not handle.Test():
                pass
        handle.Start()
        with pytest.raises(MPI.Exception):
            MPI.Request.Waitall([handle])
    else:                       # caller progress: Start() runs the collective, and raises
        with pytest.raises(RuntimeError, match="unpacking failed"):
            handle.Start()
    monkeypatch.setattr(buffer_specs.Args, "after", real)
    x[:] = 2
    handle.Start()
    assert handle.Wait() is True and out.tolist() == [2.0] * 3
    handle.Free()


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
    assert all(isinstance(h, MPI.Prequest) for h in handles)        # issue 21
    x[:] = 7
    for h in handles:
        h.Start()
    MPI.Request.Waitall(handles)                # MPI's own: completes with the collective
    assert out.tolist() == [7] * 3 and all(handles)     # inactive, not null (persistent)
    status = MPI.Status()
    assert handles[0].Get_status(status) and status.Get_count(MPI.BYTE) == 0
    for h in handles:
        h.Free()
    assert not handles[0] and handles[0] == MPI.REQUEST_NULL
    assert handles[0].Wait() is True and handles[0].Test() is True     # as mpi4py's
    with pytest.raises(ValueError, match="freed"):
        handles[0].Start()


class _OldDLPack:
    """Only the protocol before DLPack 1.0: ``__dlpack__(stream=None)``, no keywords."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, stream=None):
        assert stream is None
        return self.array.__dlpack__()

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def test_the_older_dlpack_protocol_is_accepted():
    """issue 21: ``__dlpack__(stream=None)`` alone was refused ("unexpected keyword argument
    'dl_device'"); now read with and without a datatype, results in the caller's memory."""
    mc = mpicoll.Comm(COMM)
    x, out = np.arange(4.0), np.zeros(4)
    mc.Allreduce([_OldDLPack(x), MPI.DOUBLE], [_OldDLPack(out), MPI.DOUBLE])
    assert out.tolist() == [0.0, 1.0, 2.0, 3.0]
    out[:] = 0
    mc.Allreduce(_OldDLPack(x), _OldDLPack(out))       # its own dtype
    assert out.tolist() == [0.0, 1.0, 2.0, 3.0]
    view = _message([_OldDLPack(out), 2, 1, MPI.DOUBLE], "recvbuf")
    assert np.shares_memory(view, out) and view.tolist() == [1.0, 2.0]
    mc.Bcast(_OldDLPack(out))
    assert out.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_copy_only_collectives_take_any_type():
    """issue 21: Bcast and Allgather copy, so any datatype will do (read as bytes, or packed
    for a datatype with holes); a reduction of such a type names the difference."""
    mc = mpicoll.Comm(COMM)
    long = np.arange(3, dtype=np.longdouble)
    mc.Bcast([long, MPI.LONG_DOUBLE])
    spec = _message([long, MPI.LONG_DOUBLE], "buf", copy=True)
    assert spec.dtype == np.uint8 and spec.size == long.nbytes and np.shares_memory(spec, long)
    out = np.zeros(3, np.longdouble)
    mc.Allgather([long, MPI.LONG_DOUBLE], [out, MPI.LONG_DOUBLE])
    assert out.tolist() == [0.0, 1.0, 2.0]
    evens = MPI.DOUBLE.Create_indexed_block(1, [0, 2]).Commit()
    try:
        x, y = np.arange(3.0), np.full(3, -1.0)
        mc.Allgather([x, 1, evens], [y, 1, evens])
        assert y.tolist() == [0.0, -1.0, 2.0]
        with pytest.raises(ValueError, match="reach past the buffer"):
            mc.Bcast([np.zeros(2), 1, evens])
    finally:
        evens.Free()
    with pytest.raises(TypeError, match="MPI_LONG_DOUBLE .* is not one mpicoll reduces; .*a "
                                        "broadcast or all-gather takes any type"):
        mc.Allreduce([long, MPI.LONG_DOUBLE], [out, MPI.LONG_DOUBLE])
    with pytest.raises(TypeError, match="__cuda_array_interface__: device memory"):
        mc.Bcast(_FakeDevice())


class _FakeDevice:
    __cuda_array_interface__ = {"version": 3, "shape": (1,), "typestr": "<f8", "data": (0, False)}
