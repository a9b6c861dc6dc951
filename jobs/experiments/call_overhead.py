"""Per-call overhead at N = 1: a persistent call, a plain ``allreduce``, and raw mpi4py.

    python jobs/experiments/call_overhead.py                  # COMM_SELF: no transfers, only the layers
    python jobs/experiments/call_overhead.py --count 1024 --reps 15
    python jobs/experiments/call_overhead.py --buffers        # + other buffers, and mpicoll.Comm's calls
    python jobs/experiments/call_overhead.py --buffers --json docs/results/call_overhead.json
    python jobs/experiments/call_overhead.py --table docs/results/call_overhead.json   # docs/performance.md
    python jobs/experiments/call_overhead.py --buffers --clock cpu   # this thread's CPU time: a loaded
                                                         # machine's waits are not counted

On ``COMM_SELF`` a collective moves no data, so its time is what mpicoll's Python layer costs:
argument checks, algorithm choice and copy-in for a plain call; the copy-in alone (after one
attribute check) for a persistent handle (``mpicoll.allreduce_init``). Each form is timed in
batches of ``--iters`` calls, the forms taking turns batch by batch (so a loaded machine slows
them alike), ``--reps`` batches each; it prints the median and the best batch's mean per call
in microseconds. Issue 18's goals, quiet machine: persistent <= 1.0 us, plain <= 2.0 us,
other buffers and ``mpicoll.Comm`` <= 3.0 us (``GOALS``).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
from mpi4py import MPI

import mpicoll


GOALS = {"persistent allreduce_init, h()": 1.0, "plain allreduce(x, out)": 2.0,
         "plain allreduce(array.array x2)": 3.0, "plain allreduce(memoryview x2)": 3.0,
         "plain allreduce(DLPack-only x2)": 3.0, "plain allreduce(__array_interface__ x2)": 3.0,
         "mpicoll.Comm.Allreduce(x, out)": 3.0, "Comm.Allreduce([x, DOUBLE], [out, DOUBLE])": 3.0}


def table(path) -> str:
    """docs/performance.md's table from a ``--json`` file: median and best batch per form."""
    with open(path) as f:
        data = json.load(f)
    rows = [f"| form | median µs | best µs | goal µs |", "|---|---:|---:|---:|"]
    for r in data["forms"]:
        goal = GOALS.get(r["form"])
        rows.append(f"| {r['form']} | {r['median_us']:.2f} | {r['best_us']:.2f} | "
                    f"{'' if goal is None else f'≤ {goal:g}'} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=1, help="float64 elements (default 1: 8 B)")
    ap.add_argument("--iters", type=int, default=20000, help="calls per batch")
    ap.add_argument("--reps", type=int, default=11, help="batches per form")
    ap.add_argument("--buffers", action="store_true",
                    help="also time plain allreduce on array.array, memoryview, a DLPack-only "
                         "and an __array_interface__-only object, and mpicoll.Comm.Allreduce")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="wall: elapsed time (default); cpu: this thread's CPU time "
                         "(time.thread_time), which leaves out the time other processes "
                         "held the core -- for a loaded machine")
    ap.add_argument("--json", help="write the medians here")
    ap.add_argument("--table", metavar="JSON", help="print the markdown table of a --json file")
    args = ap.parse_args(argv)
    if args.table:
        print(table(args.table))
        return 0
    comm = MPI.COMM_SELF
    x, out = np.ones(args.count), np.empty(args.count)
    inplace = np.ones(args.count)
    forms = {
        "persistent allreduce_init, h()":
            mpicoll.allreduce_init(x, out, comm=comm),
        "persistent, in place":
            mpicoll.allreduce_init(MPI.IN_PLACE, inplace, comm=comm),
        "plain allreduce(x, out)":
            lambda: mpicoll.allreduce(x, out, comm=comm),
        "plain allreduce(x) (allocates out)":
            lambda: mpicoll.allreduce(x, comm=comm),
        "mpi4py comm.Allreduce(x, out)":
            lambda: comm.Allreduce(x, out),
    }
    if args.buffers:
        forms.update(_buffer_forms(comm, x, out))
    times = {name: [] for name in forms}
    for fn in forms.values():
        for _ in range(1000):
            fn()
    clock = time.perf_counter if args.clock == "wall" else time.thread_time
    for _ in range(args.reps):
        for name, fn in forms.items():
            t0 = clock()
            for _ in range(args.iters):
                fn()
            times[name].append((clock() - t0) / args.iters * 1e6)
    print(f"# N=1 (COMM_SELF), {args.count} float64, {args.reps} batches of {args.iters} "
          f"calls per form, interleaved, {args.clock} clock; "
          f"{MPI.Get_library_version().splitlines()[0].strip()}")
    width = max(38, max(map(len, times)))
    print(f"{'form':<{width}} {'median(us)':>10} {'best(us)':>9}")
    for name, t in times.items():
        print(f"{name:<{width}} {np.median(t):>10.2f} {min(t):>9.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"count": args.count, "iters": args.iters, "reps": args.reps,
                       "clock": args.clock, "load": os.getloadavg()[0],
                       "library": MPI.Get_library_version().splitlines()[0].strip(),
                       "forms": [{"form": name, "median_us": float(np.median(t)),
                                  "best_us": float(min(t))} for name, t in times.items()]},
                      f, indent=1)
    return 0


def _buffer_forms(comm, x, out) -> dict:
    """The plain call on other buffers over the same memory (read as numpy views, no copy), and
    mpicoll.Comm's mpi4py-style calls."""
    import array

    class DLPackOnly:
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, **kwargs):
            return self.a.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    class ArrayInterfaceOnly:
        def __init__(self, a):
            self.__array_interface__ = a.__array_interface__

    ax, aout = array.array("d", x.tolist()), array.array("d", out.tolist())
    mx, mout = memoryview(x), memoryview(out)
    dx, dout = DLPackOnly(x), DLPackOnly(out)
    ix, iout = ArrayInterfaceOnly(x), ArrayInterfaceOnly(out)
    mc = mpicoll.Comm(comm)
    return {
        "plain allreduce(array.array x2)": lambda: mpicoll.allreduce(ax, aout, comm=comm),
        "plain allreduce(memoryview x2)": lambda: mpicoll.allreduce(mx, mout, comm=comm),
        "plain allreduce(DLPack-only x2)": lambda: mpicoll.allreduce(dx, dout, comm=comm),
        "plain allreduce(__array_interface__ x2)": lambda: mpicoll.allreduce(ix, iout,
                                                                             comm=comm),
        "mpicoll.Comm.Allreduce(x, out)": lambda: mc.Allreduce(x, out),
        "Comm.Allreduce([x, DOUBLE], [out, DOUBLE])":
            lambda: mc.Allreduce([x, MPI.DOUBLE], [out, MPI.DOUBLE]),
    }


if __name__ == "__main__":
    raise SystemExit(main())
