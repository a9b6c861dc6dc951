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


def test_shm_wins_at_every_size_when_it_reads_in_place():
    lo = select.SHM_MIN_BYTES
    assert not select.shm_wins(lo - 1, 2, 2, single_copy=True)
    assert all(select.shm_wins(n, 2, 2, single_copy=True) for n in (lo, 1 << 20, 1 << 30))
    assert select.allreduce(1 << 24, 2, 1 << 22, shared_memory=True, single_copy=True) == "shm"
    assert select.allreduce(1 << 24, 2, 1 << 22, shared_memory=False, single_copy=True) != "shm"


def test_single_copy_expected_follows_the_setting_and_the_cores():
    from mpicoll.algorithms import allreduce_shm
    from mpicoll.testing import environment
    have = allreduce_shm._HAVE_READV
    with environment(MPICOLL_SHM_SINGLE_COPY="auto"):
        assert allreduce_shm.single_copy_expected(2, 2) == have
        assert not allreduce_shm.single_copy_expected(3, 2)     # ranks take turns on a core
        assert not allreduce_shm.single_copy_expected(1, 2)     # nothing to read
    with environment(MPICOLL_SHM_SINGLE_COPY="on"):
        assert allreduce_shm.single_copy_expected(8, 2) == have
    with environment(MPICOLL_SHM_SINGLE_COPY="off"):
        assert not allreduce_shm.single_copy_expected(2, 2)
