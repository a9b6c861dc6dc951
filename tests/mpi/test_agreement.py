"""Every option is in the agreement: ``Buckets`` whose ranks differ in ``average``, in
``bucket_bytes`` (other buckets), in ``reproducible``, ``compress`` or ``error_feedback``, and a
plain all-reduce whose ranks differ in ``average``, raise ``ArgumentMismatch`` on every rank
within ``FAST`` seconds with the default settings (no ``validate``, the default deadline): the
options are fields of the signature hashed into the messages' tags, found while the ranks wait.
A step that failed inside ``ready()`` leaves the ``Buckets`` usable."""

import time

import numpy as np
import pytest
from mpi4py import MPI

import mpicoll
from mpicoll.testing import agree

pytestmark = [pytest.mark.mpi, pytest.mark.rank_counts(2, 3)]

FAST = 10.0     # seconds, as test_reliability's: found while waiting, not at the deadline (600 s);
                # the 2 s the issue asks is timed by jobs/experiments/fault_matrix.py, this bound
                # leaves room for a CI machine at load 10+


def _outcome(fn):
    start = time.monotonic()
    try:
        fn()
        got = None
    except Exception as exc:        # noqa: BLE001 - checked on every rank
        got = exc
    return got, time.monotonic() - start


def _warm(comm, **options):
    """A matched step first: a fresh process's first calls load kernels and learn the node
    layout, which is not what FAST bounds."""
    b = mpicoll.Buckets([np.ones(3, np.float32), np.ones(2, np.float32)], comm=comm,
                        **options)
    b.ready(1)
    b.ready(0)
    b.wait()


def _step(comm, arrays, **options):
    """One Buckets made with ``options`` and one step over ``arrays``: the outcome of the step
    (the constructor must not fail) and the seconds it took."""
    b = mpicoll.Buckets(arrays, comm=comm, **options)
    def step():
        for i in reversed(range(len(arrays))):
            b.ready(i)
        b.wait()
    return _outcome(step)


def _mismatch_everywhere(comm, got, elapsed, field):
    ok = isinstance(got, mpicoll.ArgumentMismatch) and field in str(got) and elapsed < FAST
    agree(comm, ok, f"{type(got).__name__}: {got} after {elapsed:.2f} s")


@pytest.mark.parametrize("algorithm", ["auto", "shm"])
@pytest.mark.parametrize("odd", [0, -1])
def test_buckets_average_on_some_ranks(comm, odd, algorithm):
    """average=True on one rank only (it used to give 2.0 there and 6.0 elsewhere); also
    through shm's window, where the signature's hash goes beside each rank's values."""
    _warm(comm, algorithm=algorithm)
    got, elapsed = _step(comm, [np.full(3, comm.rank + 1.0)], algorithm=algorithm,
                         average=comm.rank == odd % comm.size)
    _mismatch_everywhere(comm, got, elapsed, "average")


@pytest.mark.parametrize("algorithm", ["auto", "shm"])
def test_buckets_bucket_bytes_that_cut_other_buckets(comm, algorithm):
    """Rank 0 cuts three buckets, the others one (rank 0's requests used to complete with
    garbage, then the others waited for the deadline, or a raw ValueError from mmap)."""
    _warm(comm, algorithm=algorithm)
    arrays = [np.full(1, comm.rank + 1.0) for _ in range(3)]
    got, elapsed = _step(comm, arrays, algorithm=algorithm,
                         bucket_bytes=8 if comm.rank == 0 else 1 << 20)
    _mismatch_everywhere(comm, got, elapsed, "group")


def test_buckets_reproducible_on_some_ranks(comm):
    """reproducible=True on rank 0 only (it used to wait for the deadline)."""
    _warm(comm)
    _warm(comm, reproducible=True)
    got, elapsed = _step(comm, [np.full(3, comm.rank + 1.0)], average=False,
                         reproducible=comm.rank == 0)
    _mismatch_everywhere(comm, got, elapsed, "reproducible")


