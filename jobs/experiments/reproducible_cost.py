"""Where a reproducible all-reduce spends its time: each phase alone, then the whole calls.

    mpiexec -n 2 python jobs/experiments/reproducible_cost.py float32
    mpiexec -n 2 python jobs/experiments/reproducible_cost.py float64 --mib 64

Phases as ``mpicoll.reproducible.allreduce`` runs them with ``algorithm="auto"`` on one node:
the int8 codes, their MAX all-reduce, the slices, their SUM all-reduce in place, the rounding
of this rank's block, the all-gather of the floats; then the reproducible call, the plain
``auto`` call and ``MPI_Allreduce``. Each is called 5 times between barriers; it prints a
markdown table of the median wall time and the median CPU time (``time.process_time``) of the
slowest rank, the number least disturbed by other jobs on a shared machine
(docs/performance.md#reproducible-sums).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

import mpicoll
from mpicoll import reproducible as R


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dtype", choices=[str(d) for d in R.DTYPES])
    ap.add_argument("--mib", type=int, default=16, help="MiB per rank (default 16)")
    ap.add_argument("--calls", type=int, default=5)
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    dt = np.dtype(R.bfloat16 if args.dtype == "bfloat16" else args.dtype)
    n, k = (args.mib << 20) // dt.itemsize, R.DEFAULT_K[dt]
    x = np.random.default_rng(comm.rank).standard_normal(n).astype(dt)
    out = np.empty_like(x)

    def timed(name, f):
        wall, cpu = [], []
        for _ in range(args.calls):
            comm.Barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            result = f()
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        worst = comm.allreduce(float(np.median(cpu)), op=MPI.MAX)
        if comm.rank == 0:
            print(f"| {name} | {np.median(wall) * 1e3:.1f} | {worst * 1e3:.1f} |", flush=True)
        return result

    if comm.rank == 0:
        print(f"N={comm.size} {dt} {args.mib} MiB, K={k}\n"
              f"| phase | wall ms | CPU ms (slowest rank) |\n|---|---|---|")
    codes = timed("codes (int8)", lambda: R.codes(x))
    top = timed("MAX all-reduce of the codes", lambda: mpicoll.allreduce(codes, op=MPI.MAX))
    buf = np.empty(n * k + 1, np.int64)
    timed("slices", lambda: R.slices(x, top, k, out=buf[:n * k]))
    timed("SUM all-reduce of the slices (in place)",
          lambda: mpicoll.allreduce(MPI.IN_PLACE, buf))
    block = -(-n // comm.size)
    lo = min(comm.rank * block, n)
    hi = min(lo + block, n)
    floats = np.zeros(comm.size * block, dt)
    timed("rounding this rank's block",
          lambda: R.rounded(buf[lo * k:hi * k], top[lo:hi], k, dt, out=floats[lo:hi]))
    timed("all-gather of the floats", lambda: mpicoll.allgather(MPI.IN_PLACE, floats))
    timed("**reproducible all-reduce**",
          lambda: mpicoll.allreduce(x, out, reproducible=True))
    timed("**plain all-reduce (auto)**", lambda: mpicoll.allreduce(x, out))
    timed("**MPI_Allreduce**", lambda: comm.Allreduce(x, out))


if __name__ == "__main__":
    main()
