"""What one small ``dist.all_reduce`` costs on "mpicoll" and on "gloo" (issue 43, item 4).

    mpiexec -n 2 python -m mpi4py jobs/experiments/torch_call_cost.py [--calls 1000]
        [--rounds 5] [--warmup 200] [--outdir docs/results] [--label after] [--json PATH]
    python jobs/experiments/torch_call_cost.py --table JSON...     # docs/torch.md's table

Each round runs ``--calls`` calls of a 2-float ``dist.all_reduce`` four ways, in turns:
blocking and ``async_op=True`` then ``Work.wait()``, on mpicoll's default group and on a Gloo
group, after ``--warmup`` calls of each way (not timed: the groups' first calls set them up).
Per way: the process's CPU time per call (every thread: ``getrusage``, so what the progress
thread and Gloo's threads take counts) and the wall time per call. Rank 0 prints the best and
the median round; writes PATH (default DIR/torch_call_cost-np<N>.json). ``--table`` prints,
per label and rank count, the median over the runs given of each way's median round.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from datetime import timedelta

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import json                                 # noqa: E402
from pathlib import Path                    # noqa: E402

import numpy as np                          # noqa: E402
from mpi4py import MPI                      # noqa: E402

from _util import outdir, parser, say, write_json       # noqa: E402


def cpu_seconds() -> float:
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


WAYS = ("mpicoll blocking", "mpicoll async", "gloo blocking", "gloo async")


def table(paths) -> str:
    """docs/torch.md's table: per label and rank count, each way's median CPU us per call
    (the median over the runs of each run's median round), the runs' range, Gloo / mpicoll."""
    groups: dict = {}
    for path in paths:
        with open(path) as f:
            run = json.load(f)
        groups.setdefault((run.get("label", ""), run["ranks"]), []).append(run)
    rows = ["| tree | N | runs | load | mpicoll blocking | mpicoll async + wait | Gloo blocking "
            "| Gloo async + wait | Gloo / mpicoll, blocking | Gloo / mpicoll, async |",
            "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for (label, ranks), runs in groups.items():
        loads = [x for run in runs for x in run["load_average"]]
        cells, median = [], {}
        for way in WAYS:
            each = [run["rows"][way]["cpu_us_median"] for run in runs]
            median[way] = float(np.median(each))
            cells.append(f"{median[way]:.0f} ({min(each):.0f}-{max(each):.0f})")
        ratios = [median[f"gloo {m}"] / median[f"mpicoll {m}"] for m in ("blocking", "async")]
        rows.append(f"| {label} | {ranks} | {len(runs)} | {min(loads):.1f}-{max(loads):.1f} | "
                    + " | ".join(cells) + " | " + " | ".join(f"{r:.2f}" for r in ratios) + " |")
    return "\n".join(rows)


def main() -> None:
    if "--table" in sys.argv[1:2]:
        ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
        ap.add_argument("--table", nargs="+", metavar="JSON", required=True)
        print(table(ap.parse_args().table))
        return
    ap = parser(__doc__)
    ap.add_argument("--calls", type=int, default=1000, help="calls per round and way")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=200, help="untimed calls per way first")
    ap.add_argument("--label", default="", help="the tree measured, kept in the JSON")
    ap.add_argument("--json", type=Path, help="where to write (default: DIR/"
                    "torch_call_cost-np<N>.json)")
    args = ap.parse_args()
    import torch
    import torch.distributed as dist
    import mpicoll.torch                    # noqa: F401 (registers the "mpicoll" backend)
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    dist.init_process_group("mpicoll", timeout=timedelta(minutes=10))   # (ranks from MPI)
    gloo = dist.new_group(backend="gloo")
    torch.set_num_threads(1)
    x = torch.ones(2)
    load = os.getloadavg()[0]
    ways = [(backend, mode) for backend in ("mpicoll", "gloo") for mode in ("blocking", "async")]
    runs = {f"{b} {m}": [] for b, m in ways}

    def calls(backend, mode, n):
        group = None if backend == "mpicoll" else gloo
        for _ in range(n):
            if mode == "async":
                dist.all_reduce(x, group=group, async_op=True).wait()
            else:
                dist.all_reduce(x, group=group)
    for backend, mode in ways:
        calls(backend, mode, args.warmup)
    for _ in range(args.rounds):
        for backend, mode in ways:
            comm.Barrier()
            c0, t0 = cpu_seconds(), time.perf_counter()
            calls(backend, mode, args.calls)
            runs[f"{backend} {mode}"].append(
                {"cpu_us": (cpu_seconds() - c0) / args.calls * 1e6,
                 "wall_us": (time.perf_counter() - t0) / args.calls * 1e6})
    if rank == 0:
        rows = {}
        say(f"# N={size}, 2-float dist.all_reduce, {args.rounds} rounds of {args.calls} calls, "
            f"load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
        for way, rs in runs.items():
            cpu, wall = [r["cpu_us"] for r in rs], [r["wall_us"] for r in rs]
            rows[way] = {"cpu_us_best": min(cpu), "cpu_us_median": float(np.median(cpu)),
                         "wall_us_best": min(wall), "wall_us_median": float(np.median(wall))}
            say(f"{way:<17} CPU us/call best {min(cpu):6.1f} median {np.median(cpu):6.1f}; "
                f"wall best {min(wall):6.1f} median {np.median(wall):6.1f}")
        path = args.json or outdir(args.outdir) / f"torch_call_cost-np{size}.json"
        write_json(path, {"label": args.label, "ranks": size, "calls": args.calls,
                          "rounds": args.rounds, "warmup": args.warmup,
                    "load_average": [load, os.getloadavg()[0]], "rows": rows, "runs": runs})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
