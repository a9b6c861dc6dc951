"""``mpicoll calibrate``: measure alpha, beta and gamma for the cost model; write a profile.

    mpiexec -n 2 mpicoll calibrate -o profile.json        # one node
    srun -N 2 --ntasks-per-node=2 mpicoll calibrate ...   # also the inter-node link

alpha and beta come from a ping-pong between rank 0 and one partner on its node (and one on
another node, when there is one), made of the same calls the executor makes (Isend, Irecv,
Waitall from Python), so the per-message cost includes mpi4py's and Python's overhead -- the
alpha that mpicoll's algorithms really pay. One-way time t(n) = round trip / 2, median of many;
alpha is t at 8 bytes and beta the least-squares slope of t over the sizes from 64 KiB up (sizes
8, 32, 128 ... x4 up to -e; beta needs at least 3 of them, so -e is at least 2M). A fit whose
slope is not positive or whose points are far from a line (R^2 < 0.9) is written with the reason
in the profile's meta["unreliable"] and a warning. gamma is the time per byte of the numba SUM
kernel on float32 vectors of 1 MiB to 16 MiB; overhead the time of one call through mpicoll's
Python layer with no messages. Other ranks wait.
"""

from __future__ import annotations

import socket
import sys
import time

import numpy as np
from mpi4py import MPI

import mpicoll

from ..kernels import sum_into, warmup
from ..model import Profile
from .cli import Parser, check_settings, positive_int, prepare_output
from .sizes import size_arg

__all__ = ["main", "pingpong", "kernel_gamma", "fit", "message_sizes"]

FIT_FROM = 64 << 10     # beta is fitted over the sizes from here up
FIT_POINTS = 3          # ... and needs at least this many of them


def pingpong(comm, a: int, b: int, nbytes: int, iters: int) -> float | None:
    """Median one-way time between ranks a and b (None on the other ranks)."""
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
    warmup("sum", np.float32)
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


def message_sizes(maxbytes: int) -> list[int]:
    """The ping-pong sizes: 8, 32, 128 ... (x4) up to ``maxbytes``."""
    sizes = [8]
    while sizes[-1] * 4 <= maxbytes:
        sizes.append(sizes[-1] * 4)
    return sizes


def fit(sizes, times) -> tuple[float, float, list[str]]:
    """alpha = time of the smallest message; beta = least-squares slope of time over the sizes
    >= 64 KiB; and the reasons not to trust them (none: a sound fit).

    ``ValueError`` if fewer than 3 sizes are >= 64 KiB: a slope through one or two points is
    noise, not a bandwidth."""
    large = [(s, t) for s, t in zip(sizes, times) if s >= FIT_FROM]
    if len(large) < FIT_POINTS:
        raise ValueError(f"beta needs at least {FIT_POINTS} sizes >= {FIT_FROM} B, got "
                         f"{len(large)} ({', '.join(str(s) for s, _ in large) or 'none'})")
    x = np.array([s for s, _ in large], float)
    y = np.array([t for _, t in large], float)
    dx, dy = x - x.mean(), y - y.mean()
    beta = float(dx @ dy / (dx @ dx))
    residual = dy - beta * dx
    r2 = float(1 - residual @ residual / (dy @ dy)) if dy @ dy > 0 else 0.0
    problems = []
    if beta <= 0:
        problems.append(f"the time does not grow with the size from {int(x[0])} to {int(x[-1])} B "
                        f"(slope {beta:.3g} s/B; beta set to 1e-15): noise")
    elif r2 < 0.9:
        problems.append(f"the times from {int(x[0])} to {int(x[-1])} B are far from a line "
                        f"(R^2 = {r2:.2f} < 0.9): noise")
    return times[0], max(beta, 1e-15), problems


def main(argv=None) -> int:
    ap = Parser("mpicoll calibrate", __doc__)
    ap.add_argument("-o", "--output", default="profile.json", help="the profile to write")
    ap.add_argument("-e", "--maxbytes", type=size_arg, default="4M",
                    help="largest ping-pong size (at least 2M: beta needs 3 sizes >= 64K)")
    ap.add_argument("-n", "--iters", type=positive_int, default=200,
                    help="round trips per size (at most a 64 MiB volume, at least 10)")
    args = ap.parse_args(argv)
    check_settings(ap)
    sizes = message_sizes(args.maxbytes)
    if sum(s >= FIT_FROM for s in sizes) < FIT_POINTS:
        need = [s for s in message_sizes(1 << 40) if s >= FIT_FROM][FIT_POINTS - 1]
        ap.error(f"-e {args.maxbytes} B leaves too few sizes to fit beta: it needs at least "
                 f"{FIT_POINTS} sizes >= 64K, so -e {need // (1 << 20)}M or more")

    world = MPI.COMM_WORLD
    if world.Get_size() < 2:
        ap.error("needs at least 2 ranks (mpiexec -n 2 mpicoll calibrate), got 1")
    problem = world.bcast(prepare_output(args.output) if world.Get_rank() == 0 else None, root=0)
    if problem:
        ap.error(problem)
    comm = world.Dup()
    rank, size = comm.Get_rank(), comm.Get_size()
    host = comm.allgather(socket.gethostname())
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    node_of = comm.allgather(local.bcast(rank, root=0))     # each rank's node, by its first rank
    local.Free()
    intra = next((r for r in range(1, size) if node_of[r] == node_of[0]), None)
    inter = next((r for r in range(1, size) if node_of[r] != node_of[0]), None)
    links = {}
    for name, partner in (("intra", intra), ("inter", inter)):
        if partner is None:
            continue
        times = [pingpong(comm, 0, partner, n, max(10, min(args.iters, (64 << 20) // n)))
                 for n in sizes]
        if rank == 0:
            alpha, beta, problems = fit(sizes, times)
            links[name] = {"partner": partner, "sizes": sizes, "one_way_s": times,
                           "fit": (alpha, beta), "unreliable": problems}
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
        unreliable = [f"{name} link: {p}" for name, link in links.items()
                      for p in link["unreliable"]]
        if unreliable:
            profile.meta["unreliable"] = unreliable
        profile.to_json(args.output)
        print(f"alpha = {alpha * 1e6:.2f} us, beta = {beta * 1e9:.4f} ns/B "
              f"({1e-9 / beta:.2f} GB/s), gamma = {gamma * 1e9:.4f} ns/B "
              f"({1e-9 / gamma:.2f} GB/s), overhead = {overhead * 1e6:.2f} us per call")
        if "inter" in links:
            a, b = links["inter"]["fit"]
            print(f"inter-node: alpha = {a * 1e6:.2f} us, beta = {b * 1e9:.4f} ns/B")
        for reason in unreliable:
            print(f"mpicoll calibrate: warning: beta is unreliable: {reason}; measure again on "
                  "a quieter machine (or with a larger -n)", file=sys.stderr)
        print(f"wrote {args.output}" + (" (marked unreliable in meta)" if unreliable else ""))
    comm.Free()
    return 0
