"""The warm-up guide's Lab 01, step 2: bytes per rank, counted -- ring vs naive vs star.

    mpiexec -n 4 python -m mpi4py jobs/labs/lab_bytes.py [--max-n 8] [--json FILE] [--png FILE]
    python jobs/labs/lab_bytes.py            # no MPI job: every N from the in-process executor

Seed 001 (chapter 3): the ring all-reduce moves 2(N-1)/N.V per rank, which tends to 2V however
large N grows, while the naive "all-gather everything, then sum locally" moves N.V per rank (N
times worse). Seed 000: the naive star (gather to a root, broadcast back) bottlenecks the
root's link at (N-1).V in and (N-1).V out, growing with N where the ring stays flat.

Here the bytes are counted by mpicoll's MPI executor as it sends
(``mpicoll.testing.traffic(comm)`` for ``mpicoll.allreduce``; the executor's own counter dict
for the star, whose schedule is built in this lab), on sub-communicators of N = 2 .. (ranks in the job) of one mpiexec job. The larger N
up to --max-n come from the in-process executor running the same schedules (this machine
allows 4 MPI ranks); where both exist the lab checks they count the same. Both are counts, not
measurements: each executor adds up the bytes of the sends it posts, which the schedule lists,
so their agreement shows that the MPI executor posts the schedule's sends (no more, no fewer),
not what the MPI library put on a wire. ``naive`` is the
registered teaching algorithm (``mpicoll/algorithms/allreduce_naive.py``).

Then the seed's quiz 3 (seed 000): N = 8, a 1 GiB gradient, 25 GB/s per link, 2 us per hop:
the ring's bytes per link, steps and completion time, and the star's with the root's single
50 GB/s NIC; and what each does as N doubles -- computed on the in-process executor's
alpha-beta clock over the same schedules (a step lasts alpha + beta.max(bytes out, bytes in)).
"""

from __future__ import annotations

import numpy as np
from lab_common import claim, parser, save_figure, write_json
from mpi4py import MPI

import mpicoll
from mpicoll import kernels, testing
from mpicoll.simulators import inprocess
from mpicoll.executors.python import execute, new_traffic
from mpicoll.schedule import Recv, Schedule, Send, make_schedule

COUNT = 840 * 32            # float64 elements: 215,040 bytes, divisible by every N in 2..8
GIB = 1 << 30


def star(rank: int, size: int, count: int) -> Schedule:
    """Gather to rank 0, which reduces in rank order, then send the sum to every rank."""
    others = range(1, size)
    if rank == 0:
        return make_schedule([[Recv(peer, 0, count, reduce=True) for peer in others],  # gather
                              [Send(peer, 0, count) for peer in others]])              # bcast
    return make_schedule([[Send(0, 0, count)], [Recv(0, 0, count, reduce=False)]])


def measure_mpi(sub: MPI.Intracomm, count: int) -> dict:
    """This rank's bytes sent/received by the MPI executor for ring, naive and star."""
    x = np.full(count, sub.rank + 1.0)
    want = sub.size * (sub.size + 1) / 2
    out = {}
    for algorithm in ("ring", "naive"):
        traffic = testing.traffic(sub)
        before = dict(traffic)
        got = mpicoll.allreduce(x, algorithm=algorithm, comm=sub)
        assert (got == want).all(), f"{algorithm}: wrong sum on rank {sub.rank}"
        out[algorithm] = (traffic["bytes_sent"] - before["bytes_sent"],
                          traffic["bytes_received"] - before["bytes_received"])
    sched = star(sub.rank, sub.size, count)
    buf, traffic = x.copy(), new_traffic()
    dup = sub.Dup()
    try:
        execute(sched, buf, dup, reduce_into=kernels.kernel("sum", buf.dtype), tag=1,
                scratch=np.empty(sched.scratch_elements), traffic=traffic)
    finally:
        dup.Free()
    assert (buf == want).all(), f"star: wrong sum on rank {sub.rank}"
    out["star"] = (traffic["bytes_sent"], traffic["bytes_received"])
    return out


def count_inprocess(n: int, count: int) -> list[dict]:
    """Every rank's bytes (sent, received) for ring, naive and star on the in-process executor."""
    per_rank = [{} for _ in range(n)]
    for name in ("ring", "naive", "star"):
        scheds = ([star(r, n, count) for r in range(n)] if name == "star"
                  else inprocess.schedules("allreduce", name, n, count))
        bufs = [np.full(count, r + 1.0) for r in range(n)]
        res = inprocess.run(scheds, bufs, "sum")
        assert all((b == n * (n + 1) / 2).all() for b in bufs), name
        for r in range(n):
            per_rank[r][name] = (res.elements_sent[r] * 8, res.elements_received[r] * 8)
    return per_rank


def clock_time(scheds, nbytes: int, count: int, alpha: float, beta: float) -> float:
    """Completion time of ``scheds`` moving ``nbytes``-byte vectors, on the in-process clock.

    The buffers hold ``count`` float64; beta is scaled by nbytes/(8.count) so every byte of
    the real vector is paid for (the clock is linear in bytes)."""
    bufs = [np.ones(count) for _ in scheds]
    scale = nbytes / (8 * count)
    return inprocess.run(scheds, bufs, "sum", clock=(alpha, beta * scale, 0.0)).time


