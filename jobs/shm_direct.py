"""``shm`` with and without mpicoll's per-call layer, against MPI and the schedules.

    mpiexec -n 2 python jobs/shm_direct.py                 # 8 B, 2000 calls each
    mpiexec -n 2 python jobs/shm_direct.py --bytes 65536

Times, call by call and taking turns, MPI's own ``comm.Allreduce``, the plain
``mpicoll.allreduce`` with ``ring``, ``recursive_doubling`` and ``shm``, and ``shm``'s core
called directly (``allreduce_shm.allreduce``: no argument checks, no algorithm lookup), on
``COMM_WORLD``. Rank 0 prints the median of each in microseconds. The gap between ``shm`` and
``shm direct`` is the plain call's Python layer (docs/performance.md).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

import mpicoll
from mpicoll._runtime.context import state
from mpicoll.algorithms import allreduce_shm


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bytes", type=int, default=8, help="float32 bytes (default 8)")
    ap.add_argument("--calls", type=int, default=2000, help="calls of each form")
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    st = state(comm)
    x = np.ones(max(1, args.bytes // 4), np.float32)
    y = np.empty_like(x)
    forms = {
        "mpi": lambda: comm.Allreduce(x, y),
        "ring": lambda: mpicoll.allreduce(x, y, algorithm="ring"),
        "recursive_doubling": lambda: mpicoll.allreduce(x, y, algorithm="recursive_doubling"),
        "shm": lambda: mpicoll.allreduce(x, y, algorithm="shm"),
        "shm direct": lambda: allreduce_shm.allreduce(st, x, y, "sum"),
    }
    for form in forms.values():          # warm-up: windows, kernels, schedules
        form()
    times = {name: [] for name in forms}
    for _ in range(args.calls):
        for name, form in forms.items():
            start = time.perf_counter()
            form()
            times[name].append(time.perf_counter() - start)
    if comm.Get_rank() == 0:
        print(f"# {comm.Get_size()} ranks, {x.nbytes} B, median us per call of {args.calls}")
        for name, t in times.items():
            print(f"{name:>20} {np.median(t) * 1e6:8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
