"""Prepared calls (``plan.Prepared``, kept by ``cache``): a plain allreduce that comes again with the same arguments
reuses the first call's decisions. It must still give exact answers, raise the same errors on
bad buffers, hash its arguments into the tag (a mismatch is caught), mark the communicator
broken after a failure, agree every call with validate, start afresh after settings.reload()
and on a new communicator, and keep a bounded table."""

import time

import numpy as np
import pytest
from mpi4py import MPI

import mpicoll
from mpicoll import cache, settings
from mpicoll._runtime import context
from mpicoll.testing import agree, environment, exact_input, exact_result, raises_everywhere

pytestmark = [pytest.mark.mpi, pytest.mark.rank_counts(1, 2, 4)]

ALGORITHMS = ["auto", "ring", "recursive_doubling", "rabenseifner", "binomial", "mpi"]


def _table(comm):
    return context.attach(comm).cached


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("timeout", [None, 60.0, float("inf")])
def test_repeated_calls_are_exact(comm, algorithm, timeout):
    """The same buffers, new values each call, out of place, in place and allocated: every call
    exact, and the calls after the first served by a prepared call where one is kept."""
    size, rank = comm.Get_size(), comm.Get_rank()
    n = 1001
    send, recv, inplace = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64)
    bad = []
    for i in range(4):
        send[:] = exact_input(rank, n, np.int64, "sum") + i
        want = exact_result(size, n, np.int64, "sum") + size * i
        mpicoll.allreduce(send, recv, algorithm=algorithm, comm=comm, timeout=timeout)
        inplace[:] = send
        mpicoll.allreduce(MPI.IN_PLACE, inplace, algorithm=algorithm, comm=comm, timeout=timeout)
        fresh = mpicoll.allreduce(send, algorithm=algorithm, comm=comm, timeout=timeout)
        bad += [f"call {i} {form}" for form, got in
                (("out of place", recv), ("in place", inplace), ("allocated", fresh))
                if not np.array_equal(got, want)]
    agree(comm, not bad, bad)
    kept = [p for p in _table(comm).values() if p.plan.kind in ("schedule", "library")]
    agree(comm, size == 1 or algorithm == "auto" or len(kept) == 3,
          f"{len(kept)} prepared calls that run a schedule or the MPI library's all-reduce")


def test_bad_buffers_after_a_prepared_call(comm):
    """A call whose key matches a prepared one still raises the full path's error, on every
    rank, before any communication: non-contiguous, read-only, aliased, overlapping."""
    base = np.zeros(8)
    for _ in range(2):
        mpicoll.allreduce(np.zeros(4), np.zeros(4), comm=comm)
        mpicoll.allreduce(MPI.IN_PLACE, np.zeros(4), comm=comm)
    read_only = np.zeros(4)
    read_only.flags.writeable = False
    x = np.zeros(4)
    cases = [
        ((np.arange(8.0)[::2], np.zeros(4)), ValueError, "sendbuf must be C-contiguous"),
        ((np.zeros(4), np.zeros(8)[::2]), ValueError, "recvbuf must be C-contiguous"),
        ((np.zeros(4), read_only), ValueError, "recvbuf is read-only"),
        ((MPI.IN_PLACE, read_only), ValueError, "recvbuf is read-only"),
        ((x, x), ValueError, "overlap"),
        ((base[:4], base[2:6]), ValueError, "overlap"),
        ((np.zeros(4), np.zeros(5)), ValueError, "recvbuf has 5 elements, expected 4"),
    ]
    for args, exc, match in cases:
        raises_everywhere(comm, exc, mpicoll.allreduce, *args, comm=comm, match=match)
    out = mpicoll.allreduce(base[:4] + 1, base[4:], comm=comm)     # views, disjoint: fine
    agree(comm, np.array_equal(out, np.full(4, comm.size)), out)


def test_bad_buffers_right_after_the_same_call(comm):
    """Each bad call comes right after a good one with the same key (the repeated call's
    inline path, cache.allreduce): it still raises the full path's error on every rank; and
    buffers of other shapes with the same element count give the right sum."""
    good = (np.zeros(4), np.zeros(4))
    base = np.zeros(8)
    read_only = np.zeros(4)
    read_only.flags.writeable = False
    x = np.zeros(4)
    cases = [
        ((np.zeros(4), np.zeros(8)[::2]), ValueError, "recvbuf must be C-contiguous"),
        ((np.zeros(4), read_only), ValueError, "recvbuf is read-only"),
        ((x, x), ValueError, "overlap"),
        ((base[:4], base[2:6]), ValueError, "overlap"),
    ]
    for args, exc, match in cases:
        for _ in range(2):
            mpicoll.allreduce(*good, comm=comm)
        raises_everywhere(comm, exc, mpicoll.allreduce, *args, comm=comm, match=match)
    for send_shape, recv_shape in (((2, 2), (4,)), ((4, 1), (1, 4)), ((1, 4), (4,))):
        send = np.arange(4.0).reshape(send_shape)
        for _ in range(3):
            out = mpicoll.allreduce(send, np.zeros(recv_shape), comm=comm)
        agree(comm, np.array_equal(out.reshape(-1), comm.size * np.arange(4.0)),
              f"{send_shape} -> {recv_shape}: {out}")