def quiz3(n_values=(8, 16, 32, 64)) -> list[dict]:
    L, link, nic, V, count = 2e-6, 25e9, 50e9, GIB, 64 * 8
    rows = []
    for n in n_values:
        ring = inprocess.schedules("allreduce", "ring", n, count)
        rows.append({"N": n, "ring_bytes_per_link": ring[0].elements_sent() * V // count,
                     "ring_steps": len(ring[0]),
                     "ring_s": clock_time(ring, V, count, L, 1 / link),
                     "star_root_bytes_in": (n - 1) * V,
                     "star_s": clock_time([star(r, n, count) for r in range(n)], V, count, L,
                                          1 / nic)})
    return rows


def main(argv=None) -> int:
    ap = parser(__doc__, png="bytes per rank against N")
    ap.add_argument("--max-n", type=int, default=8)
    args = ap.parse_args(argv)
    world = MPI.COMM_WORLD
    rank, K = world.Get_rank(), world.Get_size()

    measured = {}                                   # N -> per-rank dicts (MPI)
    for n in range(2, K + 1):
        sub = world.Split(0 if rank < n else MPI.UNDEFINED, rank)
        mine = measure_mpi(sub, COUNT) if sub != MPI.COMM_NULL else None
        if sub != MPI.COMM_NULL:
            sub.Free()
        gathered = world.gather(mine, root=0)
        if rank == 0:
            measured[n] = gathered[:n]
    if rank != 0:
        return 0

    V = COUNT * 8
    rows = []
    print(f"# V = {V} bytes per rank (float64 x {COUNT}); bytes are per rank, sent (received)")
    print("#  N  source      ring sent   2(N-1)/N.V   naive sent  (N-1).V   star root in/out"
          "    star other out")
    for n in range(2, max(args.max_n, K) + 1):
        counted = count_inprocess(n, COUNT)
        source = "MPI" if n in measured else "in-process"
        per_rank = measured.get(n, counted)
        agrees = n not in measured or per_rank == counted
        ring = max(r["ring"][0] for r in per_rank)
        naive = max(r["naive"][0] for r in per_rank)
        root_in, root_out = per_rank[0]["star"][1], per_rank[0]["star"][0]
        other = max(r["star"][0] for r in per_rank[1:])
        rows.append({"N": n, "source": source, "V": V, "ring": ring, "naive": naive,
                     "star_root_in": root_in, "star_root_out": root_out, "star_other": other,
                     "per_rank": per_rank, "mpi_equals_inprocess": agrees if n in measured
                     else None})
        print(f"# {n:>2}  {source:<10} {ring:>10} {2 * (n - 1) * V // n:>12} {naive:>12} "
              f"{(n - 1) * V:>9} {root_in:>10}/{root_out:<10} {other:>10}"
              + ("" if agrees else "   MPI and in-process counts DIFFER"))
    print("# in units of V:  N  ring  naive  star root (in = out)")
    for r in rows:
        print(f"#               {r['N']:>2}  {r['ring'] / V:.3f}  {r['naive'] / V:.0f}  "
              f"{r['star_root_in'] / V:.0f}")

    quiz = quiz3()
    print("# quiz 3: 1 GiB, L = 2 us; ring at 25 GB/s per link, star at the root's one 50 GB/s NIC")
    for q in quiz:
        print(f"#   N={q['N']:>2}: ring {q['ring_bytes_per_link'] / 1e9:.3f} GB per link, "
              f"{q['ring_steps']} steps, {q['ring_s'] * 1e3:.1f} ms;  star root "
              f"{q['star_root_bytes_in'] / 1e9:.2f} GB in and out, {q['star_s'] * 1e3:.0f} ms;"
              f"  star/ring {q['star_s'] / q['ring_s']:.1f}x")
    write_json(args.json, {"V": V, "mpi_ranks": K, "rows": rows, "quiz3": quiz})

    def draw(plt):
        fig, ax = plt.subplots(figsize=(6.5, 4))
        ns = [r["N"] for r in rows]
        for key, label, style in (("ring", "ring, per rank", "o-"),
                                  ("naive", "naive all-gather+sum, per rank", "s-"),
                                  ("star_root_in", "star root, in (= out)", "^-"),
                                  ("star_other", "star, other ranks", "v-")):
            ax.plot(ns, [r[key] / V for r in rows], style, label=label)
        mpi_n = [r["N"] for r in rows if r["source"] == "MPI"]
        if mpi_n:
            ax.axvspan(min(mpi_n) - 0.3, max(mpi_n) + 0.3, color="0.9",
                       label="counted by the MPI executor")
        ax.plot(ns, [2 * (n - 1) / n for n in ns], "k:", lw=1, label="2(N-1)/N")
        ax.set_xlabel("N (ranks)")
        ax.set_ylabel("bytes sent / V")
        ax.set_title("all-reduce traffic per rank")
        ax.legend(fontsize=8)
        return fig
    save_figure(args.png, draw)

    at8 = next(r for r in rows if r["N"] == max(r["N"] for r in rows))
    q8 = quiz[0]
    same = all(r["mpi_equals_inprocess"] for r in rows if r["source"] == "MPI")
    mpi_span = (f"MPI counters at N=2..{K}, {'equal to' if same else 'DIFFERENT from'} the "
                "in-process counts" if K > 1 else "in-process executor, no MPI job")
    claim("lab_bytes",
          "ring 2(N-1)/N.V per rank (-> 2V), naive N.V per rank, star root (N-1).V in and "
          "out; quiz 3 (N=8, 1 GiB) left to the reader",
          f"N={at8['N']}: ring {at8['ring'] / V:.3f} V, naive {at8['naive'] / V:.0f} V, star root "
          f"{at8['star_root_in'] / V:.0f} V in/{at8['star_root_out'] / V:.0f} V out ({mpi_span}); "
          f"quiz 3: ring {q8['ring_s'] * 1e3:.1f} ms vs star {q8['star_s'] * 1e3:.0f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
