"""mpicoll.Comm as a drop-in for mpi4py, tested in the shape of mpi4py's own collective buffer
tests (test/test_cco_buf.py): every dtype mpicoll has (``kernels.DTYPES``, with its MPI
datatype where MPI has one), every op of ``kernels.OPS``, every root, counts 0..size (0, 1,
size - 1, size above 5 ranks), in place and not, every buffer spec -- ``buf``,
``[buf, datatype]``, ``[buf, count]``, ``[buf, count, datatype]``,
``[buf, (count, displ), datatype]`` -- over numpy arrays,
``memoryview``, ``array.array`` and ``bytearray`` read as the datatype. The reference is the MPI
library's own all-reduce on the same inputs (whose result is exact in any order, so the bits
must be equal); where MPI has no datatype (bfloat16), its float64 one, cast back. Where MPI
refuses an (op, dtype), the wrapper must raise mpicoll's error on every rank, not fall back.

    mpiexec -n 4 python -m mpi4py -m pytest tests/mpi/test_drop_in.py --with-mpi
"""

import array

import numpy as np
import pytest
from mpi4py import MPI
from mpi4py.util import dtlib

import mpicoll
from mpicoll import kernels
from mpicoll.algorithms import allreduce_shm
from mpicoll.comm import Request
from mpicoll.executors import progress
from mpicoll._runtime.context import state
from mpicoll.registry import COLLECTIVES
from mpicoll.testing import agree, exact_input, exact_result, raises_everywhere

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(600), pytest.mark.rank_counts(1, 2, 4)]


def _mpi_datatype(dtype):
    """MPI's predefined datatype for ``dtype`` (``dtlib.from_numpy_dtype`` would give a
    duplicate, on which MPI defines no op), or None (bfloat16: MPI has none)."""
    try:
        datatype = MPI.Datatype.fromcode(dtype.char)
    except (KeyError, ValueError):
        return None
    assert dtlib.to_numpy_dtype(datatype) == dtype
    return datatype


TYPES = [(dtype, _mpi_datatype(dtype)) for dtype in kernels.DTYPES]
SENTINEL = 7                    # what the elements before a displacement hold, untouched


def _typecode(dtype):
    """The array.array typecode of ``dtype``, or None."""
    for code in array.typecodes:
        try:
            if np.asarray(memoryview(array.array(code))).dtype == dtype:
                return code
        except (TypeError, ValueError):
            continue
    return None


# Each maker turns values (a numpy array) into (the buffer spec, a function reading back the
# elements it names from the caller's object). ``blocks``: how many blocks the call reads (the
# count in a spec is per block). Without an MPI datatype (bfloat16) a spec leaves it out, as
# mpi4py allows, and the buffer's own dtype is used.

def _numpy(a, datatype, blocks):
    return a, lambda: a


def _with_datatype(a, datatype, blocks):
    return ([a, datatype] if datatype is not None else a), lambda: a


