"""Ring all-reduce: ring reduce-scatter, then ring all-gather.

Phase 1 (``reduce_scatter_ring``): p-1 steps around the ring leave rank r with block r of the
sum. Phase 2 (``allgather_ring``): p-1 more steps pass the finished blocks around until every
rank has all of them. Blocks are as even as possible for any count, so count < p and count = 0
work (empty blocks send nothing).

It is bandwidth-optimal: each rank sends 2.n.(p-1)/p bytes, which tends to 2n however large p
is, but it takes 2(p-1) latency terms, so it wins for large messages only.

Source: Patarasuk & Yuan, JPDC 69(2), 2009; Baidu's ring all-reduce; MPICH's
``allreduce_intra_ring.c``.

Cost, n bytes:
    T = 2(p-1).alpha + 2.n.((p-1)/p).beta + n.((p-1)/p).gamma
Bytes each rank sends: 2.n.(p-1)/p (exactly, when p divides the count).
"""

from ..schedule import Schedule
from . import allgather_ring, reduce_scatter_ring


def schedule(rank: int, size: int, count: int) -> Schedule:
    return (reduce_scatter_ring.schedule(rank, size, count)      # Phase 1: reduce-scatter
            + allgather_ring.schedule(rank, size, count))        # Phase 2: all-gather


def cost(p: int, n: float, alpha: float, beta: float, gamma: float) -> float:
    return 2 * (p - 1) * alpha + 2 * n * (p - 1) / p * beta + n * (p - 1) / p * gamma


def bytes_sent(rank: int, p: int, n: float) -> float:
    return 2 * n * (p - 1) / p
