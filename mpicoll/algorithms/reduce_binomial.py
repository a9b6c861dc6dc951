"""Binomial-tree reduce to a root.

With relative ranks ``rel = (rank - root) mod p``: at distance mask = 1, 2, 4, ... a rank whose
``rel`` has that bit set sends its partial result to ``rel - mask`` and is done; otherwise it
receives the partial result of ``rel + mask`` (if that rank exists) and reduces it. After
ceil(lg p) rounds the root holds the reduction of all p vectors.

Source: MPICH's ``reduce_intra_binomial.c``; Thakur, Rabenseifner & Gropp, IJHPCA 19(1), 2005.

Cost, n bytes: T = ceil(lg p).(alpha + n.beta + n.gamma)  (along the root's critical path)
Bytes each rank sends: n, the root none.
"""

from ..schedule import Recv, Schedule, Send, make_schedule


def schedule(rank: int, size: int, count: int, *, root: int = 0) -> Schedule:
    rel = (rank - root) % size
    real = lambda r: (r + root) % size   # noqa: E731
    steps = []
    mask = 1
    while mask < size:
        if rel & mask:
            steps.append((Send(real(rel - mask), 0, count),))
            break
        if rel + mask < size:
            steps.append((Recv(real(rel + mask), 0, count, reduce=True),))
        mask <<= 1
    return make_schedule(steps)


def cost(p: int, n: float, alpha: float, beta: float, gamma: float) -> float:
    return (p - 1).bit_length() * (alpha + n * beta + n * gamma)


def bytes_sent(rank: int, p: int, n: float, root: int = 0) -> float:
    return 0 if rank == root else n
