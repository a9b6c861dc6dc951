"""Hierarchical all-reduce: a node-local phase, an inter-node all-reduce, a node-local phase back.

``nodes`` lists the ranks of each node (from ``COMM_TYPE_SHARED``, or virtual nodes of k
consecutive ranks with ``MPICOLL_RANKS_PER_NODE=k``). Two compositions:

* shard (``inner="ring"`` or ``"recursive_halving"``; needs every node to hold the same number
  L of ranks) -- the Horovod / NCCL shape. Phase 1: a reduce-scatter inside each node leaves
  local rank i with shard i (count/L elements) of the node's sum. Phase 2: local rank i of every
  node all-reduces shard i with the ``outer`` algorithm, so L inter-node all-reduces of n/L
  bytes run side by side. Phase 3: an all-gather inside each node.
* leader (``inner="binomial"``; any node sizes) -- MPICH's ``smp``. Phase 1: binomial reduce
  to the node's first rank. Phase 2: the leaders all-reduce the whole vector with ``outer``.
  Phase 3: binomial broadcast inside each node.
* shared memory (``inner="shm"``; the same number of ranks on every node, each node inside one
  real node) -- the shard shape with ``shm``'s window (``mpicoll.shm``) as the node phases,
  as MPICH's and Open MPI's shared-memory node phases do. Phase 1: each rank copies its input
  into the node's window and reduces its shard of all the node's inputs straight from it.
  Phase 2: as in shard, chunk by chunk. Phase 3: each rank copies the others' shards out of
  the window. No message inside a node; no schedule either (so the in-process executor, the
  simulators and the traces can't run it: they take ``ring``); only the MPI path runs it.

Every element of the result is computed once and copied, so all ranks end with the same bits.

Source: MPICH's ``allreduce_intra_smp.c`` (leader); Horovod's ``NCCLHierarchicalAllreduce``
and Open MPI's coll/han (shard).

Cost, n bytes, L ranks per node, M nodes, intra-node alpha_l/beta_l, inter-node alpha/beta:
    shard:  T = 2(L-1).alpha_l + 2.n.((L-1)/L).beta_l + n.((L-1)/L).gamma   (ring inner)
                + T_outer(M, n/L; alpha, beta, gamma)
    leader: T = 2.ceil(lg L).(alpha_l + n.beta_l) + ceil(lg L).n.gamma + T_outer(M, n)
    shm:    T = 2.alpha_l + (3L-2)/L.n.beta_l + ((L-1)/L).n.gamma + T_outer(M, n/L)
            (``allreduce_shm.cost`` on the node, with the intra-node link's alpha and beta)
Bytes each rank sends: what it sends in the three phases -- its inner phases' bytes on its node,
plus the outer all-reduce's bytes for its shard (n/L; shard) or, on the leaders, for the whole
vector (leader).
"""

from ..schedule import Schedule, block_displs
from . import (allgather_recursive_doubling, allgather_ring, allreduce_binomial,
               allreduce_recursive_doubling, allreduce_recursive_halving, allreduce_ring,
               bcast_binomial, reduce_binomial, reduce_scatter_recursive_halving,
               reduce_scatter_ring)

# inner name -> (node phase 1, node phase 3)
INNER = {
    "ring": (reduce_scatter_ring, allgather_ring),
    "recursive_halving": (reduce_scatter_recursive_halving, allgather_recursive_doubling),
    "binomial": (reduce_binomial, bcast_binomial),
}
SHM = "shm"     # the shared-memory node phases (no schedule: api runs them on mpicoll.shm)
INNERS = (*INNER, SHM)
# outer name -> the all-reduce the nodes (or their shards) run between them
OUTER = {
    "ring": allreduce_ring,
    "recursive_halving": allreduce_recursive_halving,
    "recursive_doubling": allreduce_recursive_doubling,
    "binomial": allreduce_binomial,
}


def default_inner(nodes) -> str:
    """``ring`` (shard) when every node has the same number of ranks, else ``binomial`` (leader)."""
    return "ring" if len({len(n) for n in nodes}) == 1 else "binomial"


