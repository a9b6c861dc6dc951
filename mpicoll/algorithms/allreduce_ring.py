"""Ring all-reduce: ring reduce-scatter, then ring all-gather.

Phase 1 (``reduce_scatter_ring``): p-1 steps around the ring leave rank r with block r of the
sum. Phase 2 (``allgather_ring``): p-1 more steps pass the finished blocks around until every
rank has all of them. Blocks are as even as possible for any count, so count < p and count = 0
work (empty blocks send nothing).

It is bandwidth-optimal: each rank sends 2.n.(p-1)/p bytes, which tends to 2n however large p
is, but it takes 2(p-1) latency terms, so it wins for large messages only.

Ring order (``order``; ``mpicoll.topology.ring_order``): both phases may visit the ranks in
another order -- a permutation of the textbook ring, each rank still ending with the same block
after phase 1. ``"rank"`` is the textbook ring; ``"node"`` walks the node layout ``nodes`` node by
node, so one hop per node boundary leaves a node however the ranks were placed; ``"rail"`` also
joins nodes on the same local index (NCCL's rail-aligned ring: 0..7, 15..8 on 2 nodes of 8).
The cost and bytes below do not change; which hops cross nodes does.

Source: Patarasuk & Yuan, JPDC 69(2), 2009; Baidu's ring all-reduce; MPICH's
``allreduce_intra_ring.c``.

Cost, n bytes:
    T = 2(p-1).alpha + 2.n.((p-1)/p).beta + n.((p-1)/p).gamma
Bytes each rank sends: 2.n.(p-1)/p (exactly, when p divides the count).
"""

from ..schedule import Schedule
from . import allgather_ring, reduce_scatter_ring


def schedule(rank: int, size: int, count: int, *, order: str = "rank", nodes=None) -> Schedule:
    ring = {"order": order, "nodes": nodes}
    return (reduce_scatter_ring.schedule(rank, size, count, **ring)   # Phase 1: reduce-scatter
            + allgather_ring.schedule(rank, size, count, **ring))     # Phase 2: all-gather


def cost(p: int, n: float, alpha: float, beta: float, gamma: float) -> float:
    return 2 * (p - 1) * alpha + 2 * n * (p - 1) / p * beta + n * (p - 1) / p * gamma
