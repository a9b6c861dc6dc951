"""Soak: thousands of random mixed collective calls, each checked against the MPI library's own.

    mpiexec -n 4 python tests/mpi/soak.py --calls 20000 --seconds 600

Every call draws (the same on all ranks) a collective -- mostly all-reduce --, an algorithm
(``auto`` included), a count from 0 to 2^16 (log-uniform), a dtype, an op, in place or not, and
whether to pass ``timeout`` / ``validate``. Inputs are small integers, so any algorithm's result
must equal the MPI library's bit for bit. Resident memory (``/proc/self/statm``) is sampled every
``--sample`` calls; after the first ``--warm`` fraction of the calls it may grow by at most
``--max-growth`` MiB on any rank. Calls with a timeout use ``on_timeout="abort"``, so a hang ends
the job. Rank 0 prints a summary; the exit status is 1 on any wrong result or memory growth
past the bound. ``soak()`` is what tests/mpi/test_reliability.py runs, shorter.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
from mpi4py import MPI

import mpicoll
from mpicoll import kernels
from mpicoll.registry import COLLECTIVES
from mpicoll.testing import nodes

MPI_OP = {"sum": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN}
DTYPES, OPS = kernels.DTYPES[:4], kernels.OPS[:4]    # tests/mpi/dtype_matrix.py: all of them
WEIGHTS = {"allreduce": 0.7, "reduce_scatter_block": 0.1, "allgather": 0.1, "bcast": 0.1}
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    """Resident set size of this process in bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def inputs(rng, n: int, dtype, op: str) -> np.ndarray:
    """Small integers whose sum, product, max and min are exact in any order, for any dtype."""
    if op == "prod":
        v = rng.choice(np.array([1, -1, 1, 2]), n)
    elif op == "sum":
        v = rng.integers(-8, 9, n)
    else:
        v = rng.integers(-1000, 1001, n)
    return v.astype(dtype)


def one_call(comm, ref, rng, data_rng):
    """Draw and run one call; return a description if the result differs from MPI's, else None."""
    size, rank = comm.Get_size(), comm.Get_rank()
    collective = rng.choice(list(WEIGHTS), p=list(WEIGHTS.values()))
    one_node = len(nodes(comm, real=True)) == 1          # shm runs on one node only
    algorithm = rng.choice([a for a, algo in COLLECTIVES[collective].items()
                            if one_node or not algo.has("shared-memory")] + ["auto"])
    n = int(np.exp(rng.uniform(0, np.log(65537)))) - 1
    dtype = DTYPES[rng.integers(len(DTYPES))]
    op = OPS[rng.integers(len(OPS))]
    in_place = bool(rng.random() < 0.5)
    options = {"algorithm": str(algorithm), "comm": comm}
    if rng.random() < 0.3:
        options.update(timeout=120.0, on_timeout="abort")
    if rng.random() < 0.3:
        options["validate"] = True
    label = f"{collective} {algorithm} n={n} {dtype} {op} in_place={in_place} {options}"
    if collective == "allreduce":
        x = inputs(data_rng, n, dtype, op)
        want = np.empty_like(x)
        ref.Allreduce(x, want, op=MPI_OP[op])
        if in_place:
            got = x.copy()
            mpicoll.allreduce(MPI.IN_PLACE, got, op=op, **options)
        else:
            got = mpicoll.allreduce(x, op=op, **options)
    elif collective == "reduce_scatter_block":
        x = inputs(data_rng, n * size, dtype, op)
        want = np.empty(n, dtype)
        ref.Reduce_scatter_block(x, want, op=MPI_OP[op])
        if in_place:
            got = x.copy()
            mpicoll.reduce_scatter_block(MPI.IN_PLACE, got, op=op, **options)
            got = got[:n]
        else:
            got = mpicoll.reduce_scatter_block(x, op=op, **options)
    elif collective == "allgather":
        x = inputs(data_rng, n, dtype, "max")
        want = np.empty((size, n), dtype)
        ref.Allgather(x, want)
        if in_place:
            got = np.zeros((size, n), dtype)
            got[rank] = x
            mpicoll.allgather(MPI.IN_PLACE, got, **options)
        else:
            got = mpicoll.allgather(x, **options)
    else:
        root = int(rng.integers(size))
        want = inputs(data_rng, n, dtype, "max")
        ref.Bcast(want, root=root)
        got = want.copy() if rank == root else np.zeros(n, dtype)
        mpicoll.bcast(got, root, **options)
        label += f" root={root}"
    return None if got.tobytes() == want.tobytes() else label


def soak(comm, calls: int, seconds: float, *, seed: int = 0, warm: float = 0.25,
         sample: int = 50) -> dict:
    """Run up to ``calls`` random calls (stopping after ``seconds``); the summary, on every rank.

    ``growth`` is the largest rise, over ranks, of the resident size from the end of the warm-up
    (the first ``warm`` fraction of the calls made) to its highest later sample.
    """
    ref = comm.Dup()                  # MPI's own collectives run on their own communicator
    rng = np.random.default_rng(seed)                     # same draws on every rank
    wrong, samples, start = [], [], time.monotonic()
    done = 0
    while done < calls:
        if done % sample == 0:
            samples.append((done, rss()))
            stop = time.monotonic() - start > seconds
            if comm.allreduce(stop, op=MPI.LOR):          # every rank stops at the same call
                break
        bad = one_call(comm, ref, rng, np.random.default_rng([seed, done, comm.Get_rank()]))
        if bad:
            wrong.append(bad)
        done += 1
    samples.append((done, rss()))
    ref.Free()
    elapsed = time.monotonic() - start
    warm_rss = [r for c, r in samples if c <= warm * done][-1]
    growth = max(r for c, r in samples if c >= warm * done) - warm_rss
    everyone = comm.allgather({"wrong": wrong[:5], "nwrong": len(wrong), "growth": growth,
                               "rss": samples[-1][1], "warm_rss": warm_rss})
    return {"ranks": comm.Get_size(), "calls": done, "seconds": round(elapsed, 1),
            "calls_per_second": round(done / elapsed, 1),
            "wrong": sum(e["nwrong"] for e in everyone),
            "examples": [w for e in everyone for w in e["wrong"]][:5],
            "growth_mib": round(max(e["growth"] for e in everyone) / 2**20, 2),
            "rss_mib": round(max(e["rss"] for e in everyone) / 2**20, 1),
            "warm_rss_mib": round(max(e["warm_rss"] for e in everyone) / 2**20, 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--seconds", type=float, default=600.0, help="stop after this long")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warm", type=float, default=0.25, help="fraction of calls to warm up")
    parser.add_argument("--max-growth", type=float, default=16.0, help="MiB, after warm-up")
    args = parser.parse_args(argv)
    comm = MPI.COMM_WORLD.Dup()
    summary = soak(comm, args.calls, args.seconds, seed=args.seed, warm=args.warm)
    ok = summary["wrong"] == 0 and summary["growth_mib"] <= args.max_growth
    summary.update(max_growth_mib=args.max_growth, ok=ok)
    if comm.Get_rank() == 0:
        print(json.dumps(summary, indent=1), flush=True)
    comm.Free()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
