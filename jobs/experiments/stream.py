"""A STREAM-like probe: the memory bandwidth of this machine, for the roofline (issue 12).

    python jobs/experiments/stream.py [--elements 2^25] [--repeat 10] [--threads N] [--json FILE]

McCalpin's STREAM kernels over float64 arrays well beyond the last-level cache (each array at
least 4x its size, as STREAM's rules ask), timed best-of-``--repeat`` after one untimed pass:

    copy   c = a              16 bytes per element
    scale  b = s.c            16
    add    c = a + b          24
    triad  a = b + s.c        24

counted as STREAM counts them (what the kernel reads and writes, not the write-allocate reads
the hardware adds). Three implementations: numpy (``np.copyto``, ``np.multiply(out=)``,
``np.add(out=)``; its triad needs two passes and is left out), numba on one thread, and numba
``prange`` on ``--threads`` threads (default: every core). The ceiling printed last is the best
figure of any row: a lower bound of what memory delivers (on a quiet machine the all-threads
row; on a loaded one, where a parallel loop waits for its slowest thread, often a one-thread
row). An MPI rank is one thread, so the one-thread row is what one rank streams alone.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numba
import numpy as np
from numba import njit, prange

BYTES = {"copy": 16, "scale": 16, "add": 24, "triad": 24}
SCALAR = 3.0


def last_level_cache() -> int | None:
    """Bytes of the largest CPU cache Linux reports (sysfs), or None."""
    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = path.read_text().strip()
        units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        sizes.append(int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text))
    return max(sizes) if sizes else None


# ----------------------------------------------------------------------------- kernels

@njit(cache=True)
def _copy(a, c):
    for i in range(a.size):
        c[i] = a[i]


@njit(cache=True)
def _scale(c, b, s):
    for i in range(c.size):
        b[i] = s * c[i]


@njit(cache=True)
def _add(a, b, c):
    for i in range(a.size):
        c[i] = a[i] + b[i]


@njit(cache=True)
def _triad(b, c, a, s):
    for i in range(b.size):
        a[i] = b[i] + s * c[i]


@njit(parallel=True, cache=True)
def _pcopy(a, c):
    for i in prange(a.size):
        c[i] = a[i]


@njit(parallel=True, cache=True)
def _pscale(c, b, s):
    for i in prange(c.size):
        b[i] = s * c[i]


@njit(parallel=True, cache=True)
def _padd(a, b, c):
    for i in prange(a.size):
        c[i] = a[i] + b[i]


@njit(parallel=True, cache=True)
def _ptriad(b, c, a, s):
    for i in prange(b.size):
        a[i] = b[i] + s * c[i]


def elements_arg(text: str) -> int:
    """An element count: ``33554432`` or ``2^25``."""
    base, _, power = text.partition("^")
    n = int(base) ** int(power) if power else int(base)
    if n < 1:
        raise argparse.ArgumentTypeError(f"needs a positive count, got {text!r}")
    return n


def kernels(a, b, c) -> dict:
    """{implementation: {kernel: a function of no arguments}} over the arrays a, b, c."""
    s = SCALAR
    return {
        "numpy": {"copy": lambda: np.copyto(c, a), "scale": lambda: np.multiply(c, s, out=b),
                  "add": lambda: np.add(a, b, out=c)},
        "numba, 1 thread": {"copy": lambda: _copy(a, c), "scale": lambda: _scale(c, b, s),
                            "add": lambda: _add(a, b, c), "triad": lambda: _triad(b, c, a, s)},
        "numba, all threads": {"copy": lambda: _pcopy(a, c), "scale": lambda: _pscale(c, b, s),
                               "add": lambda: _padd(a, b, c),
                               "triad": lambda: _ptriad(b, c, a, s)},
    }


def best_of(f, repeat: int) -> float:
    """The shortest of ``repeat`` timed calls, after one untimed call."""
    f()
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t)
    return best


def probe(elements: int, repeat: int, threads: int) -> dict:
    numba.set_num_threads(threads)
    a = np.full(elements, 1.0)
    b = np.full(elements, 2.0)
    c = np.zeros(elements)
    results = {}
    for impl, table in kernels(a, b, c).items():
        results[impl] = {}
        for name, f in table.items():
            seconds = best_of(f, repeat)
            results[impl][name] = {"seconds": seconds,
                                   "GBps": BYTES[name] * elements / seconds / 1e9}
    # STREAM's check: after the last triad, a = b + s.c with the values the kernels left
    expected = b + SCALAR * c
    if not np.array_equal(a, expected):
        raise AssertionError("stream kernels gave wrong values")
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--elements", type=elements_arg,
                    default=1 << 25, help="float64 elements per array (default 2^25: 256 MiB)")
    ap.add_argument("--repeat", type=int, default=10, help="timed passes per kernel (best of)")
    ap.add_argument("--threads", type=int, default=numba.config.NUMBA_NUM_THREADS,
                    help="threads of the parallel kernels (default: every core)")
    ap.add_argument("--json", type=Path, metavar="FILE", help="write the results as JSON")
    args = ap.parse_args(argv)
    llc = last_level_cache()
    array_bytes = args.elements * 8
    load = os.getloadavg()[0]
    print(f"# {args.elements} float64 per array ({array_bytes / 2**20:.0f} MiB, 3 arrays); "
          f"last-level cache {llc and llc / 2**20:g} MiB; best of {args.repeat}; "
          f"{os.cpu_count()} cores, {args.threads} threads for the parallel kernels; "
          f"load average {load:.1f} when it started")
    if llc and array_bytes < 4 * llc:
        print(f"# warning: arrays are smaller than 4x the last-level cache ({4 * llc} B): "
              "this measures the cache, not memory", file=sys.stderr)
    results = probe(args.elements, args.repeat, args.threads)
    print(f"# {'':<20}" + "".join(f"{k:>10}" for k in BYTES) + "   (GB/s, 1 GB = 1e9 B)")
    for impl, table in results.items():
        print(f"  {impl:<20}" + "".join(
            f"{table[k]['GBps']:>10.2f}" if k in table else f"{'-':>10}" for k in BYTES))
    impl, kernel = max(((i, k) for i in results for k in results[i]),
                       key=lambda ik: results[ik[0]][ik[1]]["GBps"])
    ceiling = results[impl][kernel]["GBps"]
    one = results["numba, 1 thread"]
    one_kernel = max(one, key=lambda k: one[k]["GBps"])
    print(f"memory-bandwidth ceiling: {ceiling:.1f} GB/s (the best of every row: {kernel}, "
          f"{impl}); one thread: {one[one_kernel]['GBps']:.1f} GB/s ({one_kernel})")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "elements": args.elements, "array_bytes": array_bytes, "repeat": args.repeat,
            "threads": args.threads, "cores": os.cpu_count(), "last_level_cache": llc,
            "load_average": load, "machine": platform.processor() or platform.machine(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "bytes_per_element": BYTES, "results": results,
            "ceiling_GBps": ceiling, "ceiling_kernel": f"{kernel}, {impl}",
            "one_thread_GBps": one[one_kernel]["GBps"], "one_thread_kernel": one_kernel},
            indent=1) + "\n")
        print(f"# wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
