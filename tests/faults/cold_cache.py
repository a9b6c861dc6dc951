"""Every rank starts on an empty numba cache at once: run by tests/jobs/test_faults.py.

    NUMBA_CACHE_DIR=$(mktemp -d) mpiexec -n 8 python tests/faults/cold_cache.py --out DIR

Each rank checks two ops of a float and an integer dtype with a few all-reduce algorithms
against MPI_Allreduce (exact inputs, so the bits must match): four kernels and two executor
loops that all ranks compile and cache at the same moment (every op and dtype would take a
minute at 8 ranks on two cores, and race the same way). It writes ``{"rank", "checked", "wrong"}`` to
``DIR/rank<r>.jsonl``.
"""

import argparse
import json
import os

import numpy as np
from mpi4py import MPI

import mpicoll
from mpicoll.testing import exact_input

MPI_OP = {"sum": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN}
DTYPES, OPS = (np.dtype(np.float64), np.dtype(np.int32)), ("sum", "max")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    checked, wrong = 0, []
    for algorithm in ("ring", "recursive_doubling", "binomial"):
        for dtype in DTYPES:
            for op in OPS:
                x = exact_input(comm.rank, 1001, dtype, op)
                ref = np.empty_like(x)
                comm.Allreduce(x, ref, op=MPI_OP[op])
                out = mpicoll.allreduce(x, op=op, algorithm=algorithm, timeout=120)
                checked += 1
                if out.tobytes() != ref.tobytes():
                    wrong.append(f"{algorithm} {dtype} {op}")
    with open(os.path.join(args.out, f"rank{comm.rank}.jsonl"), "w") as f:
        f.write(json.dumps({"rank": comm.rank, "checked": checked, "wrong": wrong}) + "\n")


if __name__ == "__main__":
    main()
