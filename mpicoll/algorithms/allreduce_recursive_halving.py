"""Rabenseifner's all-reduce: reduce-scatter by recursive halving, all-gather by recursive doubling.

Phase 2 (reduce-scatter) halves the vector and the distance each step: at distance p'/2 the
lower rank of each pair keeps and reduces the lower half, the upper rank the upper half; after
lg p' steps virtual rank v holds segment v of the sum (``halving_steps``). Phase 3 (all-gather)
retraces the steps in reverse, doubling what each rank holds (``doubling_steps``). Segments are
count/p' elements, as even as possible, so count < p' works too (empty segments send nothing).

Non-power-of-two p, MPICH's whole-vector fold (``pof2_fold``): Phase 1, among ranks
0 .. 2rem-1 (rem = p - p') each even rank sends its whole vector to rank+1, which reduces it and
takes part as virtual rank rank/2, while the even rank sits out; Phase 4, each such odd rank
sends the whole result back. The fold costs alpha + n.beta + n.gamma and the unfold alpha + n.beta
on those ranks. (Thakur et al.'s half-vector fold, used by Open MPI, saves n.gamma/2 for one more
alpha; we keep MPICH's, which is simpler to read.)

Source: Rabenseifner, "Optimization of collective reduction operations", ICCS 2004; Thakur,
Rabenseifner & Gropp, IJHPCA 19(1), 2005; MPICH's ``allreduce_intra_reduce_scatter_allgather.c``.

Cost, n bytes, p' = 2^floor(lg p):
    p = p':  T = 2.lg p.alpha + 2.n.((p-1)/p).beta + n.((p-1)/p).gamma
    else:    T = (2.lg p' + 2).alpha + (2.(p'-1)/p' + 2).n.beta + (1 + (p'-1)/p').n.gamma
Bytes each rank sends: 2.n.(p'-1)/p' (exactly, when p' divides the count), plus n on the odd
ranks below 2.rem (the unfold); the even ranks below 2.rem send n (the fold) and nothing else.
"""

from ..schedule import Recv, Schedule, Send, block_displs, fold_real_rank, make_schedule, pof2_fold
from .allgather_recursive_doubling import doubling_steps
from .reduce_scatter_recursive_halving import halving_steps


def schedule(rank: int, size: int, count: int) -> Schedule:
    pof2, rem, newrank = pof2_fold(rank, size)
    seg = block_displs(count, pof2)
    real = lambda v: fold_real_rank(v, rem)   # noqa: E731
    steps = []
    # Phase 1: fold the extra ranks (whole vector to the odd neighbour).
    if rank < 2 * rem:
        steps.append((Send(rank + 1, 0, count),) if newrank < 0
                     else (Recv(rank - 1, 0, count, reduce=True),))
    if newrank >= 0:
        steps += halving_steps(newrank, pof2, seg, real)    # Phase 2: reduce-scatter
        steps += doubling_steps(newrank, pof2, seg, real)   # Phase 3: all-gather
    # Phase 4: unfold (whole result back to the even neighbour).
    if rank < 2 * rem:
        steps.append((Recv(rank + 1, 0, count, reduce=False),) if newrank < 0
                     else (Send(rank - 1, 0, count),))
    return make_schedule(steps)


def cost(p: int, n: float, alpha: float, beta: float, gamma: float) -> float:
    pof2 = 1 << (p.bit_length() - 1)
    lgp = pof2.bit_length() - 1
    if p == pof2:
        return 2 * lgp * alpha + 2 * n * (p - 1) / p * beta + n * (p - 1) / p * gamma
    f = (pof2 - 1) / pof2
    return (2 * lgp + 2) * alpha + (2 * f + 2) * n * beta + (1 + f) * n * gamma


def bytes_sent(rank: int, p: int, n: float) -> float:
    pof2, rem, newrank = pof2_fold(rank, p)
    if newrank < 0:
        return n                                                # the fold only
    return 2 * n * (pof2 - 1) / pof2 + (n if rank < 2 * rem else 0)   # + the unfold
