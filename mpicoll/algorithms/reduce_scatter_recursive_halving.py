"""Reduce-scatter by recursive halving.

Power of two p: in the first step each rank exchanges with the rank p/2 away; the lower rank of
the pair keeps the lower half of the vector and sends the upper half, the upper rank the reverse,
and each reduces the half it keeps. The next step repeats on that half with distance p/4, and so
on: after lg p steps the distance is 1 and rank r holds segment r fully reduced.

Non-power-of-two p (``pof2_fold``, MPICH's whole-vector fold): rem = p - p' extra ranks. Among
ranks 0 .. 2rem-1 the even ones send their whole vector to rank+1, which reduces it and acts
as virtual rank rank/2 for both; rank r >= 2rem becomes virtual rank r - rem. Virtual rank v
owns the blocks of the real ranks it stands for (two blocks for v < rem, one otherwise), so the
halving runs over p' segments of those blocks. At the end each odd rank below 2rem sends the
even rank its block.

Source: Thakur, Rabenseifner & Gropp, IJHPCA 19(1), 2005, sec. 4.4; MPICH's
``reduce_scatter_intra_recursive_halving.c``.

Cost, n bytes in all (blocks of n/p; p' = 2^floor(lg p), rem = p - p'):
    p = p':  T = lg p.alpha + n.((p-1)/p).(beta + gamma)
    else:    T = (lg p' + 2).alpha + n.(beta + gamma)                      (fold)
                 + (p' - 1 + sum_m min(rem, m)).(n/p).(beta + gamma)      (halving)
                 + (n/p).beta                                             (unfold)
    where m runs over the distances 1, 2, 4, ..., p'/2: the virtual ranks below rem own two
    blocks, so the busiest pair of each halving step (virtual rank 0's) carries min(rem, m)
    blocks more than m.
Bytes each rank sends: n.(p-1)/p (exactly, when p divides the count); the even ranks below
2.rem send n (the fold) and nothing else. (Each participant gives away, over the halving
steps, every block but the ones it keeps -- and the odd ranks below 2.rem then hand one on.)
"""

from ..schedule import (Recv, Schedule, Send, block_displs, fold_real_rank, make_schedule,
                        pof2_fold, virtual_blocks)


def halving_steps(newrank: int, pof2: int, seg: list[int], real) -> list:
    """Recursive halving among ``pof2`` virtual ranks; virtual rank v ends owning segment v.

    ``seg`` holds the element offsets of the pof2 segments (pof2 + 1 entries); ``real`` maps a
    virtual rank to a real one. At distance ``mask`` a rank holds the aligned group of 2*mask
    segments around it, keeps the half containing itself and sends the other half.
    """
    steps = []
    mask = pof2 >> 1
    while mask:
        partner = newrank ^ mask
        keep, give = newrank & -mask, partner & -mask
        steps.append((Send(real(partner), seg[give], seg[give + mask]),
                      Recv(real(partner), seg[keep], seg[keep + mask], reduce=True)))
        mask >>= 1
    return steps


def schedule(rank: int, size: int, count: int) -> Schedule:
    pof2, rem, newrank = pof2_fold(rank, size)
    displs = block_displs(count, size)
    first_rank = [2 * v if v < rem else v + rem for v in range(pof2)]   # first real rank of v
    seg = [displs[r] for r in first_rank] + [count]
    steps = []
    # Phase 1: fold the 2*rem first ranks pairwise (whole vector).
    if rank < 2 * rem:
        if newrank < 0:
            steps.append((Send(rank + 1, 0, count),))
        else:
            steps.append((Recv(rank - 1, 0, count, reduce=True),))
    # Phase 2: recursive halving among the pof2 virtual ranks.
    if newrank >= 0:
        steps += halving_steps(newrank, pof2, seg, lambda v: fold_real_rank(v, rem))
    # Phase 3: unfold -- hand the even partner its block.
    if rank < 2 * rem:
        even = rank - 1 if newrank >= 0 else rank
        lo, hi = displs[even], displs[even + 1]
        steps.append((Send(even, lo, hi),) if newrank >= 0 else (Recv(rank + 1, lo, hi, False),))
    return make_schedule(steps)


def cost(p: int, n: float, alpha: float, beta: float, gamma: float) -> float:
    pof2, rem, _ = pof2_fold(0, p)
    lgp = pof2.bit_length() - 1
    if p == pof2:
        return lgp * alpha + n * (p - 1) / p * (beta + gamma)
    halving = sum(virtual_blocks(0, 1 << k, rem) for k in range(lgp))
    return (lgp + 2) * alpha + (n + halving * n / p) * (beta + gamma) + n / p * beta


def bytes_sent(rank: int, p: int, n: float) -> float:
    return n if pof2_fold(rank, p)[2] < 0 else n * (p - 1) / p
