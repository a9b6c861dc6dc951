"""What the failure detector costs (issue 41): per call, and idle.

    mpiexec -n 4 python jobs/experiments/detector_cost.py [--idle 60] [--json FILE]

1. Calls: the same all-reduce on two communicators of the same ranks, one watched by the
   detector (the default) and one set up with ``MPICOLL_HEARTBEAT=0``, in alternating batches;
   the median time per call of each, and their ratio (watched / unwatched), per size.
2. Idle: every rank sleeps ``--idle`` seconds with the watched communicator set up; the CPU
   time of its detector thread (``mpicoll-detector``, from /proc) over that time, as a share of
   one core. ``--heartbeats`` also runs the idle part with ``MPICOLL_HEARTBEAT_ONLY=1`` (ranks
   watched as across machines: heartbeats, no pid checks).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time

import numpy as np
from mpi4py import MPI

import mpicoll
from mpicoll import settings


def thread_cpu(name: str) -> float:
    """CPU seconds of this process's thread called ``name`` (0 if none)."""
    ident = next((t.native_id for t in threading.enumerate() if t.name == name), None)
    if ident is None:
        return 0.0
    with open(f"/proc/self/task/{ident}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def comm_with(heartbeat: str) -> MPI.Intracomm:
    os.environ["MPICOLL_HEARTBEAT"] = heartbeat
    settings.reload()
    comm = MPI.COMM_WORLD.Dup()
    mpicoll.allreduce(np.ones(4), comm=comm)        # set up now, with this setting
    return comm


def per_call(watched, plain, count: int, batches: int, calls: int) -> dict:
    x, y = np.ones(count), np.empty(count)
    times = {"watched": [], "plain": []}
    for _ in range(batches):
        for name, comm in (("watched", watched), ("plain", plain)):
            comm.Barrier()
            start = time.perf_counter()
            for _ in range(calls):
                mpicoll.allreduce(x, y, comm=comm)
            times[name].append((time.perf_counter() - start) / calls)
    slowest = {k: np.max(MPI.COMM_WORLD.allgather(v), axis=0) for k, v in times.items()}
    med = {k: statistics.median(v) * 1e6 for k, v in slowest.items()}
    return {"bytes": count * 8, "watched_us": med["watched"], "plain_us": med["plain"],
            "ratio": med["plain"] / med["watched"]}


def idle(seconds: float) -> float:
    """Share of a core the detector thread used while this rank slept ``seconds``."""
    before = thread_cpu("mpicoll-detector")
    time.sleep(seconds)
    return (thread_cpu("mpicoll-detector") - before) / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--idle", type=float, default=20.0)
    ap.add_argument("--heartbeats", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    world = MPI.COMM_WORLD
    plain = comm_with("0")
    watched = comm_with("0.2")
    rows = [per_call(watched, plain, count, 41, calls)
            for count, calls in ((1, 200), (8192, 100), (1 << 17, 20))]
    share = max(world.allgather(idle(args.idle)))
    result = {"nranks": world.Get_size(), "load": os.getloadavg()[0], "calls": rows,
              "idle_seconds": args.idle, "idle_core_share_max": share}
    if args.heartbeats:
        os.environ["MPICOLL_HEARTBEAT_ONLY"] = "1"
        beating = comm_with("0.2")
        result["idle_core_share_max_heartbeats"] = max(world.allgather(idle(args.idle)))
        beating.Free()
    if world.Get_rank() == 0:
        print(f"# N={world.Get_size()}, load {result['load']:.1f}; median us per call of the "
              "slowest rank, watched by the detector and not, alternating batches")
        for r in rows:
            print(f"{r['bytes']:>9} B  watched {r['watched_us']:9.1f}  plain "
                  f"{r['plain_us']:9.1f}  plain/watched {r['ratio']:.3f}")
        print(f"idle {args.idle:g} s: the detector thread used {100 * share:.3f} % of a core "
              "(the busiest rank)")
        if args.heartbeats:
            print(f"idle with heartbeats only: "
                  f"{100 * result['idle_core_share_max_heartbeats']:.3f} % of a core")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
    plain.Free()
    watched.Free()


if __name__ == "__main__":
    main()
