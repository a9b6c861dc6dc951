"""The hosts' network stack and memory copies, measured with point-to-point messages: how fast
one message between nodes moves alone, how many bytes between nodes the hosts move when every
rank sends and receives at once, and how many bytes between ranks of one node they copy when
every rank exchanges with a rank of its own node at once. They are the fabric model's
``stack_per_flow``, ``stack`` and ``copy`` (mpicoll/simulators/fabric.py): the CPU work of the
kernel's TCP stack and of the MPI library's copies, which the links' rates alone do not show.

    bash slurm/local-cluster.sh up --fabric slurm/local/fabric-10g.json
    srun -N 4 --ntasks-per-node=2 python -m mpi4py jobs/experiments/fabric_stack.py --outdir DIR \\
        [--size 16M] [-n 5]

Rank r pairs with rank r + N/2 (another node when the ranks are placed in blocks on >= 2
nodes). Two tests, each timed ``-n`` times between barriers (median), with MPI_Send/MPI_Recv of
``--size`` bytes:

* **one flow**: rank 0 sends to rank N/2 and gets the message back (a ping-pong); its rate is
  size / (round trip / 2). No other message moves.
* **all flows**: every rank sends its message to its partner and receives the partner's
  (MPI_Sendrecv, all at once); the rate is the bytes that crossed nodes (N x size) over the
  slowest rank's time.
* **intra flows** (with 2 or more ranks on a node): local rank i exchanges with local rank
  i xor 1 of its own node (MPI_Sendrecv, all pairs of all nodes at once); the rate is the bytes
  moved (size x the ranks in a pair) over the slowest rank's time, per host: ``copy``. The link
  plays no part, so it is valid on any fabric.

With the link faster than both (a 10 Gbit/s fabric on this machine), ``stack_per_flow`` = the
one-flow rate, and ``stack`` = the all-flows rate x (sides per host): each byte costs the stack
of the host that sends it and of the one that receives it, the same host when every node is on
one machine (the emulated cluster: ``--nodes-per-host``, default all of the job's nodes), so
there stack = 2 x the all-flows rate. With a slower link the rates are the link's, and the job
says so. Writes DIR/fabric_stack.json; exits with status 2 unless the pairs are on different
nodes -- or with ``--allow-plain``, which measures whatever the pairs are (on one node: shared
memory) and records ``"shaped": false``.
"""

from __future__ import annotations

import os
import socket
import sys
import time

import numpy as np
from _util import RANK, outdir, parser, say, write_json
from mpi4py import MPI

from mpicoll.tools.sizes import parse_size


def timed(comm, fn, iters: int) -> float:
    """Median over ``iters`` of the slowest rank's time of fn(), each between barriers."""
    times = []
    for _ in range(iters + 1):                       # the first is a warm-up
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        times.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    return float(np.median(times[1:]))


def _mate(hosts, r):
    """The rank that rank r exchanges with inside its node (local rank i xor 1), or None (the
    last rank of a node with an odd number of them)."""
    local = [q for q in range(len(hosts)) if hosts[q] == hosts[r]]
    i = local.index(r)
    return local[i ^ 1] if (i ^ 1) < len(local) else None


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--size", default="16M", help="bytes per message (K/M suffixes)")
    ap.add_argument("-n", "--iterations", type=int, default=5)
    ap.add_argument("--nodes-per-host", type=int, default=0,
                    help="nodes that share one host (default 0: all of the job's nodes)")
    ap.add_argument("--allow-plain", action="store_true",
                    help="measure even when the pairs are not on different nodes")
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD.Dup()
    size, rank = comm.Get_size(), comm.Get_rank()
    hosts = comm.allgather(socket.gethostname())
    nodes = len(set(hosts))
    half = size // 2
    partner = (rank + half) % size
    shaped = not any(hosts[r] == hosts[(r + half) % size] for r in range(size))
    if size % 2 or not (shaped or args.allow_plain):
        say("fabric_stack: needs an even number of ranks placed in blocks on >= 2 nodes, so that"
            f" rank r and r + N/2 are on different nodes; got {size} rank(s) on {nodes} node(s)")
        return 2
    nbytes = parse_size(args.size)
    send = np.ones(nbytes, np.uint8)
    recv = np.empty(nbytes, np.uint8)

    def ping_pong():
        if rank == 0:
            comm.Send(send, dest=half, tag=1)
            comm.Recv(recv, source=half, tag=2)
        elif rank == half:
            comm.Recv(recv, source=0, tag=1)
            comm.Send(send, dest=0, tag=2)

    def exchange():
        comm.Sendrecv(send, dest=partner, sendtag=3, recvbuf=recv, source=partner, recvtag=3)

    mate = _mate(hosts, rank)
    paired = sum(1 for r in range(size) if _mate(hosts, r) is not None)

    def intra():
        if mate is not None:
            comm.Sendrecv(send, dest=mate, sendtag=4, recvbuf=recv, source=mate, recvtag=4)

    one = nbytes / (timed(comm, ping_pong, args.iterations) / 2)
    every = size * nbytes / timed(comm, exchange, args.iterations)
    per_host = args.nodes_per_host or nodes
    sides = 2 if per_host > 1 else 1            # both ends of a byte on one host, or not
    hosts_used = -(-nodes // per_host)
    copy = paired * nbytes / timed(comm, intra, args.iterations) / hosts_used if paired else None
    out = {"fabric": os.environ.get("MPICOLL_FABRIC"), "ucx_tls": os.environ.get("UCX_TLS"),
           "shaped": shaped, "nranks": size, "nodes": nodes, "hosts": sorted(set(hosts)), "size": nbytes,
           "iterations": args.iterations, "nodes_per_host": per_host,
           "one_flow_Bps": one, "all_flows_Bps": every,
           "stack_per_flow": one, "stack": sides * every,
           "intra_pairs_ranks": paired, "copy": copy,
           "command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    say(f"one flow: {one / 1e6:.0f} MB/s; all {size} ranks at once: {every / 1e6:.0f} MB/s "
        f"between nodes in all")
    say(f"model: stack_per_flow = {one:.3g} B/s, stack = {sides} x {every:.3g} = "
        f"{sides * every:.3g} B/s per host of {per_host} node(s) (valid where the link is "
        "faster than both: compare with the fabric's nic bandwidth)")
    say(f"model: copy = {copy:.3g} B/s per host of {per_host} node(s) ({paired} ranks exchanging "
        "inside their nodes at once)" if copy else "copy: not measured (one rank per node)")
    if RANK == 0:
        write_json(outdir(args.outdir) / "fabric_stack.json", out)
    comm.Free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
