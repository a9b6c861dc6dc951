"""All-to-all by pairwise exchange (a building block: the reproducible sums' exchange of values).

The buffer holds two regions of ``size`` blocks of ``count`` elements each: the blocks this rank
sends (block b goes to rank b) and, after them, the blocks it receives (block s from rank s).
In step ``s = 1 .. size-1`` rank ``r`` sends its block ``r + s`` to rank ``r + s`` and receives
block ``r - s``'s data from rank ``r - s`` (mod size), one ``MPI_Sendrecv`` per step. Every pair
of ranks meets once, any size (no power-of-two fold). A rank's block for itself is not sent:
the caller copies it (``send[r]`` to ``recv[r]``).

Source: MPICH's ``alltoall_intra_pairwise.c`` (its exclusive-or pairing for powers of two is
not used: the shifted pairing above works at every size); Thakur, Rabenseifner & Gropp,
IJHPCA 19(1), 2005, sec. 4.4.

Cost, n bytes sent by each rank in all (blocks of n/p):
    T = (p-1).alpha + n.((p-1)/p).beta
Bytes each rank sends: n.(p-1)/p.

Not (yet) a public collective: ``mpicoll.reproducible`` runs it to gather, on each rank, every
rank's values of the elements whose sum that rank rounds (docs/algorithms.md#reproducible-sums).
"""

from ..schedule import Recv, Schedule, Send, make_schedule


def schedule(rank: int, size: int, count: int) -> Schedule:
    received = size * count                             # where the received blocks start
    steps = []
    for s in range(1, size):
        to, frm = (rank + s) % size, (rank - s) % size
        steps.append((Send(to, to * count, (to + 1) * count),
                      Recv(frm, received + frm * count, received + (frm + 1) * count,
                           reduce=False)))
    return make_schedule(steps)


def cost(p: int, n: float, alpha: float, beta: float, gamma: float) -> float:
    return (p - 1) * alpha + n * (p - 1) / p * beta


def bytes_sent(rank: int, p: int, n: float) -> float:
    return n * (p - 1) / p
