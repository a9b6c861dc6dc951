"""Every dtype and op under MPI, both executors, with jobs/dtype_matrix.py's checks: integers and
bools exact against numpy, floats bitwise the in-process executor's, the same bits on every
rank, and every refusal raised on every rank. Each dtype runs each of its ops under one
algorithm in turn (and ``mpi``), so every algorithm meets new types and ops; the script runs
the full matrix (``mpiexec -n N python -m mpi4py jobs/dtype_matrix.py``)."""

import sys
from pathlib import Path

import numpy as np
import pytest

import mpicoll
from mpicoll import kernels
from mpicoll._runtime.context import state
from mpicoll.testing import agree, environment

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "jobs"))
import dtype_matrix  # noqa: E402

pytestmark = pytest.mark.mpi
OWN = [a for a in mpicoll.ALGORITHMS if a != "mpi"]


@pytest.mark.parametrize("executor", ["compiled", "python"])
@pytest.mark.parametrize("dtype", kernels.DTYPES[4:] + (np.dtype(np.int32),), ids=str)
def test_every_op_of_a_dtype(comm, dtype, executor):
    nodes = state(comm).nodes()
    problems = []
    offset = kernels.DTYPES.index(dtype)
    with environment(MPICOLL_EXECUTOR=executor):
        for i, op in enumerate(kernels.ops_for(dtype)):
            algorithms = [OWN[(offset + i) % len(OWN)]]
            if mpicoll.api._library_has(dtype):
                algorithms.append("mpi")
            for algorithm in algorithms:
                problems += dtype_matrix.check_pair(comm, dtype, op, algorithm,
                                                    (1, comm.size + 1, 257), 3, nodes)
    agree(comm, not problems, problems[:5])


def test_refusals_on_every_rank(comm):
    problems = dtype_matrix.check_refusals(comm, ["ring", "auto", "mpi"])
    agree(comm, not problems, problems[:5])
