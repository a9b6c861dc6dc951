"""Per-call overhead at N = 1: a persistent call, a plain ``allreduce``, and raw mpi4py.

    python jobs/call_overhead.py                  # COMM_SELF: no transfers, only the layers
    python jobs/call_overhead.py --count 1024 --reps 15
    python jobs/call_overhead.py --buffers        # + other buffers, and mpicoll.Comm's calls

On ``COMM_SELF`` a collective moves no data, so its time is what mpicoll's Python layer costs:
argument checks, algorithm choice and copy-in for a plain call; the copy-in alone (after one
attribute check) for a persistent handle (``mpicoll.allreduce_init``). Each form is timed in
batches of ``--iters`` calls, the forms taking turns batch by batch (so a loaded machine slows
them alike), ``--reps`` batches each; it prints the median and the best batch's mean per call
in microseconds. Issue 12's goals: <= 1.5 us persistent, <= 2.5 us plain.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

import mpicoll


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=1, help="float64 elements (default 1: 8 B)")
    ap.add_argument("--iters", type=int, default=20000, help="calls per batch")
    ap.add_argument("--reps", type=int, default=11, help="batches per form")
    ap.add_argument("--buffers", action="store_true",
                    help="also time plain allreduce on array.array, memoryview, a DLPack-only "
                         "and an __array_interface__-only object, and mpicoll.Comm.Allreduce")
    args = ap.parse_args(argv)
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
    for _ in range(args.reps):
        for name, fn in forms.items():
            t0 = time.perf_counter()
            for _ in range(args.iters):
                fn()
            times[name].append((time.perf_counter() - t0) / args.iters * 1e6)
    print(f"# N=1 (COMM_SELF), {args.count} float64, {args.reps} batches of {args.iters} "
          f"calls per form, interleaved; {MPI.Get_library_version().splitlines()[0].strip()}")
    width = max(38, max(map(len, times)))
    print(f"{'form':<{width}} {'median(us)':>10} {'best(us)':>9}")
    for name, t in times.items():
        print(f"{name:<{width}} {np.median(t):>10.2f} {min(t):>9.2f}")
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
