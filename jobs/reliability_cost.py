"""What the reliability options cost: microseconds per all-reduce, plain vs timeout vs validate.

    mpiexec -n 2 python jobs/reliability_cost.py
    mpiexec -n 4 python jobs/reliability_cost.py --sizes 8,65536 --iters 1000

For each algorithm and message size it times batches of calls in four modes -- plain,
``timeout=60`` (every wait polled under a deadline), ``validate=True`` (the agreement step),
and both -- interleaved, ``--reps`` times, and prints the best batch's mean per call (rank 0's
clock, a barrier before each batch) and each mode's extra cost over plain. docs/reliability.md
quotes its output.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

import mpicoll

MODES = {
    "plain": {},
    "timeout": {"timeout": 60.0},
    "validate": {"validate": True},
    "both": {"timeout": 60.0, "validate": True},
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithms", default="ring,recursive_doubling,mpi")
    parser.add_argument("--sizes", default="8,65536", help="message sizes in bytes")
    parser.add_argument("--iters", type=int, default=500, help="calls per batch")
    parser.add_argument("--reps", type=int, default=7, help="batches per mode")
    args = parser.parse_args(argv)
    comm = MPI.COMM_WORLD.Dup()
    rank, size = comm.Get_rank(), comm.Get_size()
    if rank == 0:
        print(f"# N={size}, {MPI.Get_library_version().splitlines()[0].strip()}")
        print(f"# best of {args.reps} batches of {args.iters} calls; microseconds per call")
        print(f"{'algorithm':<20} {'bytes':>8} " + " ".join(f"{m:>9}" for m in MODES)
              + "   extra: " + " ".join(f"{m:>9}" for m in list(MODES)[1:]))
    for algorithm in args.algorithms.split(","):
        for nbytes in map(int, args.sizes.split(",")):
            x = np.ones(max(nbytes // 8, 1))
            out = np.empty_like(x)
            best = {m: float("inf") for m in MODES}
            for mode, options in MODES.items():             # warm up every path
                for _ in range(20):
                    mpicoll.allreduce(x, out, algorithm=algorithm, comm=comm, **options)
            for _ in range(args.reps):
                for mode, options in MODES.items():
                    comm.Barrier()
                    t0 = time.perf_counter()
                    for _ in range(args.iters):
                        mpicoll.allreduce(x, out, algorithm=algorithm, comm=comm, **options)
                    best[mode] = min(best[mode], (time.perf_counter() - t0) / args.iters)
            if rank == 0:
                us = {m: best[m] * 1e6 for m in MODES}
                print(f"{algorithm:<20} {x.nbytes:>8} "
                      + " ".join(f"{us[m]:>9.1f}" for m in MODES) + "   extra: "
                      + " ".join(f"{us[m] - us['plain']:>+9.1f}" for m in list(MODES)[1:]),
                      flush=True)
    comm.Free()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
