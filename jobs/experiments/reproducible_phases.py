"""Where the reproducible all-reduce's ``Job`` spends its time, phase by phase, inside the call.

    mpiexec -n 2 python jobs/experiments/reproducible_phases.py float64 --mib 1 16 64 --calls 5

Wraps the module's kernels' entry points (codes, slices, rounding; for arrays, ``auto``'s
exchange and window paths: the fused codes, slices and rounding of the rank's block; a kernel
called by another counts once, in the outer one) and the ``Job``'s bound plans (the MAX of the
codes, the SUM of the slices, the exchange of the values, the all-gather of the floats) or, on
one node, ``shm``'s window (its copies and waits, with the rows' kernel inside it), then runs
the blocking ``allreduce(reproducible=True)`` and the plain ``auto`` call in turn, each between
barriers. Prints per phase the median wall and thread CPU time (``time.thread_time``, the
least disturbed on a shared machine), the slowest rank's, and the CPU ns per element of the
vector; the whole call's rows last (docs/performance.md#reproducible-sums). Runs against
whichever ``mpicoll`` is on the path (so the same command measures an older tree).
"""

from __future__ import annotations

import argparse
import collections
import os
import time

import numpy as np
from mpi4py import MPI

import mpicoll
from mpicoll import reproducible as R
from mpicoll.shm import transport

try:
    from mpicoll.reproducible import job as _calls      # the module whose Job calls the kernels
except ImportError:
    _calls = R                                          # an older tree: reproducible.py, whole

_spent = collections.defaultdict(lambda: [0.0, 0.0])     # phase -> [wall, CPU] in this call
_kernels: list = []     # the kernels being timed (one called by another counts in the outer)


def timed(name, f, kernel=False):
    """``f`` adding its wall and thread CPU time to ``_spent[name]`` (a ``kernel`` inside
    another kernel adds nothing: its time is the outer one's)."""
    def wrapped(*args, **kwargs):
        if kernel and _kernels:
            return f(*args, **kwargs)
        if kernel:
            _kernels.append(name)
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            return f(*args, **kwargs)
        finally:
            _spent[name][0] += time.perf_counter() - wall
            _spent[name][1] += time.thread_time() - cpu
            if kernel:
                _kernels.pop()
    return wrapped


def instrument() -> None:
    """Wrap the kernels' entry points and every new ``Job``'s bound plans."""
    for name, label in (("_codes_into", "codes"), ("_local_slices", "slices"),
                        ("rounded", "rounding (this rank's block)"),
                        ("rounded_rows", "codes, slices, rounding of the block (fused)"),
                        ("rounded_pair", "the two rows' sums of the block (two ranks)")):
        setattr(_calls, name, timed(label, getattr(_calls, name), kernel=True))
    plain, window = transport.window_allreduce, timed(
        "shm's window: copies and waits (the kernel inside)", transport.window_allreduce)
    transport.window_allreduce = lambda *a, **kw: (window if kw.get("rows") else plain)(*a, **kw)
    made = R.Job.__init__

    def init(self, *args, **kwargs):
        made(self, *args, **kwargs)
        for attr, label in (("_max", "MAX of the codes"), ("_sum", "SUM of the slices"),
                            ("_exchange", "exchange of the values"),
                            ("_gather", "all-gather of the floats")):
            if getattr(self, attr, None) is not None:
                setattr(self, attr, timed(label, getattr(self, attr)))
    R.Job.__init__ = init


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dtype", choices=["float64", "float32"])
    ap.add_argument("--mib", type=int, nargs="+", default=[16], help="MiB per rank")
    ap.add_argument("--calls", type=int, default=5, help="calls per size (medians)")
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    instrument()
    dt = np.dtype(args.dtype)
    for mib in args.mib:
        n = (mib << 20) // dt.itemsize
        x = np.random.default_rng(comm.rank).standard_normal(n).astype(dt)
        out = np.empty_like(x)
        calls = {"**reproducible all-reduce**": lambda: mpicoll.allreduce(x, out,
                                                                          reproducible=True),
                 "**plain all-reduce (auto)**": lambda: mpicoll.allreduce(x, out)}
        for f in calls.values():                # warm up
            f()
        rows = collections.defaultdict(list)
        load = os.getloadavg()[0]
        for _ in range(args.calls):
            _spent.clear()
            for name, f in calls.items():
                comm.Barrier()
                timed(name, f)()
            for name, (wall, cpu) in _spent.items():
                rows[name].append((wall, cpu))
        med = {name: np.median(np.array(v), axis=0) for name, v in rows.items()}
        worst = {name: [comm.allreduce(float(t), op=MPI.MAX) for t in med[name]]
                 for name in sorted(med)}               # the slowest rank's, each
        if comm.rank == 0:
            print(f"N = {comm.size}, {dt}, {mib} MiB, K = {R.DEFAULT_K[dt]}, medians of "
                  f"{args.calls}; load average {load:.1f} before, {os.getloadavg()[0]:.1f} "
                  f"after\n| phase | wall ms | CPU ms | CPU ns per element |\n|---|---|---|---|")
            order = sorted(worst, key=lambda name: name.startswith("**"))
            for name in order:
                wall, cpu = worst[name]
                print(f"| {name} | {wall * 1e3:.1f} | {cpu * 1e3:.1f} | {cpu / n * 1e9:.2f} |")


if __name__ == "__main__":
    main()
