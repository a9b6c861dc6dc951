"""Steady-state allocations of an all-reduce call, measured with tracemalloc (issue 12).

    mpiexec -n 2 python -m mpi4py tests/mpi/allocations.py [--count 4096] [--calls 1000] [--json FILE]

For each way of calling (a persistent ``mpicoll.allreduce_init`` handle, a plain
``mpicoll.allreduce``; each with the compiled and the Python executor, with and without a
timeout) it warms up, then, under tracemalloc, runs ``--calls`` calls twice over and reports

* *surviving*: the bytes still allocated after each batch, against the start: a leak grows
  with the number of calls (the second batch's figure is twice the first's); a constant few
  dozen bytes is a replaced object (a byte counter's int) traced on one side of the window;
* *transient*: the peak of one call above what was allocated before it (the largest over 20
  calls), the working memory of a call that is freed again when it returns;
* *sites*: when something survives, the lines that allocated it (a snapshot diff).

tracemalloc sees the Python allocator and numpy's array data; not libmpi's or numba's own
``malloc``s. Prints one row per case on rank 0; ``tests/mpi/test_allocations.py`` asserts on
the same measurement.
"""

from __future__ import annotations

import argparse
import json
import linecache
import sys
import tracemalloc
from pathlib import Path

import numpy as np
from mpi4py import MPI

import mpicoll
from mpicoll.testing import background_paused, environment

WARMUP, PEAK_CALLS = 100, 20
IGNORE = [tracemalloc.Filter(False, tracemalloc.__file__),
          tracemalloc.Filter(False, linecache.__file__), tracemalloc.Filter(False, __file__)]


def measure(call, calls: int = 1000) -> dict:
    """Warm ``call`` up, then measure what ``calls`` calls leave allocated and one call's peak.

    Every rank of the communicator must run this together (``call`` is a collective)."""
    for _ in range(WARMUP):
        call()
    with background_paused():    # (the failure detector's looks are not the call's)
        tracemalloc.start(8)
        try:
            for _ in range(10):
                call()
            start = tracemalloc.take_snapshot()
            base = tracemalloc.get_traced_memory()[0]
            for _ in range(calls):
                call()
            first = tracemalloc.get_traced_memory()[0] - base
            for _ in range(calls):
                call()
            second = tracemalloc.get_traced_memory()[0] - base
            end = tracemalloc.take_snapshot()
            peaks = []
            for _ in range(PEAK_CALLS):
                tracemalloc.reset_peak()
                before = tracemalloc.get_traced_memory()[0]
                call()
                peaks.append(tracemalloc.get_traced_memory()[1] - before)
        finally:
            tracemalloc.stop()
    diff = end.filter_traces(IGNORE).compare_to(start.filter_traces(IGNORE), "lineno")
    sites = [f"{d.traceback[0].filename}:{d.traceback[0].lineno}: {d.size_diff:+d} B in "
             f"{d.count_diff:+d} blocks" for d in diff if d.size_diff > 0][:8]
    return {"calls": calls, "surviving_after": [first, second], "transient_peak": max(peaks),
            "transient_min": min(peaks), "sites": sites}


def cases(comm: MPI.Comm, count: int):
    """(name, executor, timeout, make) for each way of calling: ``make()`` returns the call."""
    x = np.arange(count, dtype=np.float64) + comm.Get_rank()
    y = np.empty_like(x)
    for executor in ("compiled", "python"):
        for timeout in (None, 60.0):
            def persistent(timeout=timeout):
                return mpicoll.allreduce_init(x, y, comm=comm, timeout=timeout)

            def plain(timeout=timeout):
                return lambda: mpicoll.allreduce(x, y, comm=comm, timeout=timeout)
            yield "persistent", executor, timeout, persistent
            yield "plain", executor, timeout, plain


def run_all(comm: MPI.Comm, count: int, calls: int) -> list[dict]:
    rows = []
    for name, executor, timeout, make in cases(comm, count):
        with environment(MPICOLL_EXECUTOR=executor):
            call = make()
            row = measure(call, calls)
        row.update(call=name, executor=executor, timeout=timeout, N=comm.Get_size(),
                   count=count, nbytes=count * 8)
        rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--count", type=int, default=4096, help="float64 elements (default 4096)")
    ap.add_argument("--calls", type=int, default=1000, help="calls per batch (default 1000)")
    ap.add_argument("--json", type=Path, metavar="FILE")
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD.Dup()
    rows = run_all(comm, args.count, args.calls)
    if comm.Get_rank() == 0:
        print(f"# N = {comm.Get_size()}, {args.count} float64 ({args.count * 8} B), "
              f"{args.calls} calls per batch, rank 0; bytes")
        print("# call        executor  timeout   surviving after 1 / 2 batches   transient peak"
              " per call (min..max of 20)")
        for r in rows:
            print(f"  {r['call']:<11} {r['executor']:<9} {str(r['timeout']):>7} "
                  f"{r['surviving_after'][0]:>14} / {r['surviving_after'][1]:<14} "
                  f"{r['transient_min']:>6} .. {r['transient_peak']}")
            for s in r["sites"]:
                print(f"      {s}")
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(rows, indent=1) + "\n")
            print(f"# wrote {args.json}")
    comm.Free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