def _with_count(a, datatype, blocks):
    return [a, a.size // blocks], lambda: a


def _memoryview_count_datatype(a, datatype, blocks):
    if datatype is None:                        # bfloat16 has no buffer format either
        return _with_count(a, datatype, blocks)
    return [a.data, a.size // blocks, datatype], lambda: a


def _with_displacement(a, datatype, blocks):
    padded = np.full(a.size + 2, SENTINEL, a.dtype)
    padded[2:] = a
    before = padded[:2].tobytes()

    def read():
        assert padded[:2].tobytes() == before, "elements before the displacement were written"
        return padded[2:]
    spec = [padded, (a.size // blocks, 2)] + ([datatype] if datatype is not None else [])
    return spec, read


def _array_array(a, datatype, blocks):
    code = _typecode(a.dtype)
    if code is None:                            # array.array cannot hold it: plain numpy
        return _with_count(a, datatype, blocks)
    buf = array.array(code, a.tobytes())
    return [buf, datatype] if datatype is not None else buf, lambda: np.asarray(memoryview(buf))


def _bytearray(a, datatype, blocks):
    if datatype is None:                        # only a datatype says how to read bytes
        return _numpy(a, datatype, blocks)
    buf = bytearray(a.tobytes())
    return [buf, a.size // blocks, datatype], lambda: np.frombuffer(buf, a.dtype)


SPECS = {"buf": _numpy, "[buf, datatype]": _with_datatype, "[buf, count]": _with_count,
         "[memoryview, count, datatype]": _memoryview_count_datatype,
         "[buf, (count, displ), datatype]": _with_displacement,
         "[array.array, datatype]": _array_array, "[bytearray, count, datatype]": _bytearray}


def _cases(comm, collective, ops=kernels.OPS):
    """(dtype, datatype, op, count, spec maker, algorithm, what) for every dtype, op and count
    0..size (four of them above 5 ranks); the spec and the algorithm (``auto`` and every one
    of ``collective``) take turns
    (for the reductions every dtype meets every spec: there are >= 8 cases per dtype)."""
    algorithms = ["auto"] + list(COLLECTIVES[collective])
    names = list(SPECS)
    size = comm.Get_size()
    counts = range(size + 1)
    i = 0
    for dtype, datatype in TYPES:
        for opname in ops:
            for count in counts:
                spec, algorithm = names[i % len(names)], algorithms[i % len(algorithms)]
                if algorithm == "mpi" and datatype is None:
                    algorithm = "auto"              # MPI has no such datatype
                if algorithm == "shm" and (not allreduce_shm.supports(opname, dtype)
                                           or len(state(comm).real_nodes) > 1):
                    algorithm = "auto"              # shm's own refusal: tests/mpi/test_shm.py
                i += 1
                yield (dtype, datatype, opname, count, SPECS[spec], algorithm,
                       f"{dtype} {opname} count={count} {spec} algorithm={algorithm}")


def _mpi_op(opname):
    return getattr(MPI, opname.upper())


def _reference(comm, send, datatype, opname):
    """``op`` over every rank's ``send`` by MPI's own ``Allreduce`` (None where MPI refuses
    the op for the datatype). A dtype MPI has no datatype for (bfloat16) is a floating-point
    type: MPI's float64 result on copies, cast back (the inputs are small integers, which
    every float type holds exactly), and MPI's floating-point rules on which ops apply."""
    if datatype is None:
        wide = _reference(comm, send.astype(np.float64), MPI.DOUBLE, opname)
        return None if wide is None else wide.astype(send.dtype)
    out = np.empty_like(send)
    try:
        comm.Allreduce([send, datatype], [out, datatype], op=_mpi_op(opname))
    except MPI.Exception:
        return None
    return out


def _check_refused(comm, run, what):
    """MPI refuses this (op, dtype): mpicoll must raise its own error on every rank."""
    try:
        run()
    except (TypeError, ValueError):
        agree(comm, True)
        return
    except Exception as exc:   # noqa: BLE001 - reported to every rank
        agree(comm, False, f"{what}: raised {type(exc).__name__}({exc}), not mpicoll's error")
    agree(comm, False, f"{what}: MPI refuses this op for this type, but mpicoll did not raise")


def _equal(got, want, opname=None):
    """Bit-equal (NaN-safe, and -0.0 differs from 0.0) -- but for a complex product, equal in
    value: mpicoll gives numpy's bits, whose vector loop fuses the multiply-add (FMA), and the
    sign of a zero imaginary part can differ from the MPI library's unfused C loop (seen:
    MPICH at N = 5, 1-0j against 1+0j)."""
    if opname == "prod" and got.dtype.kind == "c":
        return got.shape == want.shape and np.array_equal(got, want)
    return got.shape == want.shape and got.tobytes() == want.tobytes()


@pytest.mark.parametrize("in_place", [False, True], ids=["out-of-place", "IN_PLACE"])
def test_allreduce(comm, in_place):
    rank = comm.Get_rank()
    mc = mpicoll.Comm(comm)
    for dtype, datatype, opname, count, make, algorithm, what in _cases(comm, "allreduce"):
        send = exact_input(rank, count, dtype, opname)
        want = _reference(comm, send, datatype, opname)
        mc.algorithm = algorithm
        recvspec, read = make(send.copy() if in_place else np.zeros(count, dtype), datatype, 1)
        sendspec = MPI.IN_PLACE if in_place else make(send.copy(), datatype, 1)[0]
        if want is None:
            _check_refused(comm, lambda: mc.Allreduce(sendspec, recvspec, op=_mpi_op(opname)),
                           what)
            continue
        result = mc.Allreduce(sendspec, recvspec, op=_mpi_op(opname))
        agree(comm, result is None and _equal(read(), want, opname),
              f"{what}: {read()} != {want}")


@pytest.mark.parametrize("in_place", [False, True], ids=["out-of-place", "IN_PLACE"])
def test_reduce_scatter_block(comm, in_place):
    size, rank = comm.Get_size(), comm.Get_rank()
    mc = mpicoll.Comm(comm)
    for dtype, datatype, opname, count, make, algorithm, what in _cases(
            comm, "reduce_scatter_block"):
        send = exact_input(rank, count * size, dtype, opname)
        total = _reference(comm, send, datatype, opname)
        mc.algorithm = algorithm
        if in_place:        # the whole input in recvbuf, read as size blocks of count
            (recvspec, read), sendspec = make(send.copy(), datatype, size), MPI.IN_PLACE
        else:
            recvspec, read = make(np.zeros(count, dtype), datatype, 1)
            sendspec = make(send.copy(), datatype, size)[0]
        if total is None:
            _check_refused(comm, lambda: mc.Reduce_scatter_block(sendspec, recvspec,
                                                                 op=_mpi_op(opname)), what)
            continue
        mc.Reduce_scatter_block(sendspec, recvspec, op=_mpi_op(opname))
        want = total[rank * count:(rank + 1) * count]
        agree(comm, _equal(read()[:count], want, opname),
              f"{what}: {read()[:count]} != {want}")


@pytest.mark.parametrize("in_place", [False, True], ids=["out-of-place", "IN_PLACE"])
def test_allgather(comm, in_place):
    size, rank = comm.Get_size(), comm.Get_rank()
    mc = mpicoll.Comm(comm)
    for dtype, datatype, _, count, make, algorithm, what in _cases(comm, "allgather",
                                                                   ops=("sum",)):
        want = np.concatenate([exact_input(r, count, dtype, "sum") for r in range(size)])
        mine = exact_input(rank, count, dtype, "sum")
        mc.algorithm = algorithm
        start = np.zeros(count * size, dtype)
        if in_place:
            start[rank * count:(rank + 1) * count] = mine
        recvspec, read = make(start, datatype, size)
        sendspec = MPI.IN_PLACE if in_place else make(mine.copy(), datatype, 1)[0]
        mc.Allgather(sendspec, recvspec)
        agree(comm, _equal(read(), want), f"{what}: {read()} != {want}")


def test_bcast_every_root(comm):
    size, rank = comm.Get_size(), comm.Get_rank()
    mc = mpicoll.Comm(comm)
    roots = tuple(range(size))              # in the op slot of _cases: every root
    for dtype, datatype, root, count, make, algorithm, what in _cases(comm, "bcast", roots):
        want = exact_input(root, count, dtype, "max")
        mc.algorithm = algorithm
        buf, read = make(want.copy() if rank == root else np.zeros(count, dtype), datatype, 1)
        mc.Bcast(buf, root=root)
        agree(comm, _equal(read(), want), f"{what} (root {root}): {read()} != {want}")


def test_iallreduce_and_waitall_with_mpi_requests_mixed_in(comm):
    size, rank = comm.Get_size(), comm.Get_rank()
    mc = mpicoll.Comm(comm)
    n = 1000
    started = []
    for algorithm in ["auto"] + [a for a, algo in COLLECTIVES["allreduce"].items()
                                 if not algo.has("shared-memory")]:     # shm: no nonblocking form
        mc.algorithm = algorithm
        send = exact_input(rank, n, np.float64, "sum")
        recv = np.zeros(n)
        started.append((mc.Iallreduce([send, MPI.DOUBLE], [recv, MPI.DOUBLE], op=MPI.SUM),
                        recv))
    barrier = comm.Ibarrier()                   # an MPI request in the same list
    requests = [r for r, _ in started] + [barrier]
    if progress.mode() == "thread":
        MPI.Request.Waitall(requests)           # real MPI requests (issue 21)
    else:               # nothing moves mpicoll's requests inside MPI's wait (docs/buffers.md)
        Request.Waitall(requests)
    agree(comm, not any(requests) and all(r == MPI.REQUEST_NULL for r in requests))
    want = exact_result(size, n, np.float64, "sum")
    agree(comm, all(_equal(recv, want) for _, recv in started))
    agree(comm, all(r.Test() for r, _ in started) and Request.Testall(requests))
    assert Request.Waitall(requests) is True    # mpicoll's helper, on null requests too


def test_allreduce_init_start_wait(comm):
    size, rank = comm.Get_size(), comm.Get_rank()
    mc = mpicoll.Comm(comm)
    for algorithm in ["auto"] + [a for a, algo in COLLECTIVES["allreduce"].items()
                                 if not algo.has("shared-memory")
                                 or len(state(comm).real_nodes) == 1]:
        mc.algorithm = algorithm
        send, recv = np.zeros(64, np.int64), array.array("q", [0] * 64)
        request = mc.Allreduce_init([send, MPI.INT64_T], [recv, MPI.INT64_T], op=MPI.SUM)
        for step in range(3):
            send[:] = exact_input(rank, 64, np.int64, "sum") * (step + 1)
            request.Start()
            assert request.Wait() is True
            want = exact_result(size, 64, np.int64, "sum") * (step + 1)
            agree(comm, _equal(np.asarray(memoryview(recv)), want),
                  f"{algorithm} step {step}")
        request.Free()


def test_nonblocking_and_persistent_forms_of_every_collective(comm):
    """I* and *_init of each collective, every algorithm, two steps each: as the blocking
    call (whose results the tests above check against MPI's)."""
    size, rank = comm.Get_size(), comm.Get_rank()
    mc = mpicoll.Comm(comm)
    n = 6
    for algorithm in ["auto"] + list(COLLECTIVES["reduce_scatter_block"]):
        mc.algorithm = algorithm
        send, recv = np.zeros(n * size, np.int32), array.array("i", [0] * n)
        started = mc.Reduce_scatter_block_init([send, MPI.INT], [recv, MPI.INT], op=MPI.MAX)
        for step in range(2):
            send[:] = exact_input(rank, n * size, np.int32, "max") + step
            want = exact_result(size, n * size, np.int32, "max")[rank * n:(rank + 1) * n] + step
            started.Start()
            started.Wait()
            later = np.zeros(n, np.int32)
            mc.Ireduce_scatter_block([send, MPI.INT], [later, MPI.INT], op=MPI.MAX).Wait()
            agree(comm, _equal(np.asarray(memoryview(recv)), want) and _equal(later, want),
                  f"reduce_scatter_block {algorithm} step {step}")
        started.Free()
    for algorithm in ["auto"] + list(COLLECTIVES["allgather"]):
        mc.algorithm = algorithm
        send, recv = np.zeros(n), bytearray(8 * n * size)
        started = mc.Allgather_init([send, MPI.DOUBLE], [recv, MPI.DOUBLE])
        for step in range(2):
            send[:] = exact_input(rank, n, np.float64, "sum") + step
            want = np.concatenate([exact_input(r, n, np.float64, "sum") + step
                                   for r in range(size)])
            started.Start()
            started.Wait()
            later = np.zeros(n * size)
            mc.Iallgather([send, MPI.DOUBLE], [later, MPI.DOUBLE]).Wait()
            agree(comm, _equal(np.frombuffer(recv), want) and _equal(later, want),
                  f"allgather {algorithm} step {step}")
        started.Free()
    for algorithm in ["auto"] + list(COLLECTIVES["bcast"]):
        mc.algorithm = algorithm
        for root in range(size):
            buf = np.zeros(n, np.int64)
            started = mc.Bcast_init([buf, MPI.INT64_T], root=root)
            for step in range(2):
                want = exact_input(root, n, np.int64, "sum") + step
                if rank == root:
                    buf[:] = want
                started.Start()
                started.Wait()
                later = want.copy() if rank == root else np.zeros(n, np.int64)
                mc.Ibcast([later, MPI.INT64_T], root=root).Wait()
                agree(comm, _equal(buf, want) and _equal(later, want),
                      f"bcast {algorithm} root {root} step {step}")
            started.Free()


def _mpi4py_program(comm):
    """Written for mpi4py (adapted from its tutorial): runs on a plain communicator."""
    rank, size = comm.Get_rank(), comm.Get_size()
    sbuf = np.arange(10, dtype="d") * (rank + 1)
    rbuf = np.empty(10, dtype="d")
    comm.Allreduce([sbuf, MPI.DOUBLE], [rbuf, MPI.DOUBLE], op=MPI.SUM)
    counts = np.array([rank], dtype="i")
    comm.Allreduce(MPI.IN_PLACE, [counts, 1, MPI.INT], op=MPI.MAX)
    data = np.arange(4, dtype="i") if rank == 0 else np.empty(4, dtype="i")
    comm.Bcast([data, MPI.INT], root=0)
    gathered = np.empty(size, dtype="i")
    comm.Allgather([np.array([rank], "i"), MPI.INT], [gathered, MPI.INT])
    block = np.empty(2, dtype="d")
    comm.Reduce_scatter_block([np.ones(2 * size), MPI.DOUBLE], [block, MPI.DOUBLE], op=MPI.SUM)
    request = comm.Iallreduce(MPI.IN_PLACE, [block, MPI.DOUBLE], op=MPI.MIN)
    request.Wait()
    total = comm.allreduce(rank)                # lowercase: pickled, the communicator's own
    comm.Barrier()
    return rbuf, counts, data, gathered, block, total


def test_mpi4py_code_runs_unchanged(comm):
    want = _mpi4py_program(comm)
    wrapped = mpicoll.Comm(MPI.COMM_WORLD.Dup())
    try:
        got = _mpi4py_program(wrapped)
        agree(comm, all(np.array_equal(g, w) for g, w in zip(got, want)), f"{got} != {want}")
        seen = []                                   # the calls did go through mpicoll
        with pytest.MonkeyPatch.context() as patch:
            for name in ("allreduce", "iallreduce", "bcast", "allgather",
                         "reduce_scatter_block"):
                real = getattr(mpicoll.api, name)
                patch.setattr(mpicoll.api, name,
                              lambda *a, _real=real, _name=name, **k: (seen.append(_name),
                                                                       _real(*a, **k))[1])
            again = _mpi4py_program(wrapped)
        agree(comm, sorted(seen) == ["allgather", "allreduce", "allreduce", "bcast",
                                     "iallreduce", "reduce_scatter_block"], f"{seen}")
        agree(comm, all(np.array_equal(g, w) for g, w in zip(again, want)))
    finally:
        wrapped.Free()


def test_what_mpicoll_cannot_do_is_an_error_not_a_fall_back(comm):
    mc = mpicoll.Comm(comm)
    x, out = np.ones(4), np.zeros(4)
    user_op = MPI.Op.Create(lambda a, b, t: None, commute=True)
    pair = MPI.DOUBLE.Create_contiguous(2).Commit()
    try:
        raises_everywhere(comm, TypeError, mc.Allreduce, x, out, op=user_op,
                          match="unsupported op")
        raises_everywhere(comm, TypeError, mc.Allreduce, [x, 2, pair], [out, 2, pair],
                          match="recvbuf: MPI datatype .* is not one mpicoll reduces")
        raises_everywhere(comm, ValueError, mc.Allreduce, [x, 5, MPI.DOUBLE],
                          [out, 5, MPI.DOUBLE], match="count 5 of float64 needs 40 bytes, the "
                                                      "buffer has 32")
    finally:
        pair.Free()
        user_op.Free()
    agree(comm, out.tolist() == [0.0] * 4)


# ----------------------------------------------------------------------------- issue 21

@pytest.mark.parametrize("form", ["blocking", "nonblocking", "persistent"])
def test_in_place_reduce_scatter_block_keeps_the_rest_of_recvbuf(comm, form):
    """In place, only the first block of recvbuf is written (as MPICH and Open MPI do): at
    N = 5 under ring, rank 0 of ``np.full(size, rank, "i")`` ends [10, 0, 0, 0, 0]."""
    size, rank = comm.Get_size(), comm.Get_rank()
    mc = mpicoll.Comm(comm)
    for algorithm in ["auto"] + list(COLLECTIVES["reduce_scatter_block"]):
        mc.algorithm = algorithm
        for block in (1, 3):
            buf = np.full(size * block, rank, "i")
            spec = [buf, MPI.INT]
            if form == "blocking":
                mc.Reduce_scatter_block(MPI.IN_PLACE, spec)
            elif form == "nonblocking":
                mc.Ireduce_scatter_block(MPI.IN_PLACE, spec).Wait()
            else:
                handle = mc.Reduce_scatter_block_init(MPI.IN_PLACE, spec)
                for step in range(2):           # the input is read again at every Start
                    buf[:] = rank
                    handle.Start()
                    handle.Wait()
                handle.Free()
            want = [size * (size - 1) // 2] * block + [rank] * (size - 1) * block
            agree(comm, buf.tolist() == want, f"{algorithm}, block {block}: {buf} != {want}")


def test_mpi_wait_functions_take_mpicolls_requests(comm):
    """MPI.Request.Waitall / Testall / Waitany / Get_status on mpicoll.Comm's requests, mixed
    with MPI's; after completion they are REQUEST_NULL, as mpi4py's."""
    if progress.mode() != "thread":
        pytest.skip("MPI's own wait functions move mpicoll's requests only with the progress "
                    "thread (docs/buffers.md; MPICOLL_PROGRESS=caller: Request.Waitall ...)")
    size, rank = comm.Get_size(), comm.Get_rank()
    mc = mpicoll.Comm(comm)
    outs = [np.zeros(8) for _ in range(3)]
    requests = [mc.Iallreduce(np.full(8, rank + 1.0), outs[0]),
                mc.Ibcast(outs[1] if rank else np.arange(8.0), root=0),
                comm.Ibarrier(),
                mc.Iallgather(np.full(8 // size if 8 % size == 0 else 0, float(rank)),
                              np.zeros(8 if 8 % size == 0 else 0))]
    left = set(range(len(requests)))
    while left:
        index = MPI.Request.Waitany(requests)
        left.discard(index)
    agree(comm, not any(requests) and requests[0] == MPI.REQUEST_NULL)
    agree(comm, outs[0].tolist() == [size * (size + 1) / 2] * 8)
    agree(comm, (outs[1] if rank else np.arange(8.0)).tolist() == list(range(8)))
    requests = [mc.Iallreduce(MPI.IN_PLACE, outs[2]), comm.Ibarrier()]
    while not MPI.Request.Testall(requests):
        pass
    request = mc.Iallreduce(np.ones(4), np.zeros(4))
    status = MPI.Status()
    while not request.Get_status(status):
        pass
    agree(comm, bool(request) and status.Get_count(MPI.BYTE) == 0)
    agree(comm, request.Wait() is True and not request and request.Wait() is True)


def test_bcast_and_allgather_take_any_type_they_only_copy(comm):
    """LONG_DOUBLE, its complex, contiguous derived datatypes and ones with holes (indexed:
    MPI_Pack / MPI_Unpack around mpicoll's copy) in Bcast and Allgather, every form; a
    reduction of them is refused, and the message says why broadcasts differ."""
    size, rank = comm.Get_size(), comm.Get_rank()
    mc = mpicoll.Comm(comm)
    triple = MPI.INT.Create_contiguous(3).Commit()
    evens = MPI.DOUBLE.Create_indexed_block(1, [0, 2, 4, 6]).Commit()
    try:
        for algorithm in ["auto"] + list(COLLECTIVES["bcast"]):
            mc.algorithm = {"bcast": algorithm}
            for root in range(size):
                for make, datatype, count in (
                        (lambda v: np.array(v, np.longdouble), MPI.LONG_DOUBLE, 6),
                        (lambda v: np.array(v, np.clongdouble), MPI.C_LONG_DOUBLE_COMPLEX, 6),
                        (lambda v: np.array(v, np.intc), triple, 2),
                        (lambda v: np.array(v, np.float64), evens, 1)):
                    values = list(range(1, 7 if datatype != evens else 8))
                    for form in ("Bcast", "Ibcast", "Bcast_init"):
                        buf = make(values if rank == root else [-1] * len(values))
                        done = getattr(mc, form)([buf, count, datatype], root=root)
                        if form == "Ibcast":
                            done.Wait()
                        elif form == "Bcast_init":
                            done.Start()
                            done.Wait()
                            done.Free()
                        want = values if datatype != evens or rank == root else \
                            [v if i % 2 == 0 else -1 for i, v in enumerate(values)]
                        agree(comm, buf.tolist() == want,
                              f"{form} {datatype.Get_name()} root {root} {algorithm}: {buf}")
        for algorithm in ["auto"] + list(COLLECTIVES["allgather"]):
            mc.algorithm = {"allgather": algorithm}
            for make, datatype in ((lambda v: np.array(v, np.longdouble), MPI.LONG_DOUBLE),
                                   (lambda v: np.array(v, np.float64), evens)):
                mine = make([rank + 1.0] * 7)
                out = make([0.0] * 7 * size)
                spec = [out, 1, datatype] if datatype == evens else [out, 7, datatype]
                mc.Allgather([mine, 1, datatype] if datatype == evens else [mine, 7, datatype],
                             spec)
                want = [float(r + 1) for r in range(size) for _ in range(7)]
                if datatype == evens:   # each rank's 4 elements, at the datatype's extent (7)
                    want = [float(r + 1) if i % 2 == 0 else 0.0
                            for r in range(size) for i in range(7)]
                agree(comm, out.tolist() == want, f"allgather {datatype.Get_name()}: {out}")
        long = np.ones(4, np.longdouble)
        exc = raises_everywhere(comm, TypeError, mc.Allreduce, [long, MPI.LONG_DOUBLE],
                                [np.zeros(4, np.longdouble), MPI.LONG_DOUBLE],
                                match="is not one mpicoll reduces.*a broadcast or all-gather "
                                      "takes any type")
        agree(comm, isinstance(exc, mpicoll.comm.Unsupported))
    finally:
        triple.Free()
        evens.Free()


def test_fallback_hands_what_mpicoll_cannot_run_to_mpi(comm):
    """Comm(..., fallback=True): a long double reduction runs MPI's own Allreduce, counted."""
    size = comm.Get_size()
    mc = mpicoll.Comm(comm, fallback=True)
    out = np.zeros(4, np.longdouble)
    mc.Allreduce([np.ones(4, np.longdouble), MPI.LONG_DOUBLE], [out, MPI.LONG_DOUBLE])
    request = mc.Iallreduce(MPI.IN_PLACE, [out, MPI.LONG_DOUBLE])
    request.Wait()
    agree(comm, out.tolist() == [size * size] * 4 and mc.fallbacks == {"Allreduce": 1,
                                                                       "Iallreduce": 1})
    mc.Allreduce(np.ones(4), np.zeros(4))           # what mpicoll runs, it runs
    agree(comm, sum(mc.fallbacks.values()) == 2)


def test_an_algorithm_name_applies_where_it_exists(comm):
    """``comm.algorithm = "recursive_doubling"`` (the guide's): all-reduce and all-gather run
    it, reduce-scatter and broadcast (which have none) run auto."""
    size, rank = comm.Get_size(), comm.Get_rank()
    mc = mpicoll.Comm(comm)
    mc.algorithm = "recursive_doubling"
    buf = np.full(size, rank, "i")
    mc.Reduce_scatter_block(MPI.IN_PLACE, [buf, MPI.INT])
    data = np.arange(5.0) if rank == 0 else np.zeros(5)
    mc.Bcast(data, root=0)
    out = np.zeros(size)
    mc.Allgather(np.array([float(rank)]), out)
    agree(comm, buf[0] == size * (size - 1) // 2 and data.tolist() == list(range(5))
          and out.tolist() == list(range(size)))
