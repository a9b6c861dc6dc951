"""``mpicoll calibrate``: measure alpha, beta and gamma for the cost model; write a profile.

    mpiexec -n 2 mpicoll calibrate -o profile.json        # one node
    srun -N 2 --ntasks-per-node=2 mpicoll calibrate ...   # also the inter-node link

alpha and beta come from a ping-pong between rank 0 and one partner on its node (and one on
another node, when there is one), made of the same calls the executor makes (Isend, Irecv,
Waitall from Python), so the per-message cost includes mpi4py's and Python's overhead -- the
alpha that mpicoll's algorithms really pay. One-way time t(n) = round trip / 2, median of many;
alpha is t at 8 bytes and beta the least-squares slope of t over the sizes from 64 KiB up. gamma is the time
per byte of the numba SUM kernel on float32 vectors of 1 MiB to 16 MiB; overhead the time of one
call through mpicoll's Python layer with no messages. Other ranks wait.
"""

from __future__ import annotations

import argparse
import socket
import time

import numpy as np

from ..model import Profile
from .sizes import parse_size

__all__ = ["main", "pingpong", "kernel_gamma"]


def pingpong(comm, a: int, b: int, nbytes: int, iters: int) -> float | None:
    """Median one-way time between ranks a and b (None on the other ranks)."""
    from mpi4py import MPI
    rank = comm.Get_rank()
    buf = np.zeros(max(nbytes, 1), np.uint8)
    times = []
    for _ in range(iters + 3):
        if rank == a:
            t0 = MPI.Wtime()
            MPI.Request.Waitall([comm.Isend(buf, b, 7)])
            MPI.Request.Waitall([comm.Irecv(buf, b, 7)])
            times.append((MPI.Wtime() - t0) / 2)
        elif rank == b:
            MPI.Request.Waitall([comm.Irecv(buf, a, 7)])
            MPI.Request.Waitall([comm.Isend(buf, a, 7)])
    return float(np.median(times[3:])) if rank == a else None


def kernel_gamma() -> float:
    """Seconds per byte of the float32 SUM kernel (best of several runs at 1..16 MiB)."""
    from ..kernels import sum_into, warmup
    warmup()
    rates = []
    for mib in (1, 4, 16):
        n = mib * (1 << 20) // 4
        acc, x = np.ones(n, np.float32), np.ones(n, np.float32)
        best = min(_timed(sum_into, acc, x) for _ in range(5))
        rates.append(best / (4 * n))
    return float(np.median(rates))


def call_overhead() -> float:
    """Seconds of one call through mpicoll's Python layer: a 1-element all-reduce on
    COMM_SELF (argument checks, state and schedule lookup; no messages)."""
    import mpicoll
    from mpi4py import MPI
    x, out = np.ones(1, np.float32), np.empty(1, np.float32)
    times = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(2000):
            mpicoll.allreduce(x, out, algorithm="ring", comm=MPI.COMM_SELF)
        times.append((time.perf_counter() - t0) / 2000)
    return float(np.median(times))


def _timed(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def fit(sizes, times) -> tuple[float, float]:
    """alpha = time of the smallest message; beta = least-squares slope over sizes >= 64 KiB."""
    large = [(s, t) for s, t in zip(sizes, times) if s >= 64 << 10] or list(zip(sizes, times))[-2:]
    beta = float(np.polyfit([s for s, _ in large], [t for _, t in large], 1)[0])
    return times[0], max(beta, 1e-15)


def main(argv=None) -> int:
    from mpi4py import MPI

    ap = argparse.ArgumentParser(prog="mpicoll calibrate", description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--output", default="profile.json")
    ap.add_argument("-e", "--maxbytes", default="4M")
    ap.add_argument("-n", "--iters", type=int, default=200)
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD.Dup()
    rank, size = comm.Get_rank(), comm.Get_size()
    if size < 2:
        raise SystemExit("mpicoll calibrate needs at least 2 ranks")
    host = comm.allgather(socket.gethostname())
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    node_of = comm.allgather(local.bcast(rank, root=0))     # each rank's node, by its first rank
    local.Free()
    intra = next((r for r in range(1, size) if node_of[r] == node_of[0]), None)
    inter = next((r for r in range(1, size) if node_of[r] != node_of[0]), None)
    sizes = [8]
    while sizes[-1] * 4 <= parse_size(args.maxbytes):
        sizes.append(sizes[-1] * 4)
    links = {}
    for name, partner in (("intra", intra), ("inter", inter)):
        if partner is None:
            continue
        times = [pingpong(comm, 0, partner, n, max(10, min(args.iters, (64 << 20) // n)))
                 for n in sizes]
        if rank == 0:
            links[name] = {"partner": partner, "sizes": sizes, "one_way_s": times,
                           "fit": fit(sizes, times)}
        comm.Barrier()
    gamma = kernel_gamma() if rank == 0 else None
    overhead = call_overhead() if rank == 0 else None
    if rank == 0:
        base = links.get("intra") or links["inter"]
        alpha, beta = base["fit"]
        profile = Profile(alpha, beta, gamma, overhead=overhead)
        if "inter" in links:
            profile.alpha_inter, profile.beta_inter = links["inter"]["fit"]
        profile.meta = {"hosts": list(dict.fromkeys(host)), "nranks": size,
                        "mpi_library": MPI.Get_library_version().splitlines()[0].strip(),
                        "date": time.strftime("%Y-%m-%d"), "links": links,
                        "command": "mpicoll calibrate " + " ".join(argv or [])}
        profile.to_json(args.output)
        print(f"alpha = {alpha * 1e6:.2f} us, beta = {beta * 1e9:.4f} ns/B "
              f"({1e-9 / beta:.2f} GB/s), gamma = {gamma * 1e9:.4f} ns/B "
              f"({1e-9 / gamma:.2f} GB/s), overhead = {overhead * 1e6:.2f} us per call")
        if "inter" in links:
            a, b = links["inter"]["fit"]
            print(f"inter-node: alpha = {a * 1e6:.2f} us, beta = {b * 1e9:.4f} ns/B")
        print(f"wrote {args.output}")
    comm.Free()
    return 0
