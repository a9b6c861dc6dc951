"""Lab 4 of the seed: the latency ladder's bottom rungs, measured -- 8-byte round trips.

    python jobs/labs/lab_ladder.py [--iters 5000] [--json FILE] [--png FILE]

Seed 000 ("Lab 4"): two processes ping-pong 8 bytes over localhost TCP (with TCP_NODELAY), then
over a shared mmap page with busy-waiting: ~17 us per round trip against ~0.6 us on one
laptop-class machine, 20-30x -- the kernel in the path against plain memory. Its traps: without
TCP_NODELAY you measure Nagle's delay (tens of ms), and a zero-filled page fakes the first
acknowledgement unless the flag never takes the value 0.

Here, on this machine (all loopback, 127.0.0.1; every loop bounded):
  * TCP with TCP_NODELAY;
  * TCP without it, a few round trips only, in two patterns: one 8-byte write each way (the
    reply carries the ACK, so Nagle has nothing to hold back), and the same 8 bytes written as
    4 + 4 (the second write waits for the peer's delayed ACK -- Nagle's delay);
  * the shared page: an anonymous MAP_SHARED mmap inherited across fork, flags 1..254 never 0;
  * MPI ping-pong through mpi4py (MPICH's shared-memory path) and one mpicoll all-reduce of 8
    bytes at N = 2, run as ``mpiexec -n 2`` by this lab (``--mpi`` is that part).
Each rung is printed with its ratio to the shared-page rung: the best of 20 batches, the two
processes pinned to different CPUs. The machine is shared: the busy-wait rungs suffer whenever
the two processes do not both hold a core.
"""

from __future__ import annotations

import json
import mmap
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lab_common import claim, mpiexec, parser, save_figure, write_json

PING, ACK = 0, 8


def _best(xs):
    """The fastest batch: on a shared machine the others measure who else got the cores."""
    return min(xs)


CPUS = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


def _pin(cpu: int | None) -> None:
    """Put this process on one CPU (the two ends of a ping-pong on different ones); None: on
    all of them again."""
    if len(CPUS) >= 2:
        os.sched_setaffinity(0, set(CPUS) if cpu is None else {CPUS[cpu % len(CPUS)]})


def tcp_rtt(iters: int, nodelay: bool, split: bool = False, batches: int = 20) -> float:
    """Seconds per 8-byte round trip over 127.0.0.1 (the best of ``batches`` batches)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    total = iters * batches + 1             # + 1: an untimed first round trip (start-up)
    ctx = mp.get_context("fork")

    def echo():
        _pin(1)
        c, _ = srv.accept()
        if nodelay:
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        c.settimeout(30)
        for _ in range(total):
            got = b""
            while len(got) < 8:
                got += c.recv(8 - len(got))
            c.sendall(b"Y" * 8)
        c.close()

    p = ctx.Process(target=echo)
    p.start()
    c = socket.create_connection(("127.0.0.1", srv.getsockname()[1]), timeout=30)
    if nodelay:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    times = []
    try:
        for batch in range(-1, batches):
            t0 = time.perf_counter()
            for _ in range(1 if batch < 0 else iters):
                if split:
                    c.send(b"X" * 4)
                    c.send(b"X" * 4)
                else:
                    c.send(b"X" * 8)
                got = b""
                while len(got) < 8:
                    got += c.recv(8 - len(got))
            if batch >= 0:
                times.append((time.perf_counter() - t0) / iters)
    finally:
        c.close()
        srv.close()
        p.join(30)
        if p.is_alive():
            p.kill()
    return _best(times)


def shm_rtt(iters: int, batches: int = 20, limit_s: float = 20.0) -> float:
    """Seconds per round trip through a shared page, busy-waiting (the best of ``batches``)."""
    page = mmap.mmap(-1, 4096)              # anonymous, MAP_SHARED: shared with the fork
    total = iters * batches + 1             # + 1: an untimed first round trip (start-up)
    ctx = mp.get_context("fork")

    def pong():
        _pin(1)
        seen, deadline = 0, time.monotonic() + limit_s
        for _ in range(total):
            while page[PING] == seen:       # busy-wait, as a NIC's completion queue is polled
                if time.monotonic() > deadline:
                    return
            seen = page[PING]
            page[ACK] = seen

    p = ctx.Process(target=pong)
    p.start()
    times, i, deadline = [], 0, time.monotonic() + limit_s
    for batch in range(-1, batches):
        t0 = time.perf_counter()
        for _ in range(1 if batch < 0 else iters):
            flag = i % 254 + 1              # never 0: the zeroed page would fake the first ACK
            i += 1
            page[PING] = flag
            while page[ACK] != flag:
                if time.monotonic() > deadline:
                    raise TimeoutError("shared-page ping-pong: no answer (bounded loop)")
        if batch >= 0:
            times.append((time.perf_counter() - t0) / iters)
    p.join(10)
    if p.is_alive():
        p.kill()
    return _best(times)


def mpi_rungs(iters: int, batches: int = 20) -> dict | None:
    """Under mpiexec -n 2: 8-byte MPI ping-pong and one mpicoll all-reduce of 8 bytes."""
    import numpy as np
    from mpi4py import MPI

    import mpicoll
    comm = MPI.COMM_WORLD.Dup()
    rank, other = comm.Get_rank(), 1 - comm.Get_rank()
    buf = np.zeros(1)
    out = {}

    def timed(body):
        body()                                  # warm-up
        times = []
        for _ in range(batches):
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                body()
            times.append((time.perf_counter() - t0) / iters)
        return _best(times)

    def pingpong():
        if rank == 0:
            comm.Send(buf, other)
            comm.Recv(buf, other)
        else:
            comm.Recv(buf, other)
            comm.Send(buf, other)

    out["mpi_pingpong"] = timed(pingpong)
    x = np.ones(1)
    for algorithm in ("ring", "mpi"):
        out[f"mpicoll_allreduce_{algorithm}"] = timed(
            lambda: mpicoll.allreduce(x, algorithm=algorithm, comm=comm))
    out["mpi_library"] = MPI.Get_library_version().splitlines()[0].strip()
    comm.Free()
    return out if rank == 0 else None


def run_mpi(iters: int) -> dict | None:
    """This lab's --mpi part under ``mpiexec -n 2``; None (with a note) if it cannot run."""
    launcher = mpiexec()
    if not launcher:
        print("# no mpiexec: MPI rungs skipped", file=sys.stderr)
        return None
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "mpi.json"
        proc = subprocess.run([launcher, "-n", "2", sys.executable, "-m", "mpi4py", __file__,
                               "--mpi", "--iters", str(iters), "--json", str(out)],
                              capture_output=True, text=True, timeout=300)
        if proc.returncode != 0 or not out.exists():
            print(f"# MPI rungs failed: {proc.stderr[-2000:]}", file=sys.stderr)
            return None
        return json.loads(out.read_text())


