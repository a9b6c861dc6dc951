"""Ring all-gather.

Rank ``r`` starts with block ``r`` (blocks as in ``block_displs``). In step ``s = 0 .. size-2``
it sends block ``r - s`` to ``r + 1`` and receives block ``r - s - 1`` from ``r - 1`` (mod size),
forwarding next step what it received this step. After ``size - 1`` steps every rank holds every
block.

Ring order (``order``, on the node layout ``nodes``; ``mpicoll.topology.ring_order``): as in
``reduce_scatter_ring``, the text holds for positions ``i`` in the ring ``ring[0], ring[1],
...``, and block ``i`` is block ``ring[i]``, the one rank ``ring[i]`` starts with.

Source: the second half of MPICH's ``allreduce_intra_ring.c``; Thakur, Rabenseifner & Gropp,
"Optimization of collective communication operations in MPICH", IJHPCA 19(1), 2005.

Cost, n bytes gathered in all:
    T = (p-1).alpha + n.((p-1)/p).beta
Bytes each rank sends: n.(p-1)/p.
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
        send_block = ring[(i - s) % size]
        recv_block = ring[(i - s - 1) % size]
        steps.append((Send(right, displs[send_block], displs[send_block + 1]),
                      Recv(left, displs[recv_block], displs[recv_block + 1], reduce=False)))
    return make_schedule(steps)


def cost(p: int, n: float, alpha: float, beta: float, gamma: float) -> float:
    return (p - 1) * alpha + n * (p - 1) / p * beta
