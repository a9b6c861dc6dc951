"""What a waiting request costs the computation beside it (issue 43, item 2).

    mpiexec -n 2 python -m mpi4py jobs/experiments/wait_cost.py [--bytes 16M] [--late 0.2]
        [--rounds 7] [--algorithms auto,ring] [--outdir docs/results]

Rank 0 starts ``mpicoll.iallreduce`` of ``--bytes`` (float32) and at once runs a 1-thread
compute loop of ``--late`` / 4 seconds of CPU; every other rank sleeps (no CPU) ``--late``
seconds, and until rank 0's loop has ended (a message from rank 0), before it starts the same
call: rank 0's request waits for a late peer the whole time its loop runs, however long a busy
machine makes the loop. Three kinds of round take turns, ``--rounds`` times each: the loop
alone (no request in flight), beside the request, and beside the request with a second thread
blocked in its ``wait()`` (as torch's completer thread is while DDP's backward runs). Loops: a
numba loop (``nogil``, as mpicoll's own kernels), a numpy matmul (BLAS releases the GIL; one
BLAS thread), a torch matmul when torch imports, and a sleep of ``--late`` (no compute: what
the waiting threads take when the core is theirs for the asking).

Per round: the loop's wall time and CPU time (its thread's clock), and the CPU seconds of each
of mpicoll's threads (``mpicoll-progress``, ``mpicoll-torch-completer``, ``mpicoll-detector``,
and the waiter; ``pthread_getcpuclockid``) from the start of the call to the end of the loop.
slowdown = median wall time beside the request / median alone - 1; paired slowdown = the
median over rounds of (beside / alone, the round of each kind run one after the other) - 1,
which a machine's load drifting from round to round moves less. On a shared machine wall
times are noisy (other processes take the cores too); the threads' CPU seconds are not: they
are what waiting takes from the computation. Writes DIR/wait_cost-np<N>.json;
``python jobs/experiments/wait_cost.py --table A.json [B.json ...]`` prints docs/training.md's
table of such runs side by side (no MPI).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")        # one BLAS thread per rank: the ranks share cores

import numpy as np                          # noqa: E402
from mpi4py import MPI                      # noqa: E402
from numba import njit                      # noqa: E402

import mpicoll                              # noqa: E402
from mpicoll.executors import progress      # noqa: E402
from _util import outdir, parser, say, write_json       # noqa: E402

THREADS = ("mpicoll-progress", "mpicoll-torch-completer", "mpicoll-detector", "waiter")
KINDS = ("alone", "beside a request", "beside a request and its waiter")


@njit(cache=True, nogil=True)
def _spin(x, rounds):
    """A compute loop: ``rounds`` passes of a multiply-add over ``x`` (in cache)."""
    acc = 0.0
    for _ in range(rounds):
        for i in range(x.size):
            acc += x[i] * 1.0000001
    return acc


def loops() -> dict:
    """name -> fn(work): one run of the loop, ``work`` units."""
    x = np.random.default_rng(0).random(4096)
    a = np.random.default_rng(1).random((128, 128))
    out = {"sleep": lambda work: time.sleep(work * 1e-3),     # no compute: the threads' appetite
           "numba loop": lambda work: _spin(x, work),
           "numpy matmul": lambda work: [a @ a for _ in range(work)]}
    try:
        import torch
        torch.set_num_threads(1)
        t = torch.rand(128, 128)
        out["torch matmul"] = lambda work: [t @ t for _ in range(work)]
    except ImportError:
        pass
    return out


def thread_cpu() -> dict:
    """CPU seconds so far of each of mpicoll's threads alive in this process."""
    out = {}
    for t in threading.enumerate():
        if t.name in THREADS and t.ident is not None:
            try:
                out[t.name] = time.clock_gettime(time.pthread_getcpuclockid(t.ident))
            except (OSError, ProcessLookupError):
                pass
    return out


def quiet_barrier(comm) -> None:
    """A barrier that sleeps while it waits (MPI_Barrier spins: it would take a core from the
    rank still computing)."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(1e-3)


def calibrate(fn, seconds: float) -> int:
    """Work units for about ``seconds`` of this thread's CPU."""
    fn(1)                                   # (compiled, warm)
    work = 1
    while True:
        t0 = time.thread_time()
        fn(work)
        spent = time.thread_time() - t0
        if spent > 0.02:
            return max(1, int(work * seconds / spent))
        work *= 4


