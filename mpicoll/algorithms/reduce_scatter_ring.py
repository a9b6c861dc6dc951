"""Ring reduce-scatter.

The vector is cut into ``size`` blocks as even as possible (``block_displs``). In step
``s = 0 .. size-2`` rank ``r`` sends block ``r - s - 1`` to its right neighbour ``r + 1`` and
receives block ``r - s - 2`` from its left neighbour ``r - 1``, reducing it into its own partial
sum (all indices mod size). Each block travels ``size - 1`` hops, picking up one contribution per
hop, and rank ``r`` ends with block ``r`` fully reduced -- the block MPI_Reduce_scatter_block
gives it. Any count works: with count < size some blocks are empty and their transfers vanish.

Ring order (``order``, on the node layout ``nodes``; ``mpicoll.topology.ring_order``): the ring
may visit the ranks in another order, ``ring[0], ring[1], ...``. Everything above then holds
for *positions* ``i`` in the ring instead of ranks, and block ``i`` of the text is block
``ring[i]``, so that rank ``ring[i]`` still ends with its own block. ``order="rank"`` is the
identity.

Source: Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of
workstations", JPDC 69(2), 2009; the first half of MPICH's ``allreduce_intra_ring.c``.

Cost, n bytes in all (each block n/p):
    T = (p-1).alpha + n.((p-1)/p).beta + n.((p-1)/p).gamma
Bytes each rank sends: n.(p-1)/p (exactly, when p divides the count).
"""

from ..schedule import Recv, Schedule, Send, block_displs, make_schedule
from ..topology import ring_order


def schedule(rank: int, size: int, count: int, *, order: str = "rank", nodes=None) -> Schedule:
    displs = block_displs(count, size)
    ring = ring_order(nodes or (tuple(range(size)),), order)
    i = ring.index(rank)                                 # this rank's position in the ring
    right, left = ring[(i + 1) % size], ring[(i - 1) % size]
    steps = []
    for s in range(size - 1):
        send_block = ring[(i - s - 1) % size]
        recv_block = ring[(i - s - 2) % size]
        steps.append((Send(right, displs[send_block], displs[send_block + 1]),
                      Recv(left, displs[recv_block], displs[recv_block + 1], reduce=True)))
    return make_schedule(steps)


def cost(p: int, n: float, alpha: float, beta: float, gamma: float) -> float:
    """Predicted seconds for n bytes on p ranks."""
    return (p - 1) * alpha + n * (p - 1) / p * (beta + gamma)
