"""Naive all-reduce: every rank sends its whole vector to every other rank and reduces them all.

A teaching baseline, the "all-gather everything, then sum locally" of the seeds (seed 001,
chapter 3; Open MPI's ``allgather_reduce``, algorithm 7 of coll/tuned), written with the same
closed vocabulary as the others: one step in which rank r sends ``buf`` to each of the other
p-1 ranks and receives each of theirs into scratch, then reduces them into its own vector with
the operands in rank order -- the lower ranks' vectors on the left (``Recv.left``), from r-1
down to 0, then the higher ranks' on the right, from r+1 up to p-1:

    rank r computes  x0 + (x1 + ( ... (x(r-1) + x(r)) ... )) + x(r+1) + ... + x(p-1)

Operands stay in rank order, so a non-commutative (associative) op is fine, but each rank
groups them differently: integer results and MAX/MIN are the same everywhere, while float sums
and products can differ between ranks in the last bits (restriction ``own-rounding``). One
grouping on every rank cannot be written in this vocabulary: a received vector is always reduced
into the rank's own, so x(r) sits in the innermost pair on rank r; it would take a reduction
between two received vectors (the scratch already holds all p-1 of them, (p-1).n bytes).

It sends (p-1).n bytes per rank where the ring sends 2.n.(p-1)/p: p/2 times more, growing with
p. One step, so one latency term -- with p-1 messages each way, which on one port cost p-1
message times in practice.

Cost, n bytes (the alpha-beta-gamma model: the messages of a step overlap):
    T = alpha + (p-1).n.beta + (p-1).n.gamma
Bytes each rank sends: (p-1).n.
"""

from ..schedule import Recv, Schedule, Send, make_schedule


def schedule(rank: int, size: int, count: int) -> Schedule:
    others = [peer for peer in range(size) if peer != rank]
    sends = [Send(peer, 0, count) for peer in others]
    lower = [Recv(peer, 0, count, reduce=True, left=True) for peer in range(rank - 1, -1, -1)]
    higher = [Recv(peer, 0, count, reduce=True) for peer in range(rank + 1, size)]
    return make_schedule([sends + lower + higher])      # one step: all-gather and reduce


def cost(p: int, n: float, alpha: float, beta: float, gamma: float) -> float:
    return (alpha if p > 1 else 0.0) + (p - 1) * n * (beta + gamma)


def bytes_sent(rank: int, p: int, n: float) -> float:
    return (p - 1) * n