def ratio(x: float) -> str:
    return f"{x:.1f}x" if x < 10 else f"{x:,.0f}x"


def main(argv=None) -> int:
    ap = parser(__doc__, png="the rungs, log scale")
    ap.add_argument("--iters", type=int, default=5000, help="round trips per rung (20 batches)")
    ap.add_argument("--nagle-iters", type=int, default=5, help="round trips without NODELAY")
    ap.add_argument("--mpi", action="store_true", help="(under mpiexec -n 2) the MPI rungs only")
    args = ap.parse_args(argv)
    if args.mpi:
        res = mpi_rungs(args.iters)
        if res is not None and args.json:
            args.json.write_text(json.dumps(res))
        return 0

    load = os.getloadavg()[0]
    rungs = {}
    _pin(0)
    batch = max(1, args.iters // 20)
    rungs["shared mmap page, busy-wait"] = shm_rtt(batch)
    rungs["TCP 127.0.0.1, TCP_NODELAY"] = tcp_rtt(batch, nodelay=True)
    rungs["TCP, no NODELAY, one 8-byte write"] = tcp_rtt(args.nagle_iters, nodelay=False,
                                                         batches=5)
    rungs["TCP, no NODELAY, 4+4-byte writes"] = tcp_rtt(args.nagle_iters, nodelay=False,
                                                        split=True, batches=1)
    _pin(None)                              # mpiexec's ranks place themselves
    mpi = run_mpi(max(1, min(args.iters, 2000) // 20))
    if mpi:
        rungs["MPI ping-pong (mpi4py)"] = mpi["mpi_pingpong"]
        rungs["mpicoll.allreduce ring, N=2, 8 B"] = mpi["mpicoll_allreduce_ring"]
        rungs["MPI_Allreduce via mpicoll (mpi), N=2"] = mpi["mpicoll_allreduce_mpi"]
    shm = rungs["shared mmap page, busy-wait"]
    print(f"# 8-byte round trips on this machine: {os.cpu_count()} cores, load average "
          f"{load:.1f} when the lab started; best of 20 batches; ratio to the shared page")
    for name, t in sorted(rungs.items(), key=lambda kv: kv[1]):
        print(f"  {name:<40} {t * 1e6:>10.2f} us   {ratio(t / shm):>9}")
    tcp = rungs["TCP 127.0.0.1, TCP_NODELAY"]
    print(f"# seed: ~17 us TCP vs ~0.6 us shared memory, 20-30x; ours: {tcp * 1e6:.1f} us vs "
          f"{shm * 1e6:.2f} us, {ratio(tcp / shm)}")
    write_json(args.json, {"seconds_per_round_trip": rungs, "iters": args.iters,
                           "load_average": load,
                           "nagle_iters": args.nagle_iters, "cores": os.cpu_count(),
                           "mpi_library": mpi and mpi.get("mpi_library")})

    def draw(plt):
        fig, ax = plt.subplots(figsize=(7, 3.6))
        items = sorted(rungs.items(), key=lambda kv: kv[1])
        ax.barh([k for k, _ in items], [v * 1e6 for _, v in items], color="C0")
        ax.barh(["seed: shared memory", "seed: TCP 127.0.0.1"], [0.6, 17], color="C3",
                label="seed (laptop-class machine)")
        ax.set_xscale("log")
        ax.set_xlabel("round trip (us), log scale")
        ax.set_title("8-byte round trips, this machine")
        ax.legend(fontsize=8)
        return fig
    save_figure(args.png, draw)
    claim("lab_ladder", "~17 us TCP vs ~0.6 us shared memory (20-30x)",
          f"{tcp * 1e6:.1f} us TCP vs {shm * 1e6:.2f} us shared page ({ratio(tcp / shm)})"
          + (f"; MPI ping-pong {mpi['mpi_pingpong'] * 1e6:.1f} us, mpicoll ring all-reduce "
             f"{mpi['mpicoll_allreduce_ring'] * 1e6:.1f} us" if mpi else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