def main() -> None:
    if sys.argv[1:2] == ["--table"]:            # a table of recorded runs; no MPI
        print(table(sys.argv[2:]))
        return
    from torch_backends import parse_size    # noqa: PLC0415 (same folder; no torch needed)
    ap = parser(__doc__)
    ap.add_argument("--bytes", default="16M", help="all-reduce size (default 16M)")
    ap.add_argument("--late", type=float, default=0.2, help="the peers' delay, seconds")
    ap.add_argument("--rounds", type=int, default=7, help="rounds of each kind per loop")
    ap.add_argument("--algorithms", default="auto,ring")
    args = ap.parse_args()
    comm, signal = MPI.COMM_WORLD.Dup(), MPI.COMM_WORLD.Dup()
    rank, size = comm.Get_rank(), comm.Get_size()
    count = parse_size(args.bytes) // 4
    x, out = np.ones(count, np.float32), np.empty(count, np.float32)
    say(f"# N={size}, {count * 4} B all-reduce, peers {args.late * 1e3:.0f} ms late, "
        f"progress={progress.mode()}, {args.rounds} rounds per kind, "
        f"load average {os.getloadavg()[0]:.1f}")
    rows = []
    for algorithm in args.algorithms.split(","):
        for _ in range(2):                  # warm up: windows, scratch, the thread
            mpicoll.iallreduce(x, out, algorithm=algorithm, comm=comm).wait()
        for name, fn in loops().items():
            work = int(args.late * 1e3) if name == "sleep" else \
                comm.bcast(calibrate(fn, args.late / 4) if rank == 0 else None)
            runs = {kind: [] for kind in KINDS}
            for _ in range(args.rounds):
                for kind in runs:
                    quiet_barrier(comm)
                    if rank == 0:
                        before, c0, t0 = thread_cpu(), time.thread_time(), time.perf_counter()
                        req = None if kind == "alone" else \
                            mpicoll.iallreduce(x, out, algorithm=algorithm, comm=comm)
                        if kind == KINDS[2]:        # as torch's completer thread does
                            waiter = threading.Thread(target=req.wait, name="waiter")
                            waiter.start()
                        fn(work)
                        t1, c1, after = time.perf_counter(), time.thread_time(), thread_cpu()
                        runs[kind].append({"wall_s": t1 - t0, "cpu_s": c1 - c0,
                                           "threads_cpu_s": {k: v - before.get(k, 0.0)
                                                             for k, v in after.items()}})
                        for peer in range(1, size):     # the loop is over: come now
                            signal.send(None, peer)
                        if req is not None:
                            runs[kind][-1]["done_before_loop_ended"] = req.done
                            req.wait()
                        if kind == KINDS[2]:
                            waiter.join()
                    else:                   # late, sleeping: no CPU taken from rank 0
                        time.sleep(args.late)
                        heard = signal.irecv(source=0)
                        while not heard.Test():
                            time.sleep(1e-3)
                        if kind != "alone":
                            mpicoll.iallreduce(x, out, algorithm=algorithm, comm=comm).wait()
            if rank == 0:
                row = summary(algorithm, name, runs)
                rows.append(row)
                say(f"{algorithm:>5} {name:<13} alone {row['alone_wall_ms']:6.1f} ms")
                for kind in KINDS[1:]:
                    r = row[kind]
                    say(f"      {kind:<32} {r['wall_ms']:6.1f} ms ({r['slowdown'] * 100:+5.1f} %, "
                        f"paired {r['paired_slowdown'] * 100:+5.1f} %)"
                        f", CPU of mpicoll's threads: {r['threads_cpu_ms']} ms "
                        f"({r['threads_core_share'] * 100:.1f} % of a core)")
    if rank == 0:
        write_json(outdir(args.outdir) / f"wait_cost-np{size}.json",
                   {"ranks": size, "bytes": count * 4, "late_s": args.late,
                    "rounds": args.rounds, "load_average": os.getloadavg()[0], "rows": rows})


def table(paths) -> str:
    """docs/training.md's table: per algorithm and loop, for each JSON file (e.g. before and
    after a change), the paired slowdown beside a request and the CPU share of mpicoll's
    threads (with the waiter thread), medians."""
    runs = [json.loads(open(p).read()) for p in paths]
    head = " | ".join(f"slowdown, {i + 1} | threads' CPU, {i + 1}" for i in range(len(runs)))
    out = [f"| algorithm | loop | {head} |", "|---|---|" + "---:|---:|" * len(runs)]
    for k, row in enumerate(runs[0]["rows"]):
        cells = []
        for data in runs:
            r = data["rows"][k][KINDS[2]]
            slowdown = paired(data["rows"][k]["runs"], KINDS[2])
            cells.append(f"{slowdown * 100:+.1f} % | {r['threads_core_share'] * 100:.1f} %")
        out.append(f"| {row['algorithm']} | {row['loop']} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def paired(runs: dict, kind: str) -> float:
    """The median over rounds of (``kind``'s wall time / the loop alone's, same round) - 1."""
    return float(np.median([b["wall_s"] / a["wall_s"]
                            for a, b in zip(runs["alone"], runs[kind])])) - 1


def summary(algorithm: str, name: str, runs: dict) -> dict:
    med = lambda rs, k: float(np.median([r[k] for r in rs]))   # noqa: E731
    alone = med(runs["alone"], "wall_s")
    row = {"algorithm": algorithm, "loop": name, "alone_wall_ms": alone * 1e3,
           "alone_cpu_ms": med(runs["alone"], "cpu_s") * 1e3}
    for kind in KINDS[1:]:
        rs = runs[kind]
        threads = sorted({k for r in rs for k in r["threads_cpu_s"]})
        row[kind] = {"wall_ms": med(rs, "wall_s") * 1e3, "cpu_ms": med(rs, "cpu_s") * 1e3,
                     "slowdown": med(rs, "wall_s") / alone - 1,
                     "paired_slowdown": paired(runs, kind),
                     "done_before_loop_ended": sum(r["done_before_loop_ended"] for r in rs),
                     "threads_cpu_ms": {k: round(float(np.median(
                         [r["threads_cpu_s"].get(k, 0.0) for r in rs])) * 1e3, 2)
                         for k in threads},
                     "threads_core_share": float(np.median(     # of one core, while waiting
                         [sum(r["threads_cpu_s"].values()) / r["wall_s"] for r in rs]))}
    row["runs"] = runs
    return row


if __name__ == "__main__":
    main()
