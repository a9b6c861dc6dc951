"""Rank deaths for the failure detector's tests: run under ``mpiexec -disable-auto-cleanup -n N``
by tests/jobs/test_deaths.py.

    mpiexec -disable-auto-cleanup -n N python tests/faults/deaths.py CASE --out DIR
        [--algorithm A] [--form F] [--victims 2,3]

Every rank writes one JSON object to ``DIR/rank<r>.json`` (written whole at the end, flushed):
a victim ``{"victim": true, "killed_at": wall clock}`` just before it SIGKILLs itself; a
survivor what its call raised (``error``, ``ranks``, ``message``), ``detect`` (seconds from the
first victim's death to the error), ``shrink`` (seconds ``mpicoll.shrink`` took), ``size`` of
the shrunk communicator, ``checks``: for every algorithm of every collective (and ``auto``),
whether its result on the shrunk communicator is exact, ``again``: what the old communicator's next call raised, and
``free``: seconds its ``Free`` took. Cases:

* ``call``: the victims die in the middle of a loop of calls of ``--form`` (``blocking``,
  ``iallreduce``, ``persistent``, ``comm``, ``buckets``) with ``--algorithm``; with several
  victims the second dies 30 ms after the first (a death during the agreement);
* ``between``: the victims die while the others are outside any call (sleeping); the others'
  next call must raise at once;
* ``--dies-in-shrink R``: after the first death, rank R dies inside ``mpicoll.shrink`` (its
  ``MPI_Comm_create_group``): the others must find it and shrink without it;
* ``busy``: rank ``N-1`` is alive but busy for ``--busy`` seconds (8; a Python loop, numpy, sleep)
  while the others wait in an all-reduce; nobody may be reported, and the call completes.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import threading
import time

import numpy as np
from mpi4py import MPI

import mpicoll
from mpicoll.registry import COLLECTIVES

COUNT = 1 << 15


def loop(comm, form: str, algorithm: str):
    """Calls of ``form`` until one raises (the victims die meanwhile)."""
    x = np.ones(COUNT)
    y = np.empty_like(x)
    if form == "persistent":
        handle = mpicoll.allreduce_init(x, y, algorithm=algorithm, comm=comm)
        while True:
            handle()
    if form == "comm":
        wrapped = mpicoll.Comm(comm, algorithm)
        while True:
            wrapped.Allreduce(x, y)
    if form == "buckets":
        grads = [np.ones(1000), np.ones(3000)]
        buckets = mpicoll.Buckets(grads, bucket_bytes=16000, algorithm=algorithm, comm=comm)
        while True:
            for i in reversed(range(len(grads))):
                grads[i][:] = 1.0
                buckets.ready(i)
            buckets.wait()
    while True:
        if form == "iallreduce":
            mpicoll.iallreduce(x, y, algorithm=algorithm, comm=comm).wait()
        else:
            mpicoll.allreduce(x, y, algorithm=algorithm, comm=comm)


def die(out: str, rank: int, delay: float) -> None:
    """SIGKILL this process ``delay`` seconds from now (from a timer: mid-call)."""
    def kill() -> None:
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            json.dump({"victim": True, "killed_at": time.time()}, f)
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Timer(delay, kill).start()


def checks(comm) -> dict:
    """Every algorithm of every collective on ``comm`` (and ``auto``): exact? (the bits of a
    fresh communicator of that size: integer-valued float64, so every order sums alike)"""
    size, rank = comm.Get_size(), comm.Get_rank()
    n = 4096
    base = np.arange(n * size, dtype=np.float64)
    total = size * base + size * (size - 1) / 2
    got = {}
    for collective, algorithms in COLLECTIVES.items():
        for algorithm in list(algorithms) + ["auto"]:
            if collective == "allreduce":
                out = mpicoll.allreduce(base[:n] + rank, algorithm=algorithm, comm=comm)
                ok = np.array_equal(out, total[:n])
            elif collective == "reduce_scatter_block":
                out = mpicoll.reduce_scatter_block(base + rank, algorithm=algorithm, comm=comm)
                ok = np.array_equal(out, total[rank * n:(rank + 1) * n])
            elif collective == "allgather":
                out = mpicoll.allgather(base[:n] + rank, algorithm=algorithm, comm=comm)
                ok = np.array_equal(np.asarray(out).reshape(-1),
                                    np.concatenate([base[:n] + r for r in range(size)]))
            else:
                buf = base[:n] + (size - 1) if rank == size - 1 else np.zeros(n)
                out = mpicoll.bcast(buf, size - 1, algorithm=algorithm, comm=comm)
                ok = np.array_equal(out, base[:n] + (size - 1))
            got[f"{collective} {algorithm}"] = bool(ok)
    return got


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("case", choices=["call", "between", "busy"])
    parser.add_argument("--out", required=True)
    parser.add_argument("--algorithm", default="ring")
    parser.add_argument("--form", default="blocking")
    parser.add_argument("--victims", default="2")
    parser.add_argument("--busy", type=float, default=8.0, help="seconds the busy rank is busy")
    parser.add_argument("--dies-in-shrink", type=int, default=-1,
                        help="this rank dies inside mpicoll.shrink (after the first death)")
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    comm = world.Dup()
    rank, size = comm.Get_rank(), comm.Get_size()
    # this rank's stderr into DIR/err<r> (a survivor's write to the launcher's pipe after a
    # death can make Hydra end the job), with Python's tracebacks on fatal signals
    err = open(os.path.join(args.out, f"err{rank}"), "w")
    os.dup2(err.fileno(), 2)
    faulthandler.enable()
    faulthandler.dump_traceback_later(40)       # a rank still here then: where it hangs
    victims = [int(v) for v in args.victims.split(",")]
    mpicoll.allreduce(np.ones(COUNT), algorithm=args.algorithm, comm=comm)   # set up, warm
    row: dict = {"rank": rank}
    if args.case == "busy":
        row.update(busy(comm, rank, size, args.busy))
        comm.Barrier()
        _write(args.out, rank, row)
        os._exit(0)
    if rank in victims:
        if args.case == "between":
            comm.Barrier()
        die(args.out, rank, 0.3 + 0.03 * victims.index(rank))
        if args.case == "call":
            loop(comm, args.form, args.algorithm)
        time.sleep(60)
    if args.case == "between":
        comm.Barrier()
        time.sleep(2.0)                 # outside any call while they die
    start = time.monotonic()
    try:
        loop(comm, args.form, args.algorithm) if args.case == "call" else \
            mpicoll.allreduce(np.ones(COUNT), algorithm=args.algorithm, comm=comm)
    except Exception as exc:            # noqa: BLE001 - reported to the test
        now = time.time()
        row.update(error=type(exc).__name__, ranks=getattr(exc, "ranks", None),
                   message=str(exc)[:600], call_seconds=time.monotonic() - start)
        killed = [_read(args.out, v).get("killed_at") for v in victims]
        row["detect"] = now - min(k for k in killed if k) if any(killed) else None
    if rank == args.dies_in_shrink:     # inside shrink's MPI_Comm_create_group, as it starts
        from mpicoll import recovery

        def dying_create(*_args):
            _write(args.out, rank, {"victim": True, "killed_at": time.time(), "in": "shrink"})
            os.kill(os.getpid(), signal.SIGKILL)
        recovery._create = dying_create
    t = time.monotonic()
    try:
        new = mpicoll.shrink(comm)
        row["shrink"] = time.monotonic() - t
        row["size"] = new.Get_size()
        row["checks"] = checks(new)
        row["again"] = _again(comm)
        t = time.monotonic()
        comm.Free()                     # a broken communicator with a dead rank: never hangs
        row["free"] = time.monotonic() - t
    except Exception as exc:            # noqa: BLE001 - reported to the test
        row["shrink_error"] = f"{type(exc).__name__}: {exc}"[:600]
    _write(args.out, rank, row)
    os._exit(0)


def _again(comm) -> str | None:
    """The old communicator's next call: what it raises (it must, at once)."""
    try:
        mpicoll.allreduce(np.ones(10), comm=comm)
    except Exception as exc:            # noqa: BLE001
        return type(exc).__name__
    return None


def busy(comm, rank: int, size: int, seconds: float = 8.0) -> dict:
    """Rank size-1 busy ``seconds`` (a quarter in Python, 3/8 in numpy, 3/8 asleep); the
    others wait in an all-reduce."""
    x = np.ones(COUNT)
    start = time.monotonic()
    if rank == size - 1:
        end = time.monotonic() + seconds / 4
        n = 0
        while time.monotonic() < end:
            n += 1                      # a Python loop (holds the GIL between switches)
        a = np.random.default_rng(0).random((600, 600))
        end = time.monotonic() + seconds * 3 / 8
        while time.monotonic() < end:
            a = a @ a / np.abs(a).max()  # numpy (BLAS releases the GIL)
        time.sleep(seconds * 3 / 8)
    try:
        out = mpicoll.allreduce(x, comm=comm)
        return {"error": None, "correct": bool((out == size).all()),
                "seconds": time.monotonic() - start}
    except Exception as exc:            # noqa: BLE001
        return {"error": type(exc).__name__, "message": str(exc)[:600]}


def _read(out: str, rank: int) -> dict:
    try:
        with open(os.path.join(out, f"rank{rank}.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _write(out: str, rank: int, row: dict) -> None:
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(row, f)


if __name__ == "__main__":
    main()