def check_options(nodes, inner: str, outer: str) -> None:
    """Raise ``ValueError`` unless ``inner`` and ``outer`` can run on ``nodes``."""
    if inner not in INNERS:
        raise ValueError(f"unknown hierarchical inner algorithm {inner!r}; "
                         f"expected one of {sorted(INNERS)}")
    if outer not in OUTER:
        raise ValueError(f"unknown hierarchical outer algorithm {outer!r}; "
                         f"expected one of {list(OUTER)}")
    if nodes is None:
        return
    sizes = sorted({len(n) for n in nodes})
    if inner != "binomial" and len(sizes) > 1:
        raise ValueError(f"hierarchical inner={inner!r} needs the same number of ranks on every "
                         f"node, got node sizes {sizes}; use inner='binomial'")


def schedule(rank: int, size: int, count: int, *, nodes, inner: str | None = None,
             outer: str = "recursive_doubling") -> Schedule:
    inner = inner or default_inner(nodes)
    check_options(nodes, inner, outer)
    if inner == SHM:
        raise ValueError("hierarchical inner='shm' reduces in a shared-memory window: it has "
                         "no schedule, so only the MPI path runs it (not the in-process "
                         "executor, the simulators or traces: use inner='ring' there)")
    node = next(j for j, members in enumerate(nodes) if rank in members)
    members = list(nodes[node])
    local, L = members.index(rank), len(members)
    first, last = INNER[inner]
    outer_schedule = OUTER[outer].schedule
    if inner == "binomial":                                  # leader composition
        phase1 = first.schedule(local, L, count).remap(members)
        leaders = [n[0] for n in nodes]
        phase2 = (outer_schedule(node, len(nodes), count).remap(leaders)
                  if local == 0 else Schedule())
        phase3 = last.schedule(local, L, count).remap(members)
    else:                                                    # shard composition
        phase1 = first.schedule(local, L, count).remap(members)
        shard = block_displs(count, L)
        peers = [n[local] for n in nodes]
        phase2 = outer_schedule(node, len(nodes), shard[local + 1] - shard[local]).remap(
            peers, offset=shard[local])
        phase3 = last.schedule(local, L, count).remap(members)
    return phase1 + phase2 + phase3


def cost(p: int, n: float, alpha: float, beta: float, gamma: float, *, ranks_per_node: int = 1,
         alpha_intra: float | None = None, beta_intra: float | None = None,
         inner: str = "ring", outer: str = "recursive_doubling") -> float:
    L = max(1, min(ranks_per_node, p))
    M = -(-p // L)
    al = alpha if alpha_intra is None else alpha_intra
    bl = beta if beta_intra is None else beta_intra
    outer_cost = OUTER[outer].cost
    if inner == SHM:
        node = 2 * al + (3 * L - 2) / L * n * bl + (L - 1) / L * n * gamma if L > 1 else 0.0
        return node + outer_cost(M, n / L, alpha, beta, gamma)
    first, last = INNER[inner]
    node = first.cost(L, n, al, bl, gamma) + last.cost(L, n, al, bl, gamma)
    if inner == "binomial":
        return node + outer_cost(M, n, alpha, beta, gamma)
    return node + outer_cost(M, n / L, alpha, beta, gamma)


def bytes_sent(rank: int, p: int, n: float, *, nodes, inner: str | None = None,
               outer: str = "recursive_doubling") -> float:
    inner = inner or default_inner(nodes)
    node = next(j for j, members in enumerate(nodes) if rank in members)
    local, L = nodes[node].index(rank), len(nodes[node])
    if inner == SHM:                # nothing is sent inside a node
        return OUTER[outer].bytes_sent(node, len(nodes), n / L)
    first, last = INNER[inner]
    if inner == "binomial":
        middle = OUTER[outer].bytes_sent(node, len(nodes), n) if local == 0 else 0
    else:
        middle = OUTER[outer].bytes_sent(node, len(nodes), n / L)
    return first.bytes_sent(local, L, n) + middle + last.bytes_sent(local, L, n)
