"""All-gather by recursive doubling.

Power of two p: in step k (distance 2^k, k = 0 .. lg p - 1) each rank exchanges everything it
has -- the aligned group of 2^k blocks around it -- with the rank 2^k away, doubling what it
holds. After lg p steps every rank has all p blocks.

Non-power-of-two p (``pof2_fold``): among ranks 0 .. 2rem-1 each even rank first sends its block
to rank+1, which then stands for both as virtual rank rank/2 (owning their two blocks). The
p' = 2^floor(lg p) virtual ranks run recursive doubling over those segments, and at the end
each odd rank below 2rem sends its even partner everything but the partner's own block.

Source: Thakur, Rabenseifner & Gropp, IJHPCA 19(1), 2005, sec. 4.1 (recursive doubling);
MPICH's ``allgather_intra_recursive_doubling.c`` (whose non-power-of-two handling differs).

Cost, n bytes gathered in all (blocks of n/p; p' = 2^floor(lg p), rem = p - p'):
    p = p':  T = lg p.alpha + n.((p-1)/p).beta
    else:    T = (lg p' + 2).alpha + (1 + p' - 1 + sum_m min(rem, m) + p - 1).(n/p).beta
    (fold: one block; doubling: the distances m = 1, 2, ..., p'/2, where virtual rank 0's group
    of m virtual ranks holds min(rem, m) blocks more than m; unfold: all blocks but one).
Bytes each rank sends: virtual rank v sends the blocks of its aligned group of 2^k virtual
ranks at each step k (n.(p-1)/p when p is a power of two); the odd ranks below 2.rem add
n.(p-1)/p (the unfold), the even ones send their block n/p (the fold) and nothing else.
"""

from ..schedule import (Recv, Schedule, Send, block_displs, fold_real_rank, make_schedule,
                        pof2_fold, virtual_blocks)


def doubling_steps(newrank: int, pof2: int, seg: list[int], real) -> list:
    """Recursive doubling among ``pof2`` virtual ranks; virtual rank v starts owning segment v.

    At distance ``mask`` a rank holds the aligned group of ``mask`` segments around it and
    swaps it for its partner's group.
    """
    steps = []
    mask = 1
    while mask < pof2:
        partner = newrank ^ mask
        mine, theirs = newrank & -mask, partner & -mask
        steps.append((Send(real(partner), seg[mine], seg[mine + mask]),
                      Recv(real(partner), seg[theirs], seg[theirs + mask], reduce=False)))
        mask <<= 1
    return steps


def schedule(rank: int, size: int, count: int) -> Schedule:
    pof2, rem, newrank = pof2_fold(rank, size)
    displs = block_displs(count, size)
    first_rank = [2 * v if v < rem else v + rem for v in range(pof2)]
    seg = [displs[r] for r in first_rank] + [count]
    steps = []
    # Phase 1: fold -- each even rank below 2*rem hands its block to rank+1.
    if rank < 2 * rem:
        if newrank < 0:
            steps.append((Send(rank + 1, displs[rank], displs[rank + 1]),))
        else:
            steps.append((Recv(rank - 1, displs[rank - 1], displs[rank], reduce=False),))
    # Phase 2: recursive doubling among the pof2 virtual ranks.
    if newrank >= 0:
        steps += doubling_steps(newrank, pof2, seg, lambda v: fold_real_rank(v, rem))
    # Phase 3: unfold -- the even partner gets everything but its own block.
    if rank < 2 * rem:
        even = rank - 1 if newrank >= 0 else rank
        lo, hi = displs[even], displs[even + 1]
        if newrank >= 0:
            steps.append((Send(even, 0, lo), Send(even, hi, count)))
        else:
            steps.append((Recv(rank + 1, 0, lo, False), Recv(rank + 1, hi, count, False)))
    return make_schedule(steps)


def cost(p: int, n: float, alpha: float, beta: float, gamma: float) -> float:
    pof2, rem, _ = pof2_fold(0, p)
    lgp = pof2.bit_length() - 1
    if p == pof2:
        return lgp * alpha + n * (p - 1) / p * beta
    doubling = sum(virtual_blocks(0, 1 << k, rem) for k in range(lgp))
    return (lgp + 2) * alpha + (1 + doubling + p - 1) * n / p * beta


def bytes_sent(rank: int, p: int, n: float) -> float:
    pof2, rem, newrank = pof2_fold(rank, p)
    if newrank < 0:
        return n / p                                       # the fold only
    lgp = pof2.bit_length() - 1
    groups = sum(virtual_blocks(newrank & -(1 << k), 1 << k, rem) for k in range(lgp))
    return groups * n / p + (n * (p - 1) / p if rank < 2 * rem else 0)
