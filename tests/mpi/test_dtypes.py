"""Every dtype and op under MPI, both executors, with tests/mpi/dtype_matrix.py's checks: integers and
bools exact against numpy, floats bitwise the in-process executor's, the same bits on every
rank, and every refusal raised on every rank. Each dtype runs each of its ops under one
algorithm in turn (and ``mpi``), so every algorithm meets new types and ops; the script runs
the full matrix (``mpiexec -n N python -m mpi4py tests/mpi/dtype_matrix.py``)."""


import numpy as np
import pytest

import mpicoll
from mpicoll import kernels
from mpicoll._runtime.context import state
from mpicoll.registry import ALLREDUCE
from mpicoll.testing import agree, environment

import dtype_matrix  # tests/mpi/dtype_matrix.py

pytestmark = [pytest.mark.mpi, pytest.mark.rank_counts(1, 2, 4)]
OWN = [a for a in mpicoll.ALGORITHMS if ALLREDUCE[a].scheduled]     # shm: tests/mpi/test_shm.py


@pytest.mark.parametrize("executor", ["compiled", "python"])
@pytest.mark.parametrize("dtype", kernels.DTYPES[4:] + (np.dtype(np.int32),), ids=str)
def test_every_op_of_a_dtype(comm, dtype, executor):
    nodes = state(comm).nodes()
    problems = []
    offset = kernels.DTYPES.index(dtype)
    counts = (1, comm.size + 1, 257)     # the last uneven and long enough for the vector loops
    with environment(MPICOLL_EXECUTOR=executor):
        for i, op in enumerate(kernels.ops_for(dtype)):
            algorithms = [OWN[(offset + i) % len(OWN)]]
            if mpicoll.ops.library_has(dtype):
                algorithms.append("mpi")
            for algorithm in algorithms:
                problems += dtype_matrix.check_pair(comm, dtype, op, algorithm,
                                                    counts, 3, nodes)
    agree(comm, not problems, problems[:5])


def test_refusals_on_every_rank(comm):
    problems = dtype_matrix.check_refusals(comm, ["ring", "auto", "mpi"])
    agree(comm, not problems, problems[:5])


@pytest.mark.parametrize("executor", ["compiled", "python"])
def test_persistent_and_nonblocking_give_the_blocking_bits(comm, executor):
    """allreduce_init (the compiled executor's Bound), iallreduce (the progress executor) and
    the other collectives' persistent forms on the new types: the blocking call's bits."""
    problems = []
    with environment(MPICOLL_EXECUTOR=executor):
        for dtype in (kernels.bfloat16, np.dtype(np.float16), np.dtype(np.bool_),
                      np.dtype(np.complex64), np.dtype(np.int8), np.dtype(np.uint64)):
            for op in kernels.ops_for(dtype)[-2:]:
                for algorithm in ("ring", "recursive_doubling"):
                    n = 3 * comm.size + 1
                    x = dtype_matrix.float_input(comm.rank, n, dtype, 5) if dtype.kind in "fcV" \
                        else dtype_matrix.int_input(comm.rank, n, dtype, 5)
                    want = mpicoll.allreduce(x, op=op, algorithm=algorithm, comm=comm)
                    out = np.empty_like(x)
                    mpicoll.allreduce_init(x, out, op=op, algorithm=algorithm, comm=comm)()
                    got = mpicoll.iallreduce(x, op=op, algorithm=algorithm, comm=comm).wait()
                    label = f"{dtype} {op} {algorithm}"
                    if out.tobytes() != want.tobytes():
                        problems.append(f"{label}: allreduce_init differs")
                    if got.tobytes() != want.tobytes():
                        problems.append(f"{label}: iallreduce differs")
            y = dtype_matrix.int_input(comm.rank, 4, np.dtype(np.uint16), 6).view(dtype) \
                if dtype.itemsize == 2 else np.zeros(4, dtype)
            gathered = mpicoll.allgather(y, comm=comm, algorithm="ring")
            persistent = np.empty_like(gathered)
            mpicoll.allgather_init(y, persistent, comm=comm, algorithm="mpi")()
            if persistent.tobytes() != gathered.tobytes():
                problems.append(f"{dtype}: allgather_init with mpi differs from ring")
    agree(comm, not problems, problems[:5])
