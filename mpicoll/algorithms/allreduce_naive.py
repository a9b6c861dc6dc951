"""Naive all-reduce: every rank sends its whole vector to every other rank and reduces them all.

A teaching baseline, the "all-gather everything, then sum locally" of the seeds (seed 001,
chapter 3; Open MPI's ``allgather_reduce``, algorithm 7 of coll/tuned), written with the same
closed vocabulary as the others: one step in which rank r sends ``buf`` to each of the other
p-1 ranks and receives each of theirs into scratch, then folds all p vectors in rank order:

    every rank computes  ((x0 + x1) + x2) + ... + x(p-1)

the left fold, grouped alike on every rank, so every rank ends with the same bits (float sums
and products too) -- those of ``shm`` and of numpy's ufunc applied rank after rank. The lower
ranks' vectors are folded together in scratch first, each into the next one's place
(``Recv.into_next``: x0 into x1, that sum into x2, ... up to x(r-1)); that partial fold is then
reduced into the rank's own vector as the left operand (``Recv.left``), and the higher ranks'
vectors follow on the right, from r+1 up to p-1. Operands stay in rank order, so a
non-commutative (associative) op is fine. Restriction ``baseline``: ``auto`` never chooses it.

It sends (p-1).n bytes per rank where the ring sends 2.n.(p-1)/p: p/2 times more, growing with
p. One step, but of p-1 messages each way, which leave a rank's one port one after another: the
cost charges each its latency, p-1 terms (the executors' clock, which overlaps a step's
messages, counts one; ``tests/unit/test_costs.py`` checks the p-1). Its scratch holds the p-1
received vectors, (p-1).n bytes.

Cost, n bytes (the alpha-beta-gamma model, one port: a latency per message):
    T = (p-1).alpha + (p-1).n.beta + (p-1).n.gamma
Bytes each rank sends: (p-1).n.
"""

from ..schedule import Recv, Schedule, Send, make_schedule


def schedule(rank: int, size: int, count: int) -> Schedule:
    others = [peer for peer in range(size) if peer != rank]
    sends = [Send(peer, 0, count) for peer in others]
    # x0 .. x(r-1), each folded into the next; the last of them into buf, as left operand
    lower = [Recv(peer, 0, count, reduce=True, left=True, into_next=peer < rank - 1)
             for peer in range(rank)]
    higher = [Recv(peer, 0, count, reduce=True) for peer in range(rank + 1, size)]
    return make_schedule([sends + lower + higher])      # one step: all-gather and fold


def cost(p: int, n: float, alpha: float, beta: float, gamma: float) -> float:
    return (p - 1) * (alpha + n * (beta + gamma))


def bytes_sent(rank: int, p: int, n: float) -> float:
    return (p - 1) * n
