"""Binomial all-reduce: binomial-tree reduce to rank 0, then binomial-tree broadcast.

Phase 1 (``reduce_binomial``): ceil(lg p) rounds in which half of the remaining ranks send their
whole partial vector to a partner and drop out, leaving the sum on rank 0. Phase 2
(``bcast_binomial``): ceil(lg p) rounds in which every rank holding the result sends it to one
more. Simple and correct for any p and count, but the whole vector crosses the critical path
2.ceil(lg p) times and the root does all the reduction of its subtree: a latency-bound
algorithm, beaten by recursive doubling (same latency, half the rounds) and by the ring or
Rabenseifner for large messages. It is here as the textbook baseline (MPICH's
``reduce + bcast``, Intel MPI's I_MPI_ADJUST_ALLREDUCE=3).

Cost, n bytes:
    T = 2.ceil(lg p).(alpha + n.beta) + ceil(lg p).n.gamma
Bytes each rank sends: n to its parent in the reduce (rank 0 has none), plus n per child in
the broadcast.
"""

from ..schedule import Schedule
from . import bcast_binomial, reduce_binomial


def schedule(rank: int, size: int, count: int) -> Schedule:
    return (reduce_binomial.schedule(rank, size, count, root=0)     # Phase 1: reduce
            + bcast_binomial.schedule(rank, size, count, root=0))   # Phase 2: broadcast


def cost(p: int, n: float, alpha: float, beta: float, gamma: float) -> float:
    lg = (p - 1).bit_length()
    return 2 * lg * (alpha + n * beta) + lg * n * gamma


def bytes_sent(rank: int, p: int, n: float) -> float:
    return reduce_binomial.bytes_sent(rank, p, n) + bcast_binomial.bytes_sent(rank, p, n)
