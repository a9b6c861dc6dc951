"""Does the nodes' traffic cross their links? Bytes on each node's veth link against the bytes
mpicoll counted as sent to other nodes.

    bash slurm/local-cluster.sh up --fabric slurm/local/fabric-1g.json
    srun -N 2 --ntasks-per-node=2 python -m mpi4py jobs/experiments/fabric_bytes.py --outdir DIR \\
        [--size 4M] [-n 3] [--algorithms ring,hierarchical,mpi]

On a cluster of slurm/local-cluster.sh up --fabric, each emulated node is a network namespace
whose only link to the others is "eth0" (a veth pair to a bridge, capped by tbf); its counters
are the node's /sys/class/net/eth0/statistics/{tx,rx}_bytes (sysfs of the node's namespace).
For each algorithm the job reads them on the first rank of every node, runs ``-n`` all-reduce
calls of ``--size`` bytes, reads them again, and sets the bytes the nodes sent (tx summed over
nodes) beside the bytes mpicoll's MPI executor counted as sent to another node
(``mpicoll.testing.traffic(comm)["internode_bytes"]``, summed over ranks). ``ratio`` =
link bytes / counted bytes: 1 plus the TCP/IP/Ethernet headers, UCX's own headers and the few bytes of
Slurm/PMI and TCP acknowledgements; the check is |ratio - 1| <= --tolerance (0.10). ``mpi``
(the library's MPI_Allreduce) is measured too but has no count of its own: its ratio is against
2 (M-1)/M x size per node for M nodes, the least any all-reduce must send out of a node (MPICH's
is node-aware and sends about that much).

Writes DIR/fabric_bytes.json; the exit status is 1 if a checked ratio is off, or if the job does
not run on a shaped fabric (no eth0 link, or every rank on one host name) -- unless
``--allow-plain``, which records what it sees and checks nothing.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import numpy as np
from _util import RANK, outdir, parser, say, write_json
from mpi4py import MPI

import mpicoll
from mpicoll.testing import exact_input, exact_result, nodes as node_layout, traffic
from mpicoll.tools.sizes import parse_size

LINK = Path("/sys/class/net/eth0/statistics")


def link_bytes() -> tuple[int, int]:
    """(tx, rx) bytes of this node's link, or (-1, -1) without one."""
    try:
        return (int((LINK / "tx_bytes").read_text()), int((LINK / "rx_bytes").read_text()))
    except OSError:
        return (-1, -1)


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--size", default="4M", help="bytes per call (K/M suffixes)")
    ap.add_argument("-n", "--iterations", type=int, default=3)
    ap.add_argument("--algorithms", default="ring,hierarchical,mpi",
                    help="comma list of all-reduce algorithms (mpi: MPI_Allreduce)")
    ap.add_argument("--tolerance", type=float, default=0.10)
    ap.add_argument("--allow-plain", action="store_true",
                    help="no shaped fabric is not an error (nothing is checked then)")
    args = ap.parse_args(argv)
    out = outdir(args.outdir)
    comm = MPI.COMM_WORLD
    size = comm.Get_size()
    counters = traffic(comm)
    nodes = node_layout(comm)
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    first = local.Get_rank() == 0          # one reader per node
    hosts = comm.allgather(socket.gethostname())
    fabric = comm.allgather(link_bytes()[0] >= 0)
    shaped = all(fabric) and len(set(hosts)) == len(nodes) > 1
    say(f"# {size} ranks on {len(nodes)} node(s) {nodes}; hosts {hosts}; fabric "
        f"{os.environ.get('MPICOLL_FABRIC', '-')}; UCX_TLS={os.environ.get('UCX_TLS', '-')}")
    if not shaped:
        say("# NOT a shaped fabric: no eth0 link on every node, or the ranks' host names do not "
            "tell the nodes apart")
    nbytes = parse_size(args.size)
    count = nbytes // 8
    x = exact_input(RANK, count, np.float64, "sum")
    want = exact_result(size, count, np.float64, "sum")
    least = 2 * (len(nodes) - 1) * count * 8      # all nodes, a node-aware all-reduce
    records, bad = [], 0
    for algo in args.algorithms.split(","):
        y = np.empty_like(x)
        # warm-up: connections made, schedules built (their bytes are not counted)
        if algo == "mpi":
            comm.Allreduce(x, y)
        else:
            mpicoll.allreduce(x, y, algorithm=algo, comm=comm)
        comm.Barrier()
        time.sleep(0.2)                        # let the last acknowledgements go out
        before_counted = counters["internode_bytes"]
        before = link_bytes() if first else (0, 0)
        comm.Barrier()
        t0 = time.perf_counter()
        wrong = 0
        for _ in range(args.iterations):
            if algo == "mpi":
                comm.Allreduce(x, y)
            else:
                mpicoll.allreduce(x, y, algorithm=algo, comm=comm)
            wrong += int(not np.array_equal(y, want))
        comm.Barrier()
        seconds = time.perf_counter() - t0
        time.sleep(0.2)
        after = link_bytes() if first else (0, 0)
        tx = comm.allreduce(after[0] - before[0])
        rx = comm.allreduce(after[1] - before[1])
        counted = comm.allreduce(counters["internode_bytes"] - before_counted)
        reference = counted if algo != "mpi" else args.iterations * least
        ratio = tx / reference if reference else None
        ok = ratio is not None and abs(ratio - 1) <= args.tolerance
        checked = shaped and algo != "mpi"
        bad += int(checked and not ok) + comm.allreduce(wrong)
        rec = {"algorithm": algo, "size": nbytes, "iterations": args.iterations,
               "link_tx_bytes": tx, "link_rx_bytes": rx, "counted_internode_bytes": counted,
               "reference_bytes": reference, "ratio": ratio, "checked": checked, "ok": ok,
               "seconds": seconds, "wrong": comm.allreduce(wrong)}
        records.append(rec)
        say(f"{algo:>14} {nbytes:>9} B x {args.iterations}: links sent {tx:>11} B, received "
            f"{rx:>11} B; mpicoll counted {counted:>11} B across nodes; ratio "
            f"{ratio if ratio is None else round(ratio, 4)}"
            f"{'' if algo != 'mpi' else ' (against the least a node must send)'}"
            f"{'  OK' if checked and ok else '  OFF' if checked else ''}")
    if RANK == 0:
        write_json(out / "fabric_bytes.json", {
            "nranks": size, "nodes": [list(n) for n in nodes], "hosts": hosts,
            "shaped": shaped, "fabric": os.environ.get("MPICOLL_FABRIC"),
            "ucx_tls": os.environ.get("UCX_TLS"), "tolerance": args.tolerance,
            "records": records})
    if not shaped and not args.allow_plain:
        return 1
    return int(bad > 0)


if __name__ == "__main__":
    sys.exit(main())
