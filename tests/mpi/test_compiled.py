"""The compiled executor under MPI: the Python executor's bits and byte counts, and timeouts."""

import time

import numpy as np
import pytest
from mpi4py import MPI

import mpicoll
from mpicoll._runtime.context import state
from mpicoll.executors import compiled
from mpicoll import kernels
from mpicoll.registry import COLLECTIVES
from mpicoll.testing import agree, environment

pytestmark = [pytest.mark.mpi, pytest.mark.max_ranks(5),
              pytest.mark.skipif(compiled.available() is not None,
                                 reason=f"compiled executor unavailable: {compiled.available()}")]

# the first four dtypes and ops; tests/mpi/test_dtypes.py covers the others
DTYPES, OPS = kernels.DTYPES[:4], kernels.OPS[:4]
ALGORITHMS = [(c, a) for c, table in COLLECTIVES.items() for a, algo in table.items()
              if algo.scheduled]


def awkward_input(rank: int, n: int, dtype, op: str) -> np.ndarray:
    """Values whose reduction bits depend on the order: random floats, +-0.0, NaNs with
    different payloads, infinities; random integers (overflowing, for sum and prod)."""
    rng = np.random.default_rng([rank, n, DTYPES.index(np.dtype(dtype)), OPS.index(op)])
    if np.dtype(dtype).kind == "f":
        x = rng.standard_normal(n).astype(dtype)
        special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan], dtype)
        pick = rng.integers(0, 10, n)
        x[pick < len(special)] = special[pick[pick < len(special)]]
        payload = x.view(np.uint32 if x.itemsize == 4 else np.uint64)
        payload[np.isnan(x)] |= rank + 1            # each rank's NaNs carry its own payload
        return x
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)


def run(collective: str, algorithm: str, x: np.ndarray, op: str, comm) -> np.ndarray:
    if collective == "allreduce":
        return mpicoll.allreduce(x, op=op, algorithm=algorithm, comm=comm)
    if collective == "reduce_scatter_block":
        return mpicoll.reduce_scatter_block(x, op=op, algorithm=algorithm, comm=comm)
    if collective == "allgather":
        return mpicoll.allgather(x, algorithm=algorithm, comm=comm)
    buf = x.copy()
    return mpicoll.bcast(buf, root=comm.size - 1, algorithm=algorithm, comm=comm)


@pytest.mark.parametrize("collective,algorithm", ALGORITHMS)
def test_compiled_gives_the_python_executors_bits(comm, collective, algorithm):
    """Same inputs, both executors: identical bits, identical byte counters."""
    problems = []
    traffic = state(comm).traffic
    ops = OPS if collective in ("allreduce", "reduce_scatter_block") else ("sum",)
    for n in (1, comm.size + 1, 1000):
        count = n * comm.size if collective == "reduce_scatter_block" else n
        for dtype in DTYPES:
            for op in ops:
                x = awkward_input(comm.rank, count, dtype, op)
                results, counts = {}, {}
                for executor in ("python", "compiled"):
                    with environment(MPICOLL_EXECUTOR=executor):
                        before = dict(traffic)
                        with np.errstate(over="ignore"):
                            results[executor] = run(collective, algorithm, x, op, comm)
                        counts[executor] = {k: traffic[k] - before[k] for k in traffic}
                if results["python"].tobytes() != results["compiled"].tobytes():
                    problems.append(f"n={count} {dtype} {op}: different bits")
                if counts["python"] != counts["compiled"]:
                    problems.append(f"n={count} {dtype} {op}: byte counters {counts}")
    agree(comm, not problems, problems[:5])


REDUCING = [(c, a) for c, a in ALGORITHMS if c in ("allreduce", "reduce_scatter_block")]


