"""What the reliability options cost: microseconds per all-reduce, with and without a deadline.

    python jobs/experiments/reliability_cost.py                   # N = 1
    mpiexec -n 2 python jobs/experiments/reliability_cost.py
    mpiexec -n 4 python jobs/experiments/reliability_cost.py --sizes 8,65536 --reps 21

For each executor (``compiled``, the default, and ``python``: ``MPICOLL_EXECUTOR``), algorithm
and message size it times batches of ``--iters`` calls in each mode --

* ``off``: ``MPICOLL_TIMEOUT=0`` (no deadline: blocking waits),
* ``deadline``: ``MPICOLL_TIMEOUT`` unset, so the default deadline (600 s): every wait polled
  under it (the arguments' hash is in the tags in every mode),
* ``validate``: ``MPICOLL_VALIDATE=1`` with the default deadline (the agreement step too),

-- the modes and executors taking turns batch by batch (so a loaded machine slows them alike),
``--reps`` batches each, a barrier before each batch, rank 0's clock. It prints each mode's
median batch mean per call and its extra cost over ``off`` (in % for ``deadline``).
docs/reliability.md quotes its output.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from mpi4py import MPI

import mpicoll
from mpicoll import settings

MODES = {                          # the environment of each mode (read again between batches)
    "off": {"MPICOLL_TIMEOUT": "0", "MPICOLL_VALIDATE": None},
    "deadline": {"MPICOLL_TIMEOUT": None, "MPICOLL_VALIDATE": None},
    "validate": {"MPICOLL_TIMEOUT": None, "MPICOLL_VALIDATE": "1"},
}


def use(executor: str, mode: dict) -> None:
    """Make the next calls run on ``executor`` (``MPICOLL_EXECUTOR``) in ``mode``: the
    environment is set and read again (``settings.reload``), so the calls themselves are the
    same plain ``allreduce(x, out, algorithm=..., comm=...)`` in every mode."""
    wanted = dict(mode, MPICOLL_EXECUTOR=executor)
    if any(os.environ.get(k) != v for k, v in wanted.items()):
        for name, value in wanted.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        settings.reload()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--executors", default="compiled,python")
    parser.add_argument("--algorithms", default="ring,recursive_doubling,mpi")
    parser.add_argument("--sizes", default="8,65536", help="message sizes in bytes")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--iters", type=int, default=200, help="calls per batch")
    parser.add_argument("--reps", type=int, default=15, help="batches per mode")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall: time.perf_counter; cpu: time.process_time of rank 0 "
                        "(at N = 1, where nothing waits, it ignores other processes' load)")
    args = parser.parse_args(argv)
    modes = {m: MODES[m] for m in args.modes.split(",")}
    comm = MPI.COMM_WORLD.Dup()
    rank, size = comm.Get_rank(), comm.Get_size()
    executors = args.executors.split(",")
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    if rank == 0:
        print(f"# N={size}, {MPI.Get_library_version().splitlines()[0].strip()}, "
              f"MPICOLL_TIMEOUT={settings.get('MPICOLL_TIMEOUT')}")
        print(f"# median of {args.reps} batches of {args.iters} calls, modes and executors "
              f"interleaved; microseconds per call ({args.clock} clock); load average "
              f"{os.getloadavg()[0]:.1f}")
        print(f"{'executor':<9} {'algorithm':<19} {'bytes':>6} "
              + " ".join(f"{m:>9}" for m in modes) + "   extra: "
              + " ".join(f"{m:>9}" for m in list(modes)[1:]))
    for algorithm in args.algorithms.split(","):
        for nbytes in map(int, args.sizes.split(",")):
            x = np.ones(max(nbytes // 8, 1))
            out = np.empty_like(x)
            times = {(e, m): [] for e in executors for m in modes}
            for executor in executors:                      # warm up every path
                for mode in modes.values():
                    use(executor, mode)
                    for _ in range(20):
                        mpicoll.allreduce(x, out, algorithm=algorithm, comm=comm)
            for _ in range(args.reps):
                for executor in executors:
                    for mode, env in modes.items():
                        use(executor, env)
                        mpicoll.allreduce(x, out, algorithm=algorithm, comm=comm)  # re-read
                        comm.Barrier()
                        t0 = clock()
                        for _ in range(args.iters):
                            mpicoll.allreduce(x, out, algorithm=algorithm, comm=comm)
                        times[executor, mode].append((clock() - t0) / args.iters)
            if rank == 0:
                for executor in executors:
                    us = {m: float(np.median(times[executor, m])) * 1e6 for m in modes}
                    extra = []
                    for m in list(modes)[1:]:
                        d = us[m] - us["off"]
                        extra.append(f"{100 * d / us['off']:>+8.1f}%" if m == "deadline"
                                     else f"{d:>+9.1f}")
                    print(f"{executor:<9} {algorithm:<19} {x.nbytes:>6} "
                          + " ".join(f"{us[m]:>9.2f}" for m in modes) + "   extra: "
                          + " ".join(extra), flush=True)
    comm.Free()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
