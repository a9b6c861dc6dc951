"""Segmented, pipelined steps against unsegmented ones and MPI_Allreduce, interleaved.

    mpiexec -n 2 python -m mpi4py jobs/experiments/segmenting.py
    mpiexec -n 4 python -m mpi4py jobs/experiments/segmenting.py --sizes 4M,16M,64M --segments 0,model,1M

For each size, every algorithm runs under every segment setting -- ``0`` (no segmenting),
``model`` (the cost model's rule, ``MPICOLL_SEGMENT_BYTES`` unset) or a number of bytes -- as a
persistent handle (``mpicoll.allreduce_init``, made under that setting: it keeps its segmented
plan), and ``mpi`` is ``comm.Allreduce``. They take turns call by call, in a fresh random order
each round (the same on every rank); every call sits between barriers and a call's time is the
slowest rank's. It prints the median and the best call per form, the median's ratio to MPI's
median (> 1: faster than MPI), and the ratios of the same algorithm unsegmented to this form,
by median and by best call (> 1: segmenting helps; on a loaded machine the best call is the
one least disturbed by other processes), after checking that every
form gave the unsegmented form's bits; ``rounds`` is the most rounds of a step of rank 0 (1:
not pipelined).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

import mpicoll
from mpicoll.executors import segments
from mpicoll.registry import lookup
from mpicoll.testing import environment


def nbytes(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--algorithms", default="ring,recursive_halving")
    ap.add_argument("--sizes", default="4M,16M,64M", help="message sizes in bytes (K/M suffixes)")
    ap.add_argument("--segments", default="0,model",
                    help="segment settings: 0 (none), model, or bytes (K/M suffixes)")
    ap.add_argument("--calls", type=int, default=15, help="timed calls per form and size")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    algorithms = args.algorithms.split(",")
    settings_ = args.segments.split(",")
    rng = np.random.default_rng(args.seed)
    if rank == 0:
        print(f"# N={size}, float32 sum, {args.calls} calls per form, interleaved; "
              f"{MPI.Get_library_version().splitlines()[0].strip()}")
        print(f"{'size':>9} {'algorithm':>18} {'segment':>8} {'rounds':>6} {'median(us)':>11} "
              f"{'best(us)':>9} {'vs_mpi':>7} {'vs_unseg':>8} {'best_vs_unseg':>13}")
    for text in args.sizes.split(","):
        count = nbytes(text) // 4
        x = np.random.default_rng([rank, count]).integers(-8, 8, count).astype(np.float32)
        forms, outs = {}, {}
        for algorithm in algorithms:
            for setting in settings_:
                value = None if setting == "model" else str(nbytes(setting))
                out = np.empty_like(x)
                with environment(MPICOLL_SEGMENT_BYTES=value, MPICOLL_EXECUTOR="compiled"):
                    forms[algorithm, setting] = mpicoll.allreduce_init(
                        x, out, algorithm=algorithm, comm=comm)
                    sched = lookup("allreduce", algorithm).schedule(rank, size, count)
                    rounds = int(segments.plan(sched, 4).table[:, 6].max()) + 1
                outs[algorithm, setting] = (out, rounds)
        mpi_out = np.empty_like(x)
        forms["mpi", "-"] = lambda: comm.Allreduce(x, mpi_out)
        names = list(forms)
        for name in names:                      # warm up, and check the bits
            forms[name]()
        for algorithm in algorithms:
            ref = outs[algorithm, settings_[0]][0]
            for setting in settings_:
                if outs[algorithm, setting][0].tobytes() != ref.tobytes():
                    raise SystemExit(f"{algorithm} segment {setting}: different bits")
        times = {name: [] for name in names}
        for _ in range(args.calls):
            for k in rng.permutation(len(names)):
                comm.Barrier()
                t0 = time.perf_counter()
                forms[names[k]]()
                took = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
                times[names[k]].append(took)
        if rank == 0:
            mpi = np.median(times["mpi", "-"])
            for name in names:
                med = np.median(times[name])
                algorithm, setting = name
                best = min(times[name])
                unseg = times.get((algorithm, "0"))
                vs_unseg = f"{np.median(unseg) / med:8.2f}" if unseg else f"{'-':>8}"
                best_vs = f"{min(unseg) / best:13.2f}" if unseg else f"{'-':>13}"
                rounds = outs[name][1] if name in outs else "-"
                print(f"{text:>9} {algorithm:>18} {setting:>8} {rounds:>6} {med * 1e6:11.1f} "
                      f"{best * 1e6:9.1f} {mpi / med:7.2f} {vs_unseg} {best_vs}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