@pytest.mark.parametrize("collective,algorithm", REDUCING)
@pytest.mark.parametrize("segment", ["0", "24"])
def test_out_of_place_reads_the_input_as_the_copy_in_would(comm, collective, algorithm,
                                                           segment):
    """Out of place the compiled loop reads sendbuf where no step wrote yet, instead of a copy
    of it (``Schedule.first_touch``): the bits of the in-place call and of the Python executor
    (which copies the input in), with recvbuf full of NaNs before the call, sendbuf untouched;
    by the full path, the cached one (the same call again), the polled one (timeout=) and a
    persistent handle; unsegmented and in segments of 24 B."""
    problems = []
    for n in (1, comm.size + 1, 1000):
        count = n * comm.size if collective == "reduce_scatter_block" else n
        for dtype, op in ((np.float64, "sum"), (np.float32, "max")):
            x = awkward_input(comm.rank, count, dtype, op)
            kept = x.copy()
            call = (mpicoll.allreduce if collective == "allreduce" else
                    mpicoll.reduce_scatter_block)
            results = {}
            for how in ("python", "full", "cached", "polled", "persistent", "in place"):
                recv = np.full(count if collective == "allreduce" else n, np.nan, dtype)
                kw = {"timeout": 60.0} if how == "polled" else {}
                with environment(MPICOLL_EXECUTOR="python" if how == "python" else "compiled",
                                 MPICOLL_SEGMENT_BYTES=segment):
                    if how == "in place":
                        whole = x.copy()
                        call(MPI.IN_PLACE, whole, op=op, algorithm=algorithm, comm=comm)
                        results[how] = whole[:recv.size]
                    elif how == "persistent":       # run twice, the second in the engine
                        init = (mpicoll.allreduce_init if collective == "allreduce" else
                                mpicoll.reduce_scatter_block_init)
                        h = init(x, recv, op=op, algorithm=algorithm, comm=comm)
                        h()
                        recv[:] = np.nan
                        h.start()
                        results[how] = h.wait()
                        h.free()
                    else:
                        call(x, recv, op=op, algorithm=algorithm, comm=comm, **kw)
                        results[how] = recv
                if x.tobytes() != kept.tobytes():
                    problems.append(f"n={count} {dtype.__name__} {op} {how}: sendbuf changed")
            for how, got in results.items():
                if got.tobytes() != results["python"].tobytes():
                    problems.append(f"n={count} {dtype.__name__} {op}: {how} differs from the "
                                    "Python executor")
    agree(comm, not problems, problems[:5])


def test_compiled_with_a_timeout_gives_the_same_bits(comm):
    """The polled path (timeout=) gives the blocking path's bits."""
    x = awkward_input(comm.rank, 4099, np.float64, "sum")
    with environment(MPICOLL_EXECUTOR="compiled"):
        plain = mpicoll.allreduce(x, algorithm="ring", comm=comm)
        polled = mpicoll.allreduce(x, algorithm="ring", comm=comm, timeout=60.0)
    agree(comm, plain.tobytes() == polled.tobytes(), "the polled call differs")


@pytest.mark.skipif(MPI.COMM_WORLD.Get_size() not in (2, 3), reason="runs at N = 2 and 3")
@pytest.mark.parametrize("algorithm", ["ring", "recursive_doubling"])
def test_compiled_timeout_names_the_missing_rank(comm, algorithm):
    """Rank 0 stays away: every other rank raises CollectiveTimeout naming rank 0, after about
    the timeout, and the communicator is then refused."""
    x = np.ones(8)
    with environment(MPICOLL_EXECUTOR="compiled"):
        mpicoll.allreduce(x, algorithm=algorithm, comm=comm)      # creates mpicoll's state
        outcome = "stayed away"
        if comm.rank != 0:
            start = time.monotonic()
            try:
                mpicoll.allreduce(x, algorithm=algorithm, comm=comm, timeout=1.0)
                outcome = "returned"
            except mpicoll.CollectiveTimeout as exc:
                took = time.monotonic() - start
                outcome = "ok" if exc.peers == [0] and 0.9 < took < 5 else \
                    f"peers {exc.peers} after {took:.2f} s: {exc}"
            try:
                mpicoll.allreduce(x, algorithm=algorithm, comm=comm)
                outcome += "; the next call ran"
            except mpicoll.CommunicatorBroken:
                pass
        comm.Barrier()
    agree(comm, outcome in ("ok", "stayed away"), outcome)
