"""The failure detector's calls on a healthy communicator (deaths themselves:
tests/jobs/test_deaths.py): ``shrink`` gives a working copy of every rank, ULFM's ``Agree`` is
the AND, ``Get_failed`` is empty, ``Revoke`` breaks every rank's next call at once, a busy rank
is not reported, and ``stats`` names the rank that keeps the others waiting."""

import time

import numpy as np
import pytest
from mpi4py import MPI

import mpicoll
from mpicoll.registry import ALLREDUCE
from mpicoll.testing import agree, background_paused, environment

pytestmark = pytest.mark.mpi


@pytest.mark.max_ranks(5)
def test_shrink_of_a_healthy_communicator_is_a_working_copy(comm):
    mpicoll.allreduce(np.ones(4), comm=comm)            # set up (and watched)
    new = mpicoll.shrink(comm)
    try:
        agree(comm, new.Get_size() == comm.Get_size() and new.Get_rank() == comm.Get_rank(),
              f"{new.Get_size()} ranks, rank {new.Get_rank()}")
        size, rank = new.Get_size(), new.Get_rank()
        for algorithm in list(ALLREDUCE) + ["auto"]:
            x = np.arange(1000, dtype=np.float64) + rank
            got = mpicoll.allreduce(x, algorithm=algorithm, comm=new)
            want = size * np.arange(1000, dtype=np.float64) + size * (size - 1) / 2
            agree(comm, np.array_equal(got, want), f"{algorithm}: {got[:3]}")
    finally:
        new.Free()


@pytest.mark.max_ranks(5)
def test_ulfm_calls_without_a_failure(comm):
    wrapped = mpicoll.Comm(comm)
    wrapped.Allreduce(np.ones(4), np.empty(4))
    flag = wrapped.Agree(0b1110 if comm.Get_rank() == 0 else 0b1011)
    agree(comm, flag == (0b1010 if comm.Get_size() > 1 else 0b1110), f"Agree gave {flag:b}")
    failed = wrapped.Get_failed()
    agree(comm, failed.Get_size() == 0 and wrapped.Ack_failed() == 0,
          f"{failed.Get_size()} failed")
    failed.Free()
    agree(comm, not wrapped.Is_revoked(), "revoked before Revoke")
    shrunk = wrapped.Shrink()
    agree(comm, isinstance(shrunk, mpicoll.Comm) and shrunk.Get_size() == comm.Get_size(),
          repr(shrunk))
    shrunk.Free()


@pytest.mark.rank_counts(2, 3, 4)
def test_revoke_breaks_every_ranks_next_call(comm):
    """Rank 0 revokes: its own next call raises at once, the others' within a heartbeat or
    two (they hear it while they wait in the call)."""
    mpicoll.allreduce(np.ones(4), comm=comm)
    if comm.Get_rank() == 0:
        mpicoll.Comm(comm).Revoke()
    start = time.monotonic()
    try:
        mpicoll.allreduce(np.ones(4), comm=comm)
        got = None
    except mpicoll.CommunicatorBroken as exc:
        got = str(exc)
    elapsed = time.monotonic() - start
    agree(comm, got is not None and "revoked" in got, f"got {got!r}")
    agree(comm, elapsed < 2.0, f"{elapsed:.2f} s")
    agree(comm, mpicoll.Comm(comm).Is_revoked(), "Is_revoked false")


@pytest.mark.rank_counts(2, 3)
def test_a_busy_rank_is_not_reported(comm):
    """The last rank sleeps 3 s, then computes 1 s, before a call the others wait in: it is
    alive, so nobody is reported, and the call is right."""
    size = comm.Get_size()
    mpicoll.allreduce(np.ones(4), comm=comm)
    if comm.Get_rank() == size - 1:
        time.sleep(3.0)
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            pass
    got = mpicoll.allreduce(np.ones(1000), comm=comm)
    agree(comm, (got == size).all(), f"{got[:3]}")


@pytest.mark.rank_counts(3, 4)
def test_stats_names_the_straggler(comm):
    """The last rank sleeps 20 ms before each of 50 calls: ``stats`` names it (issue 41: at
    N = 4 within 50 calls), every rank the same, and charges it about those 20 ms."""
    size, rank = comm.Get_size(), comm.Get_rank()
    x, y = np.ones(1024), np.empty(1024)
    mpicoll.allreduce(x, y, comm=comm)
    for _ in range(50):
        if rank == size - 1:
            time.sleep(0.02)
        mpicoll.allreduce(x, y, comm=comm)
    result = mpicoll.stats(comm, window=50)
    agree(comm, result["straggler"] == size - 1, f"{result}")
    mine = result["ranks"][size - 1]
    agree(comm, mine["calls"] == 50 and 0.01 < mine["mean"] < 0.2, f"{mine}")
    every = comm.allgather(result["straggler"])
    agree(comm, len(set(every)) == 1, f"{every}")


@pytest.mark.rank_counts(2, 3)
def test_stats_without_a_straggler(comm):
    x, y = np.ones(16), np.empty(16)
    for _ in range(30):
        mpicoll.allreduce(x, y, comm=comm)
    result = mpicoll.stats(comm)
    agree(comm, set(result["ranks"]) == set(range(comm.Get_size())) and result["calls"] >= 30,
          f"{result}")
    agree(comm, result["straggler"] is None or
          result["ranks"][result["straggler"]]["mean"] >= 50e-6, f"{result}")


@pytest.mark.rank_counts(3)
def test_a_live_rank_declared_dead_stops(comm):
    """Heartbeats only; the last rank's detector stalls 4 s (a stopped or starved process), so
    the others declare it dead, raise ProcessFailed naming it and shrink to two ranks. The live
    rank they named is told: its next call raises ProcessFailed naming itself, and its shrink
    refuses (fail-stop: never two groups that each go on alone; the split a loaded Slurm run
    showed before, one rank alone and three together)."""
    rank, last = comm.Get_rank(), comm.Get_size() - 1
    with environment(MPICOLL_HEARTBEAT_ONLY="1", MPICOLL_HEARTBEAT_TIMEOUT="1.0"):
        mpicoll.allreduce(np.ones(4), comm=comm)        # (set up and watched, heartbeats only)
        got, shrunk = None, None
        if rank == last:
            with background_paused():
                time.sleep(4.0)
            time.sleep(1.0)                             # (its detector hears the decision)
        try:
            mpicoll.allreduce(np.ones(4), comm=comm, timeout=30)
        except mpicoll.ProcessFailed as exc:
            got = exc
        if rank == last:
            try:
                mpicoll.shrink(comm, timeout=10)
                refused = None
            except mpicoll.ProcessFailed as exc:
                refused = exc
            agree(comm, got is not None and got.ranks == [last] and "declared dead" in str(got)
                  and refused is not None, f"{got!r}, shrink: {refused!r}")
        else:
            shrunk = mpicoll.shrink(comm, timeout=10)
            y = mpicoll.allreduce(np.ones(4), comm=shrunk)
            agree(comm, got is not None and got.ranks == [last] and shrunk.Get_size() == last
                  and (y == last).all(), f"{got!r}, {y}")
            shrunk.Free()
