"""Recursive-doubling all-reduce.

Power of two p: in step k (k = 0 .. lg p - 1) each rank exchanges its whole vector with the rank
2^k away (``rank ^ 2^k``) and reduces what it receives. After lg p steps every rank holds the
reduction of all p vectors. Only lg p latency terms, but the whole vector moves every step: the
algorithm of choice for short messages.

Non-power-of-two p, MPICH's whole-vector fold (``pof2_fold``): Phase 1, among ranks
0 .. 2rem-1 (rem = p - p') each even rank sends its vector to rank+1, which reduces it and
takes part as virtual rank rank/2; Phase 3, it sends the result back.

Both partners of an exchange reduce the same two vectors. They agree to put the lower rank's on
the left (``Recv.left``), so both get the same bits even where op(a, b) and op(b, a) differ
(MAX of +0.0 and -0.0, NaN payloads) and every rank ends with the same result.

Source: Thakur, Rabenseifner & Gropp, IJHPCA 19(1), 2005; MPICH's
``allreduce_intra_recursive_doubling.c``.

Cost, n bytes, p' = 2^floor(lg p):
    p = p':  T = lg p.(alpha + n.beta + n.gamma)
    else:    T = (lg p' + 2).alpha + (lg p' + 2).n.beta + (lg p' + 1).n.gamma
Bytes each rank sends: n.lg p', plus n on the odd ranks below 2.rem (the unfold); the even
ranks below 2.rem send n (the fold) and nothing else.
"""

from ..schedule import Recv, Schedule, Send, fold_real_rank, make_schedule, pof2_fold


def schedule(rank: int, size: int, count: int) -> Schedule:
    pof2, rem, newrank = pof2_fold(rank, size)
    steps = []
    # Phase 1: fold the extra ranks.
    if rank < 2 * rem:
        steps.append((Send(rank + 1, 0, count),) if newrank < 0
                     else (Recv(rank - 1, 0, count, reduce=True),))
    # Phase 2: lg pof2 whole-vector exchanges.
    if newrank >= 0:
        mask = 1
        while mask < pof2:
            partner = fold_real_rank(newrank ^ mask, rem)
            left = newrank & mask != 0         # the lower rank's vector is the left operand
            steps.append((Send(partner, 0, count),
                          Recv(partner, 0, count, reduce=True, left=left)))
            mask <<= 1
    # Phase 3: unfold.
    if rank < 2 * rem:
        steps.append((Recv(rank + 1, 0, count, reduce=False),) if newrank < 0
                     else (Send(rank - 1, 0, count),))
    return make_schedule(steps)


def cost(p: int, n: float, alpha: float, beta: float, gamma: float) -> float:
    pof2 = 1 << (p.bit_length() - 1)
    lgp = pof2.bit_length() - 1
    if p == pof2:
        return lgp * (alpha + n * beta + n * gamma)
    return (lgp + 2) * (alpha + n * beta) + (lgp + 1) * n * gamma


def bytes_sent(rank: int, p: int, n: float) -> float:
    pof2, rem, newrank = pof2_fold(rank, p)
    if newrank < 0:
        return n                                    # the fold only
    lgp = pof2.bit_length() - 1
    return n * lgp + (n if rank < 2 * rem else 0)   # + the unfold