def test_mismatch_on_a_prepared_call(comm):
    """The tag of a prepared call carries its arguments' hash: a rank that passes another count
    (full path) never matches the prepared call of the others; at the deadline every rank
    raises ArgumentMismatch naming both counts (the Watch made late, on the prepared call);
    then CommunicatorBroken, on the prepared call too."""
    if comm.size == 1:
        pytest.skip("needs two ranks")
    last = comm.size - 1
    for _ in range(2):
        mpicoll.allreduce(np.ones(10), algorithm="ring", comm=comm, timeout=1.0)
    agree(comm, len(_table(comm)) == 1, "one prepared call")
    n = 10 + 10 * (comm.rank == last)
    exc = raises_everywhere(comm, mpicoll.ArgumentMismatch, mpicoll.allreduce, np.ones(n),
                            algorithm="ring", comm=comm, timeout=1.0,
                            match=rf"count: 10 on rank\(s\) \[0.*\], 20 on rank\(s\) \[{last}\]")
    agree(comm, exc.in_flight, exc)
    raises_everywhere(comm, mpicoll.CommunicatorBroken, mpicoll.allreduce, np.ones(10),
                      algorithm="ring", comm=comm, timeout=1.0)


@pytest.mark.parametrize("timeout", [60.0, float("inf")])
def test_the_library_all_reduce_prepared(comm, monkeypatch, timeout):
    """``algorithm="mpi"`` is prepared too: a repeated call skips the full path (no new plan)
    and is exact. Under a deadline it keeps the full path's hash check: a rank that passes
    another count (full path) against the others' prepared call -- every rank raises
    ArgumentMismatch naming both counts, before any transfer, and the communicator stays
    usable on every rank, prepared or not."""
    from mpicoll import plan
    size, rank, last = comm.Get_size(), comm.Get_rank(), comm.Get_size() - 1
    send = exact_input(rank, 10, np.float64, "sum")
    for _ in range(2):
        out = mpicoll.allreduce(send, algorithm="mpi", comm=comm, timeout=timeout)
    made, real = [], plan.make
    monkeypatch.setattr(plan, "make", lambda *a, **k: made.append(1) or real(*a, **k))
    out = mpicoll.allreduce(send, algorithm="mpi", comm=comm, timeout=timeout)
    agree(comm, np.array_equal(out, exact_result(size, 10, np.float64, "sum")), out)
    agree(comm, size == 1 or not made, f"{len(made)} plan(s) made for a repeated call")
    monkeypatch.undo()
    if size == 1 or timeout == float("inf"):
        return                      # (alone, or no deadline: no hash check to hold to)
    n = 10 + 10 * (rank == last)
    exc = raises_everywhere(comm, mpicoll.ArgumentMismatch, mpicoll.allreduce, np.ones(n),
                            algorithm="mpi", comm=comm, timeout=timeout,
                            match=rf"count: 10 on rank\(s\) \[0.*\], 20 on rank\(s\) \[{last}\]")
    agree(comm, not exc.in_flight, exc)
    for _ in range(2):              # usable: the prepared call (and the full path on `last`)
        out = mpicoll.allreduce(send, algorithm="mpi", comm=comm, timeout=timeout)
        agree(comm, np.array_equal(out, exact_result(size, 10, np.float64, "sum")), out)


def test_timeout_on_a_prepared_call(comm):
    """A rank missing from a prepared call: the others raise CollectiveTimeout naming it, and
    the communicator is broken for them."""
    if comm.size == 1:
        pytest.skip("needs two ranks")
    last = comm.size - 1
    for _ in range(2):
        mpicoll.allreduce(np.ones(10), algorithm="ring", comm=comm, timeout=1.0)
    if comm.rank != last:
        try:
            mpicoll.allreduce(np.ones(10), algorithm="ring", comm=comm, timeout=0.5)
            got = None
        except mpicoll.CollectiveTimeout as error:
            got = error
        ok = got is not None and last in got.missing
        try:
            mpicoll.allreduce(np.ones(10), algorithm="ring", comm=comm, timeout=0.5)
            ok = False
        except mpicoll.CommunicatorBroken:
            pass
    else:
        ok, got = True, None
    agree(comm, ok, got)


