"""Broadcast as a binomial scatter followed by a ring all-gather (van de Geijn's broadcast).

Phase 1: the root scatters the vector, cut into p blocks (``block_displs``), down a binomial
tree: with relative ranks ``rel = (rank - root) mod p``, rank rel receives blocks
[rel, rel + mask) from ``rel - mask`` (mask = lowest set bit of rel) and passes the upper parts
on to ``rel + mask/2``, ``rel + mask/4``, ... . Phase 2: the ranks run the ring all-gather
(``allgather_ring``) on those blocks in relative rank order. Every byte crosses each link about
twice instead of lg p times, which is what makes it the large-message broadcast of MPICH
(``bcast_intra_scatter_ring_allgather.c``) -- the "ring" broadcast of this package.

Source: Barnett, Gupta, Payne, Shuler, van de Geijn & Watts, "Interprocessor collective
communication library (InterCom)", SHPCC 1994; Thakur, Rabenseifner & Gropp, IJHPCA 19(1), 2005.

Cost, n bytes:
    T = (ceil(lg p) + p - 1).alpha + 2.n.((p-1)/p).beta
Bytes each rank sends: in the scatter, the blocks of its subtree but its own (relative rank rel
with lowest set bit b holds blocks rel .. min(rel + b, p) - 1; the root all p); in the ring
all-gather n.(p-1)/p (exactly, when p divides the count).
"""

from ..schedule import Recv, Schedule, Send, block_displs, make_schedule
from . import allgather_ring


def schedule(rank: int, size: int, count: int, *, root: int = 0) -> Schedule:
    rel = (rank - root) % size
    ranks = [(r + root) % size for r in range(size)]      # relative -> real rank
    displs = block_displs(count, size)
    span = lambda lo, hi: (displs[lo], displs[min(hi, size)])   # noqa: E731
    steps = []
    # Phase 1: binomial scatter of the blocks, in relative ranks.
    mask = 1
    while mask < size:
        if rel & mask:
            steps.append((Recv(ranks[rel - mask], *span(rel, rel + mask), reduce=False),))
            break
        mask <<= 1
    mask >>= 1
    while mask > 0:
        if rel + mask < size:
            steps.append((Send(ranks[rel + mask], *span(rel + mask, rel + 2 * mask)),))
        mask >>= 1
    # Phase 2: ring all-gather of the blocks, in relative ranks.
    return make_schedule(steps) + allgather_ring.schedule(rel, size, count).remap(ranks)


def cost(p: int, n: float, alpha: float, beta: float, gamma: float) -> float:
    return ((p - 1).bit_length() + p - 1) * alpha + 2 * n * (p - 1) / p * beta


def bytes_sent(rank: int, p: int, n: float, root: int = 0) -> float:
    rel = (rank - root) % p
    subtree = min(rel + (rel & -rel), p) - rel if rel else p
    return (subtree - 1) * n / p + n * (p - 1) / p
