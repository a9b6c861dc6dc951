"""The reproducible all-reduce in every form, interleaved with the plain call, per size.

    mpiexec -n 2 python jobs/experiments/reproducible_forms.py float64 --mib 1 16 64 --calls 5
    mpiexec -n 2 python jobs/experiments/reproducible_forms.py float64 --json docs/results/F.json
    python jobs/experiments/reproducible_forms.py --table docs/results/F.json ...   # no MPI: the table

At each size the forms take turns in a fresh random order every round (the same order on
every rank), each call between barriers; a call's time is the slowest rank's. Forms: the plain
``auto`` all-reduce, ``MPI_Allreduce`` (mpi4py), ``allreduce(reproducible=True)`` (blocking),
``iallreduce(reproducible=True).wait()`` and ``allreduce_init(reproducible=True)`` run as
``h()`` (the ``reproducible.Job`` path: one call, the MAX and SUM plans under one tag). It
prints a markdown table of medians and each reproducible form's ratio to the plain call, with
the load average before and after (docs/performance.md#reproducible-sums). ``--json`` also
writes the medians, N, dtype and loads; ``--table`` prints one table from such files: per N,
dtype and size the medians in ms, the blocking call's time over the plain call's and over
``MPI_Allreduce``'s, and the other forms' over the plain call's.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
from mpi4py import MPI

import mpicoll
from mpicoll import reproducible as R


def table(paths) -> str:
    """The markdown table of the ``--json`` files ``paths``."""
    lines = ["| N | dtype | MiB | plain auto ms | MPI_Allreduce ms | reproducible ms | "
             "/ plain | / MPI | iallreduce / plain | allreduce_init h() / plain | "
             "load (start–end) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for path in paths:
        with open(path) as f:
            run = json.load(f)
        for mib, med in run["rows"]:
            plain, mpi, blocking = med["plain auto"], med["MPI_Allreduce"], med["blocking"]
            lines.append(
                f"| {run['size']} | {run['dtype']} | {mib} | {plain * 1e3:.1f} | "
                f"{mpi * 1e3:.1f} | {blocking * 1e3:.1f} | {blocking / plain:.1f}× | "
                f"{blocking / mpi:.1f}× | {med['iallreduce'] / plain:.1f}× | "
                f"{med['allreduce_init h()'] / plain:.1f}× | "
                f"{run['load'][0]:.1f}–{run['load'][1]:.1f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dtype", nargs="?", choices=[str(d) for d in R.DTYPES])
    ap.add_argument("--mib", type=int, nargs="+", default=[1, 16, 64],
                    help="MiB per rank (default 1 16 64)")
    ap.add_argument("--calls", type=int, default=5, help="rounds per size (default 5)")
    ap.add_argument("--json", metavar="PATH", help="also write the medians to PATH")
    ap.add_argument("--table", nargs="+", metavar="PATH",
                    help="print the table of these --json files (no MPI, no timing)")
    args = ap.parse_args()
    if args.table:
        print(table(args.table))
        return
    if args.dtype is None:
        ap.error("a dtype, or --table")
    comm = MPI.COMM_WORLD
    dt = np.dtype(R.bfloat16 if args.dtype == "bfloat16" else args.dtype)
    load = os.getloadavg()[0]
    rows = []
    for mib in args.mib:
        n = (mib << 20) // dt.itemsize
        x = np.random.default_rng(comm.rank).standard_normal(n).astype(dt)
        out = np.empty_like(x)
        h = mpicoll.allreduce_init(x, np.empty_like(x), reproducible=True, comm=comm)
        forms = {
            "plain auto": lambda: mpicoll.allreduce(x, out, comm=comm),
            "MPI_Allreduce": lambda: comm.Allreduce(x, out, op=MPI.SUM),
            "blocking": lambda: mpicoll.allreduce(x, out, reproducible=True, comm=comm),
            "iallreduce": lambda: mpicoll.iallreduce(x, out, reproducible=True,
                                                     comm=comm).wait(),
            "allreduce_init h()": h,
        }
        names = list(forms)
        times = {name: [] for name in names}
        want = None
        for name in names[:2]:                  # warm up (shm's first call maps its window)
            forms[name]()
        for name in names[2:]:                  # warm up; every form the same bits
            forms[name]()
            got = (h.result if name == "allreduce_init h()" else out).tobytes()
            want = want or got
            assert got == want, name
        rng = np.random.default_rng(mib)
        for _ in range(args.calls):
            for name in rng.permutation(names):
                comm.Barrier()
                t = time.perf_counter()
                forms[name]()
                dt_ = comm.allreduce(time.perf_counter() - t, op=MPI.MAX)
                times[name].append(dt_)
        h.free()
        med = {name: float(np.median(v)) for name, v in times.items()}
        rows.append((mib, med))
    if comm.rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump({"size": comm.size, "dtype": str(dt), "calls": args.calls,
                       "load": [round(load, 2), round(os.getloadavg()[0], 2)],
                       "rows": rows}, f, indent=1)
    if comm.rank == 0:
        print(f"N = {comm.size}, {dt}, medians of {args.calls} (ms); load average "
              f"{load:.1f} before, {os.getloadavg()[0]:.1f} after")
        print("| MiB | plain auto | MPI_Allreduce | blocking | iallreduce | allreduce_init h() |")
        print("|---|---|---|---|---|---|")
        for mib, med in rows:
            plain = med["plain auto"]
            cells = [f"{med['plain auto'] * 1e3:.1f}", f"{med['MPI_Allreduce'] * 1e3:.1f}"] + [
                f"{med[f] * 1e3:.1f} ({med[f] / plain:.1f}×)"
                for f in ("blocking", "iallreduce", "allreduce_init h()")]
            print(f"| {mib} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
