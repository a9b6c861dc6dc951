"""The CPU time of the steps issue #22's checks add to every call, against the step they
replace: one process, no communication (docs/reliability.md, "Cost").

    python tests/internals/check_cost.py [--reps 15] [-n 200000]

It times mpicoll's private steps (the tag's running hash, the thread check), so it sits with
the tests, which may import them; jobs/ use the public API only.
"""

from __future__ import annotations

import argparse
import os
import time
import timeit

import numpy as np
from mpi4py import MPI

from mpicoll._runtime import context, tags


def cost(reps: int = 15, n: int = 200000) -> None:
    """The CPU time of the steps issue #22 adds to every call, against the step they replace
    (one process, no communication; medians and best of ``reps`` batches of ``n``)."""
    comm = MPI.COMM_SELF.Dup()
    st = context.attach(comm)
    sig = tags.signature("allreduce", "ring", {"op": "sum", "dtype": np.dtype("float64"),
                                               "count": 1})

    class Prepared:
        collective = "allreduce"

        @context.exclusive
        def guarded(self, state):
            pass

        def plain(self, state):
            pass

    names = dict(st=st, sig=sig, context=context, p=Prepared())
    rows = [("tag before: number + offset", "7 + sig.offset"),
            ("tag now: st.label(number, sig)", "st.label(7, sig)"),
            ("a prepared call's method, plain", "p.plain(st)"),
            ("... with @context.exclusive", "p.guarded(st)"),
            ("Call: context.enter + leave", "context.enter(st, 'x'); context.leave(st)")]
    print(f"# CPU time per step, median / best of {reps} x {n}; load average "
          f"{os.getloadavg()[0]:.1f}")
    for name, stmt in rows:
        timer = timeit.Timer(stmt, timer=time.process_time, globals=names)
        times = sorted(timer.timeit(n) / n * 1e6 for _ in range(reps))
        print(f"{name:<36} {times[len(times) // 2]:.3f} / {times[0]:.3f} us")
    comm.Free()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=15, help="batches timed (default 15)")
    ap.add_argument("-n", type=int, default=200000, help="steps per batch (default 200000)")
    args = ap.parse_args(argv)
    cost(args.reps, args.n)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
