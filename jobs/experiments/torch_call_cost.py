"""What one small ``dist.all_reduce`` costs on "mpicoll" and on "gloo" (issue 43, item 4).

    mpiexec -n 2 python -m mpi4py jobs/experiments/torch_call_cost.py [--calls 1000]
        [--rounds 5] [--outdir docs/results]

Each round runs ``--calls`` calls of a 2-float ``dist.all_reduce`` four ways, in turns:
blocking and ``async_op=True`` then ``Work.wait()``, on mpicoll's default group and on a Gloo
group. Per way: the process's CPU time per call (every thread: ``getrusage``, so what the
progress thread and Gloo's threads take counts) and the wall time per call. Rank 0 prints
the best and the median round; writes DIR/torch_call_cost-np<N>.json.
"""

from __future__ import annotations

import os
import resource
import time
from datetime import timedelta

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np                          # noqa: E402
from mpi4py import MPI                      # noqa: E402

from _util import outdir, parser, say, write_json       # noqa: E402


def cpu_seconds() -> float:
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--calls", type=int, default=1000, help="calls per round and way")
    ap.add_argument("--rounds", type=int, default=5)
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
    for _ in range(args.rounds):
        for backend, mode in ways:
            group = None if backend == "mpicoll" else gloo
            comm.Barrier()
            c0, t0 = cpu_seconds(), time.perf_counter()
            for _ in range(args.calls):
                if mode == "async":
                    dist.all_reduce(x, group=group, async_op=True).wait()
                else:
                    dist.all_reduce(x, group=group)
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
        write_json(outdir(args.outdir) / f"torch_call_cost-np{size}.json",
                   {"ranks": size, "calls": args.calls, "rounds": args.rounds,
                    "load_average": [load, os.getloadavg()[0]], "rows": rows, "runs": runs})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
