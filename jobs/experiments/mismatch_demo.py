"""Mismatched counts under the default deadline: every rank raises ArgumentMismatch, none returns.

    MPICOLL_TIMEOUT=5 mpiexec -n 2 python jobs/experiments/mismatch_demo.py
    MPICOLL_TIMEOUT=1 mpiexec -n 2 python jobs/experiments/mismatch_demo.py --within 2 --json out.json

Rank 0 passes 10 elements, rank 1 passes 20 (rank r: 10 * (r + 1)), without ``validate``, to
every algorithm of ``allreduce`` (``mpicoll.api.ALGORITHMS`` and ``auto``), to ``iallreduce``
and ``allreduce_init``, and to ``reduce_scatter_block``, ``allgather`` and ``bcast`` (whose
block or buffer counts differ the same way). Each case runs on a fresh ``comm.Dup()`` (a failed
call breaks its communicator; the broken ones are kept, not freed, until the end: messages of a
failed call may still be in flight on them). Rank 0 prints, per case, what each rank raised
and how long it took; the exit status is 1 if any rank returned, raised anything else than
``ArgumentMismatch``, left out a count, or took longer than ``--within`` seconds (default: the
deadline + 1 s) -- except in the one documented limit (docs/reliability.md): a bcast root whose
sends all complete without the others (binomial at N = 2, small messages) returns, its buffer
unchanged (its input: the right result), and the others raise ``ArgumentMismatch`` naming it
and their own count (shown as ``root``).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from mpi4py import MPI

import mpicoll
from mpicoll import settings
from mpicoll.api import ALGORITHMS
from mpicoll.registry import COLLECTIVES

SAMPLE = ("ring", "recursive_doubling", "mpi", "auto")     # for iallreduce and allreduce_init


def cases():
    for name in ALGORITHMS + ("auto",):
        yield "allreduce", name
    for name in SAMPLE:
        yield "iallreduce", name
    for name in SAMPLE:
        yield "allreduce_init", name
    for collective in ("reduce_scatter_block", "allgather", "bcast"):
        for name in tuple(COLLECTIVES[collective]) + ("auto",):
            yield collective, name


def run(collective: str, algorithm: str, comm, count: int, **options):
    size = comm.Get_size()
    x = np.ones(count)
    kw = dict(algorithm=algorithm, comm=comm, **options)
    if collective == "allreduce":
        return mpicoll.allreduce(x, **kw)
    if collective == "iallreduce":
        return mpicoll.iallreduce(x, **kw).wait()
    if collective == "allreduce_init":
        return mpicoll.allreduce_init(x, np.empty_like(x), **kw)()
    if collective == "reduce_scatter_block":
        return mpicoll.reduce_scatter_block(np.ones(count * size), **kw)
    if collective == "allgather":
        return mpicoll.allgather(x, **kw)
    return mpicoll.bcast(x, 0, **kw)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--within", type=float, default=None,
                    help="seconds every rank must raise within (default: the deadline + 1)")
    ap.add_argument("--only", default=None, help="run only the cases whose name contains this")
    ap.add_argument("--json", default=None, help="also write the results to this file")
    args = ap.parse_args(argv)
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    count = 10 * (rank + 1)
    deadline = settings.get("MPICOLL_TIMEOUT")
    within = args.within if args.within is not None else (deadline or 0) + 1
    if rank == 0:
        print(f"# N={size}, rank r passes {10} * (r + 1) elements, MPICOLL_TIMEOUT={deadline}, "
              f"validate off; {MPI.Get_library_version().splitlines()[0].strip()}", flush=True)
    # every case once with equal counts first: matching calls return the right result, and
    # every path is loaded (the numba load before a process's first call is not the point
    # here), under a generous deadline (a loaded machine can take seconds over a first call)
    warm = world.Dup()
    for collective, algorithm in cases():
        result = run(collective, algorithm, warm, 10, timeout=120.0)
        expected = {"reduce_scatter_block": size, "allgather": 1, "bcast": 1}.get(
            collective.replace("iallreduce", "allreduce"), size)
        if not np.all(result == expected):
            raise SystemExit(f"{collective} {algorithm} with equal counts: wrong result {result}")
    warm.Free()
    kept, results, bad = [], [], 0
    for collective, algorithm in cases():
        case = f"{collective} {algorithm}"
        if args.only and args.only not in case:
            continue
        comm = world.Dup()
        kept.append(comm)
        world.Barrier()
        t0 = time.monotonic()
        try:
            result = run(collective, algorithm, comm, count)
            outcome = ("returned", "" if collective != "bcast" or rank != 0 else
                       f"root, its buffer {'unchanged' if np.all(result == 1) else 'CHANGED'}")
        except Exception as exc:            # noqa: BLE001 - what each rank raised is the point
            outcome = (type(exc).__name__, str(exc))
        seconds = time.monotonic() - t0
        everyone = world.gather((outcome, seconds), root=0)
        if rank == 0:
            ok = all(kind == "ArgumentMismatch" and "10" in text and "20" in text
                     and s <= within for (kind, text), s in everyone)
            # the documented limit: a bcast root whose sends all completed eagerly returns (its
            # buffer is its input: right), the others raise naming it and their own count
            root = (not ok and everyone[0][0] == ("returned", "root, its buffer unchanged")
                    and all(kind == "ArgumentMismatch" and "rank(s) [0] sent" in text
                            and f"count={10 * (r + 1)}" in text and s <= within
                            for r, ((kind, text), s) in enumerate(everyone) if r))
            bad += not (ok or root)
            results.append({"case": case, "ok": ok, "root_returned": root, "ranks": [
                {"raised": kind, "seconds": round(s, 3), "message": text}
                for (kind, text), s in everyone]})
            print(f"{'ok  ' if ok else 'root' if root else 'FAIL'} {case:<32} " + "; ".join(
                f"rank {r}: {kind} after {s:.2f} s" for r, ((kind, _), s) in enumerate(everyone)),
                flush=True)
            for r, ((kind, text), _) in enumerate(everyone):
                if not ok or r == 0:
                    print(f"       rank {r}: {text}", flush=True)
    if rank == 0:
        limited = sum(r["root_returned"] for r in results)
        print(f"# {sum(r['ok'] for r in results)} of {len(results)} cases: every rank raised "
              f"ArgumentMismatch naming both counts within {within:g} s; {limited}: the bcast "
              f"root returned (its sends complete without the others; its buffer is its input) "
              f"and the others raised ArgumentMismatch naming it; {bad} failed", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"within": within, "timeout": deadline, "cases": results}, f, indent=1)
    bad = world.bcast(bad, root=0)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
