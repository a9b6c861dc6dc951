"""``shm`` with and without mpicoll's per-call layer, against MPI, size by size.

    mpiexec -n 2 python tests/internals/shm_direct.py                       # 8 B .. 4 MiB, 300 calls each
    mpiexec -n 2 python tests/internals/shm_direct.py --sizes 65536 --calls 2000

Times, call by call and taking turns, MPI's own ``comm.Allreduce``, the plain
``mpicoll.allreduce(..., algorithm="shm")``, ``shm``'s core called directly
(``shm.window_allreduce``: no argument checks, no algorithm lookup) and one local
``np.copyto`` of the vector (a memory-bandwidth yardstick), on ``COMM_WORLD``, float32 sum. A
barrier precedes each timed collective, so every form starts with the ranks together. Rank 0
prints each form's median in microseconds. The gap between ``shm`` and ``shm direct`` is the
plain call's Python layer (docs/performance.md).

It calls ``shm``'s core with mpicoll's private per-communicator state, so it sits with the
tests, which may import them; jobs/ use the public API only.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

import mpicoll
from mpicoll._runtime.context import state  # (the private state shm's core takes)
from mpicoll import shm

SIZES = (8, 4096, 65536, 262144, 1 << 20, 4 << 20)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="comma list of bytes")
    ap.add_argument("--calls", type=int, default=300, help="calls of each form per size")
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    st = state(comm)
    if comm.Get_rank() == 0:
        print(f"# {comm.Get_size()} ranks, float32 sum, median us per call of {args.calls}")
        print(f"{'size(B)':>10} {'mpi':>9} {'shm':>9} {'shm direct':>11} {'one copy':>9} "
              f"{'mpi/shm':>8} {'mpi/direct':>10}")
    for nbytes in map(int, args.sizes.split(",")):
        x = np.ones(max(1, nbytes // 4), np.float32)
        y = np.empty_like(x)
        forms = {
            "mpi": lambda: comm.Allreduce(x, y),
            "shm": lambda: mpicoll.allreduce(x, y, algorithm="shm"),
            "direct": lambda: shm.window_allreduce(st, x, y, "sum"),
        }
        for form in forms.values():      # warm-up: the window, the compiled code
            form()
        times = {name: [] for name in list(forms) + ["copy"]}
        for _ in range(args.calls):
            for name, form in forms.items():
                comm.Barrier()
                start = time.perf_counter()
                form()
                times[name].append(time.perf_counter() - start)
            start = time.perf_counter()
            np.copyto(y, x)
            times["copy"].append(time.perf_counter() - start)
        if comm.Get_rank() == 0:
            med = {name: np.median(t) * 1e6 for name, t in times.items()}
            print(f"{x.nbytes:>10} {med['mpi']:9.1f} {med['shm']:9.1f} {med['direct']:11.1f} "
                  f"{med['copy']:9.1f} {med['mpi'] / med['shm']:8.2f} "
                  f"{med['mpi'] / med['direct']:10.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
