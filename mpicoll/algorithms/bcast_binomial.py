"""Binomial-tree broadcast.

With relative ranks ``rel = (rank - root) mod p``: a rank first receives the whole vector from
``rel - mask``, where mask is the lowest set bit of ``rel`` (the root receives nothing), then
sends it on to ``rel + mask/2``, ``rel + mask/4``, ..., ``rel + 1`` where those ranks exist.
The set of ranks holding the data doubles each round: ceil(lg p) rounds.

Source: MPICH's ``bcast_intra_binomial.c``.

Cost, n bytes: T = ceil(lg p).(alpha + n.beta)
Bytes each rank sends: n times its number of children (the root sends ceil(lg p).n).
"""

from ..schedule import Recv, Schedule, Send, make_schedule


def schedule(rank: int, size: int, count: int, *, root: int = 0) -> Schedule:
    rel = (rank - root) % size
    real = lambda r: (r + root) % size   # noqa: E731
    steps = []
    mask = 1
    while mask < size:                   # receive from the parent
        if rel & mask:
            steps.append((Recv(real(rel - mask), 0, count, reduce=False),))
            break
        mask <<= 1
    mask >>= 1
    while mask > 0:                      # send to the children, farthest first
        if rel + mask < size:
            steps.append((Send(real(rel + mask), 0, count),))
        mask >>= 1
    return make_schedule(steps)


def cost(p: int, n: float, alpha: float, beta: float, gamma: float) -> float:
    return (p - 1).bit_length() * (alpha + n * beta)


def children(rel: int, p: int) -> int:
    """How many ranks relative rank ``rel`` sends to: ``rel + mask`` for each mask below its
    lowest set bit (below the top of the tree for the root), where that rank exists."""
    low = rel & -rel if rel else 1 << (p - 1).bit_length()
    return sum(1 for k in range(low.bit_length() - 1) if rel + (1 << k) < p)


def bytes_sent(rank: int, p: int, n: float, root: int = 0) -> float:
    return n * children((rank - root) % p, p)