def test_validate_agrees_every_call(comm):
    """validate=True is never served by a prepared call: a count that differs on the third
    call is still an ArgumentMismatch on every rank, found by the agreement step."""
    if comm.size == 1:
        pytest.skip("needs two ranks")
    last = comm.size - 1
    for _ in range(2):
        mpicoll.allreduce(np.ones(10), comm=comm, validate=True, timeout=30.0)
    agree(comm, not _table(comm), "nothing kept under validate")
    raises_everywhere(comm, mpicoll.ArgumentMismatch, mpicoll.allreduce,
                      np.ones(10 + (comm.rank == last)), comm=comm, validate=True, timeout=30.0,
                      match="count")
    with environment(MPICOLL_VALIDATE="1"):
        mpicoll.allreduce(np.ones(10), comm=comm)
        raises_everywhere(comm, mpicoll.ArgumentMismatch, mpicoll.allreduce,
                          np.ones(10 + (comm.rank == last)), comm=comm, timeout=30.0,
                          match="count")


def test_reload_starts_afresh(comm):
    """settings.reload() (here through ``environment``) makes the next call decide again: the
    deadline it keeps is the new MPICOLL_TIMEOUT's."""
    if comm.size == 1:
        pytest.skip("no deadline on one rank")
    mpicoll.allreduce(np.ones(10), algorithm="ring", comm=comm)
    default = settings.get("MPICOLL_TIMEOUT")
    before = context.attach(comm).last_cached[1].timeout
    with environment(MPICOLL_TIMEOUT="7"):
        mpicoll.allreduce(np.ones(10), algorithm="ring", comm=comm)
        during = context.attach(comm).last_cached[1].timeout
    with environment(MPICOLL_TIMEOUT="0"):
        mpicoll.allreduce(np.ones(10), algorithm="ring", comm=comm)
        off = context.attach(comm).last_cached[1].timeout
    agree(comm, (before, during, off) == (default, 7.0, None), (before, during, off))


def test_a_new_communicator_starts_empty(comm):
    """Prepared calls live in the communicator's state: a communicator freed and another made
    (MPI may give it the same handle) has none."""
    dup = comm.Dup()
    mpicoll.allreduce(np.ones(3), comm=dup)
    mpicoll.allreduce(np.ones(3), comm=dup)
    old = context.attach(dup)
    dup.Free()
    again = comm.Dup()
    try:
        st = context.known(again)
        agree(comm, st is None or (st is not old and not st.cached), "a stale state")
        out = mpicoll.allreduce(np.ones(3), comm=again)
        agree(comm, np.array_equal(out, np.full(3, comm.size)), out)
    finally:
        again.Free()


def test_table_is_bounded(comm):
    """More distinct calls than the table holds: it keeps the most recent ones only."""
    for n in range(1, cache.PER_COMM + 21):
        mpicoll.allreduce(np.ones(n), algorithm="ring", comm=comm)
    counts = [key[5] for key in _table(comm)]
    agree(comm, counts == list(range(21, cache.PER_COMM + 21)), counts[:3])


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("algorithm", ["auto", "ring", "recursive_doubling", "binomial"])
@pytest.mark.parametrize("collective", ["reduce_scatter_block", "allgather", "bcast"])
def test_other_collectives_repeated(comm, collective, algorithm, inplace):
    """reduce_scatter_block, allgather and bcast: the same buffers, new values each call, every
    call exact (the calls after the first served by a prepared call where one is kept)."""
    from mpicoll.registry import COLLECTIVES
    if algorithm != "auto" and algorithm not in COLLECTIVES[collective]:
        pytest.skip(f"no {collective} {algorithm}")
    if collective == "bcast" and inplace:
        pytest.skip("bcast is in place")
    size, rank, n = comm.Get_size(), comm.Get_rank(), 37
    bad = []
    if collective == "reduce_scatter_block":
        send, out = np.empty(n * size, np.int64), np.empty(n * (size if inplace else 1), np.int64)
    elif collective == "allgather":
        send, out = np.empty(n, np.int64), np.empty(n * size, np.int64)
    else:
        out = np.empty(n, np.int64)
    for i in range(4):
        if collective == "reduce_scatter_block":
            send[:] = exact_input(rank, n * size, np.int64, "sum") + i
            want = (exact_result(size, n * size, np.int64, "sum") + size * i)[rank * n:][:n]
            if inplace:
                out[:] = send
            mpicoll.reduce_scatter_block(MPI.IN_PLACE if inplace else send, out,
                                         algorithm=algorithm, comm=comm)
            got = out[:n]
        elif collective == "allgather":
            send[:] = exact_input(rank, n, np.int64, "sum") + i
            want = np.concatenate([exact_input(r, n, np.int64, "sum") + i for r in range(size)])
            if inplace:
                out[rank * n:(rank + 1) * n] = send
            mpicoll.allgather(MPI.IN_PLACE if inplace else send, out, algorithm=algorithm,
                              comm=comm)
            got = out
        else:
            root = i % size
            want = exact_input(root, n, np.int64, "sum") + i
            out[:] = want if rank == root else 0
            mpicoll.bcast(out, root, algorithm=algorithm, comm=comm)
            got = out
        if not np.array_equal(got, want):
            bad.append(f"call {i}")
    agree(comm, not bad, bad)
    kept = [key for key in _table(comm) if key[0] == collective]
    agree(comm, algorithm == "auto" or len(kept) == (size if collective == "bcast" and size < 4
                                                     else min(size, 4) if collective == "bcast"
                                                     else 1), f"{len(kept)} kept")


