"""``select``: where ``auto`` runs ``shm`` on one node."""

import os

from mpicoll import select


def test_shm_wins_from_min_bytes_and_past_max_bytes_only_oversubscribed():
    lo, hi = select.SHM_MIN_BYTES, select.SHM_MAX_BYTES
    assert not select.shm_wins(lo - 1, 2, 2)
    assert select.shm_wins(lo, 2, 2) and select.shm_wins(hi, 2, 2)
    assert not select.shm_wins(hi + 1, 2, 2)           # a core per rank: the ring from here
    assert select.shm_wins(hi + 1, 3, 2) and select.shm_wins(1 << 30, 8, 2)
    assert not select.shm_wins(1 << 20, 1, 1)          # one rank: nothing to share
    assert select.allreduce(hi + 1, 4, (hi + 1) // 8, shared_memory=True) == (
        "shm" if 4 > (os.cpu_count() or 1) else select.choose("allreduce", hi + 1, 4,
                                                              (hi + 1) // 8))