def test_buckets_large_reproducible_average_on_some_ranks(comm):
    """reproducible=True with large buckets (auto: shm's window on one node, the exchange
    across nodes), average on rank 0 only: the window's hash is the step's call's."""
    _warm(comm, reproducible=True)
    got, elapsed = _step(comm, [np.full(100_000, comm.rank + 1.0)], reproducible=True,
                         average=comm.rank == 0)
    _mismatch_everywhere(comm, got, elapsed, "average")


@pytest.mark.parametrize("options, field", [
    (lambda rank: {"compress": "bf16" if rank == 0 else None}, "compress"),
    (lambda rank: {"compress": "bf16", "error_feedback": rank == 0}, "feedback"),
])
def test_buckets_compression_on_some_ranks(comm, options, field):
    """compress, or error feedback, on rank 0 only: what it sends differs."""
    _warm(comm, compress="bf16")
    got, elapsed = _step(comm, [np.full(300, comm.rank + 1.0, np.float32)],
                         **options(comm.rank))
    _mismatch_everywhere(comm, got, elapsed, field)


@pytest.mark.parametrize("form", ["allreduce", "iallreduce"])
def test_allreduce_average_on_some_ranks(comm, form):
    """The plain call's average=True (torch's AVG) on rank 0 only."""
    mpicoll.allreduce(np.ones(3), comm=comm)

    def call():
        out = getattr(mpicoll, form)(np.full(3, comm.rank + 1.0), comm=comm,
                                     average=comm.rank == 0)
        if form == "iallreduce":
            out.wait()
    got, elapsed = _outcome(call)
    _mismatch_everywhere(comm, got, elapsed, "average")


def test_average_divides_the_sum(comm):
    """average=True: the sum over the ranks divided by their number, in every form."""
    size = comm.size
    x = np.full(5, comm.rank + 1.0)
    want = np.full(5, (size + 1) / 2)
    b = mpicoll.Buckets([x.copy()], comm=comm)
    b.ready(0)
    b.wait()
    got = [mpicoll.allreduce(x, comm=comm, average=True),
           mpicoll.iallreduce(x, comm=comm, average=True).wait(),
           mpicoll.allreduce(x, comm=comm, average=True, algorithm="ring"),
           mpicoll.allreduce(x, comm=comm, average=True, algorithm="mpi"),
           mpicoll.reduce_scatter_block(np.tile(x, size), comm=comm, average=True),
           b._arrays[0]]
    agree(comm, all(np.array_equal(g, want) for g in got), [g.tolist() for g in got])


def test_a_step_that_failed_in_ready_leaves_buckets_usable(comm):
    """validate=True, average on rank 0 only: ready() raises ArgumentMismatch on every rank
    (before any message); the next step raises it again -- not "array 0 was already marked
    ready" -- and a Buckets whose options agree then runs on the same communicator."""
    mine = mpicoll.Buckets([np.full(3, comm.rank + 1.0)], comm=comm, validate=True,
                           average=comm.rank == 0)
    outcomes = [_outcome(lambda: mine.ready(0)) for _ in range(2)]
    ok = all(isinstance(got, mpicoll.ArgumentMismatch) and "average" in str(got)
             for got, _ in outcomes)
    agree(comm, ok, [f"{type(got).__name__}: {got}" for got, _ in outcomes])
    x = [np.full(3, comm.rank + 1.0)]
    b = mpicoll.Buckets(x, comm=comm, validate=True)
    b.ready(0)
    b.wait()
    agree(comm, np.array_equal(x[0], np.full(3, (comm.size + 1) / 2)), x[0].tolist())


def test_a_step_after_a_mismatch_raises_communicator_broken(comm):
    """Without validate the mismatch is found in flight (the communicator is broken): the
    next step raises CommunicatorBroken on every rank, not a ValueError of the Buckets."""
    _warm(comm)
    b = mpicoll.Buckets([np.full(3, comm.rank + 1.0)], comm=comm, average=comm.rank == 0)
    first, _ = _outcome(lambda: (b.ready(0), b.wait()))
    second, _ = _outcome(lambda: (b.ready(0), b.wait()))
    ok = isinstance(first, mpicoll.ArgumentMismatch) and isinstance(
        second, mpicoll.CommunicatorBroken)
    agree(comm, ok, f"{type(first).__name__}: {first}; then {type(second).__name__}: {second}")