def test_other_collectives_bad_buffers(comm):
    """After prepared calls, a read-only or non-contiguous buffer, or overlapping buffers,
    still raise the full path's error on every rank."""
    size = comm.Get_size()
    for _ in range(2):
        mpicoll.bcast(np.zeros(4), 0, comm=comm)
        mpicoll.allgather(np.zeros(4), np.zeros(4 * size), comm=comm)
        mpicoll.reduce_scatter_block(np.zeros(4 * size), np.zeros(4), comm=comm)
    read_only = np.zeros(4)
    read_only.flags.writeable = False
    whole = np.zeros(8 * size)
    raises_everywhere(comm, ValueError, mpicoll.bcast, read_only, 0, comm=comm,
                      match="buf is read-only")
    raises_everywhere(comm, ValueError, mpicoll.bcast, np.zeros(8)[::2], 0, comm=comm,
                      match="must be C-contiguous")
    raises_everywhere(comm, ValueError, mpicoll.allgather, whole[:4], whole[:4 * size],
                      comm=comm, match="overlap")
    raises_everywhere(comm, ValueError, mpicoll.reduce_scatter_block, whole[:4 * size],
                      read_only, comm=comm, match="recvbuf is read-only")


def test_bcast_count_mismatch_on_a_prepared_call(comm):
    """bcast's count is in the key and in the tag's hash: the last rank passing another count
    than the others' prepared call never takes its sender's message: at the deadline it raises
    ArgumentMismatch (the ranks whose own calls matched may complete without it)."""
    if comm.size == 1:
        pytest.skip("needs two ranks")
    last = comm.size - 1
    for _ in range(2):
        mpicoll.bcast(np.zeros(10), 0, algorithm="binomial", comm=comm, timeout=1.0)
    try:
        mpicoll.bcast(np.zeros(20 if comm.rank == last else 10), 0, algorithm="binomial",
                      comm=comm, timeout=1.0)
        got = None
    except mpicoll.ArgumentMismatch as error:
        got = error
    agree(comm, comm.rank != last or got is not None, "returned")


@pytest.mark.parametrize("algorithm", ["ring", "recursive_doubling", "rabenseifner"])
def test_watch_made_late_gives_exact_results(comm, monkeypatch, algorithm):
    """With no spin (``SPIN_SECONDS = 0``) every pending round of a prepared call under a
    deadline goes to a Watch made then, and the loop is re-entered after it: still exact."""
    from mpicoll.executors import compiled
    monkeypatch.setattr(compiled, "SPIN_SECONDS", 0.0)
    late, run_watched = [], compiled._run_watched

    def counted(*args):
        if len(args) == 15:         # resume: the pending row a prepared call handed over
            late.append(args[-1])
        return run_watched(*args)
    monkeypatch.setattr(compiled, "_run_watched", counted)
    size, rank, n = comm.Get_size(), comm.Get_rank(), 100003
    send, out = np.empty(n, np.int64), np.empty(n, np.int64)
    bad = []
    for i in range(3):
        send[:] = exact_input(rank, n, np.int64, "sum") - i
        if rank == 0:       # late: the others' first round is surely pending when their spin ends
            time.sleep(0.05)
        mpicoll.allreduce(send, out, algorithm=algorithm, comm=comm, timeout=60.0)
        if not np.array_equal(out, exact_result(size, n, np.int64, "sum") - size * i):
            bad.append(i)
    agree(comm, not bad, bad)
    if size > 1:        # rank 0 came late: the others handed their pending round to a Watch
        handed = comm.allreduce(sum(1 for r in late if r >= 0))
        agree(comm, handed > 0, "no prepared call handed a round to a Watch")
