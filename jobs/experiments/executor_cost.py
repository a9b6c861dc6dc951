"""The compiled executor against the Python one, each with and without a timeout (polling).

    mpiexec -n 2 python jobs/experiments/executor_cost.py
    mpiexec -n 2 python jobs/experiments/executor_cost.py --sizes 8,65536,1048576 --calls 400

For each algorithm and size, four modes take turns call by call, in a fresh random order each
round (the same on every rank): ``compiled`` and ``python`` (``MPICOLL_EXECUTOR``), each plain
(``timeout=math.inf``: no deadline) and with ``timeout=60`` (as the default deadline) -- the compiled loop then polls ``MPI_Testall`` against an
``MPI_Wtime`` deadline instead of blocking in ``MPI_Waitall``. Every call sits between
barriers; a call's time is the slowest rank's. It prints the median per mode in microseconds
and the polling cost, ``timeout / plain - 1``, per executor. Medians of single calls taken
turn by turn keep a loaded machine's drift out of the comparison, not its noise.
"""

from __future__ import annotations

import argparse
import math
import os

import numpy as np
from mpi4py import MPI

import mpicoll
from mpicoll import settings

# plain: timeout=math.inf (no deadline; the default has one, MPICOLL_TIMEOUT's 600 s)
MODES = (("compiled", math.inf), ("compiled", 60.0), ("python", math.inf), ("python", 60.0))


def use(executor: str) -> None:
    os.environ["MPICOLL_EXECUTOR"] = executor
    settings.reload()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--algorithms", default="recursive_doubling,ring")
    ap.add_argument("--sizes", default="8,1024,65536,1048576", help="message sizes in bytes")
    ap.add_argument("--calls", type=int, default=300, help="timed calls per mode")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD.Dup()
    rank, size = comm.Get_rank(), comm.Get_size()
    if rank == 0:
        print(f"# N={size}, {MPI.Get_library_version().splitlines()[0].strip()}; "
              f"median of {args.calls} calls per mode, modes interleaved call by call")
        print(f"{'algorithm':<20} {'bytes':>8} | {'compiled':>9} {'+timeout':>9} | "
              f"{'python':>9} {'+timeout':>9} | {'poll cost c':>11} {'poll cost py':>12} "
              f"{'py/compiled':>11}")
    rng = np.random.default_rng(args.seed)
    for algorithm in args.algorithms.split(","):
        for nbytes in map(int, args.sizes.split(",")):
            x = np.ones(max(nbytes // 4, 1), np.float32)
            out = np.empty_like(x)
            times = {m: np.zeros(args.calls) for m in MODES}
            for executor, timeout in MODES:                 # warm up every path
                use(executor)
                for _ in range(10):
                    mpicoll.allreduce(x, out, algorithm=algorithm, comm=comm, timeout=timeout)
            for i in range(args.calls):
                for k in rng.permutation(len(MODES)):
                    executor, timeout = MODES[k]
                    use(executor)
                    comm.Barrier()
                    t0 = MPI.Wtime()
                    mpicoll.allreduce(x, out, algorithm=algorithm, comm=comm, timeout=timeout)
                    times[MODES[k]][i] = MPI.Wtime() - t0
            for m in MODES:
                comm.Allreduce(MPI.IN_PLACE, times[m], op=MPI.MAX)
            if rank == 0:
                med = {m: float(np.median(times[m])) * 1e6 for m in MODES}
                c, ct, p, pt = (med[m] for m in MODES)
                print(f"{algorithm:<20} {x.nbytes:>8} | {c:>9.1f} {ct:>9.1f} | {p:>9.1f} "
                      f"{pt:>9.1f} | {ct / c - 1:>+11.1%} {pt / p - 1:>+12.1%} {p / c:>11.2f}",
                      flush=True)
    os.environ.pop("MPICOLL_EXECUTOR", None)
    settings.reload()
    comm.Free()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
