"""The ring's rank order across nodes: bytes that cross nodes and time, per order.

    srun -N 2 --ntasks-per-node=2 --distribution=cyclic \\
        python -m mpi4py jobs/experiments/ring_order.py --outdir DIR [--counts 1000,1000000] [-n 5]

Runs the ring all-reduce in each order (``rank``, ``node``, ``rail``) on the nodes the MPI
library reports (``COMM_TYPE_SHARED``) and reads the MPI executor's byte counters
(``mpicoll.testing.traffic(comm)``): bytes sent in all, and bytes sent to another node,
summed over the ranks, beside what the schedules say (the in-process executor's count) and the median time of
``-n`` calls. With ``srun --distribution=cyclic`` rank r runs on node r mod M, so every hop of
the rank-order ring crosses nodes and only M hops of the node-order ring do. Every result is
checked against the exact answer. Writes DIR/ring_order.json; slurm/ring_order.sbatch runs it.
"""

from __future__ import annotations

import os
import socket
import time

import numpy as np
from _util import RANK, outdir, parser, say, write_json
from mpi4py import MPI

import mpicoll
from mpicoll import select
from mpicoll.simulators import inprocess
from mpicoll.testing import exact_input, exact_result, nodes as node_layout, traffic
from mpicoll.topology import ORDERS, ring_order


def auto_order(nodes) -> str | None:
    """The order of ``auto``'s rings on ``nodes`` (``select``'s order row)."""
    from mpicoll.testing import NodeLayout
    return select.auto_ring_order(NodeLayout(nodes))


def internode_elements(sched, rank, where) -> int:
    return sum(hi - lo for _, sends in sched.plan for peer, lo, hi in sends
               if where[peer] != where[rank])


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--counts", default="1000,1000000", help="float64 elements per call")
    ap.add_argument("-n", "--iterations", type=int, default=5)
    args = ap.parse_args()
    out = outdir(args.outdir)
    comm = MPI.COMM_WORLD
    size = comm.Get_size()
    counters = traffic(comm)
    nodes = node_layout(comm)
    where = {r: j for j, members in enumerate(nodes) for r in members}
    hosts = comm.allgather(socket.gethostname())
    slurm_nodes = comm.allgather(os.environ.get("SLURMD_NODENAME"))    # emulated nodes too
    say(f"# {size} ranks on {len(nodes)} node(s): {nodes}; by rank: hosts {hosts}, "
        f"Slurm nodes {slurm_nodes}")
    records = []
    for count in (int(c) for c in args.counts.split(",")):
        x = exact_input(RANK, count, np.float64, "sum")
        want = exact_result(size, count, np.float64, "sum")
        for order in ORDERS:
            ring = ring_order(nodes, order)
            mpicoll.allreduce(x, algorithm="ring", order=order, comm=comm)     # warm-up
            before = dict(counters)
            wrong = 0
            times = []
            for _ in range(args.iterations):
                comm.Barrier()
                t0 = time.perf_counter()
                got = mpicoll.allreduce(x, algorithm="ring", order=order, comm=comm)
                times.append(time.perf_counter() - t0)
                wrong += int(not np.array_equal(got, want))
            sent = {k: comm.allreduce(counters[k] - before[k]) // args.iterations
                    for k in ("bytes_sent", "internode_bytes")}
            scheds = inprocess.schedules("allreduce", "ring", size, count, nodes=nodes,
                                         order=order)
            expected = 8 * sum(internode_elements(s, r, where) for r, s in enumerate(scheds))
            hops = sum(where[a] != where[b] for a, b in zip(ring, ring[1:] + ring[:1]))
            rec = {"order": order, "count": count, "bytes": 8 * count, "ring": list(ring),
                   "internode_hops": hops, "bytes_sent": sent["bytes_sent"],
                   "internode_bytes": sent["internode_bytes"],
                   "expected_internode_bytes": expected,
                   "time_us": float(np.median(np.max(comm.allgather(times), axis=0))) * 1e6,
                   "wrong": comm.allreduce(wrong)}
            records.append(rec)
            say(f"{order:>5} {8 * count:>10} B  ring {rec['ring']}  hops across nodes "
                f"{hops}/{size}  internode {rec['internode_bytes']:>10} of "
                f"{rec['bytes_sent']:>10} B  {rec['time_us']:10.1f} us  wrong {rec['wrong']}")
    if RANK == 0:
        write_json(out / "ring_order.json", {
            "nranks": size, "nodes": [list(n) for n in nodes], "hosts": hosts,
            "slurm_nodes": slurm_nodes,
            "auto_order": auto_order(nodes), "records": records})


if __name__ == "__main__":
    main()
