"""Nonblocking collectives under MPI: several requests in flight while the main thread runs a
numba loop give exact results and complete in any wait order; the progress thread moves them
without the caller looking; caller-driven progress works too; compressed all-reduce ends with
the same bits on every rank and its byte counters show the narrower wire; Buckets reduce in
bucket order; validate and timeouts behave as for blocking calls."""

import gc
import time

import numpy as np
import pytest
from mpi4py import MPI
from numba import njit

import mpicoll
from mpicoll import compression
from mpicoll._runtime.context import state
from mpicoll.executors import progress
from mpicoll.registry import COLLECTIVES, lookup
from mpicoll.testing import agree, environment, exact_input, exact_result, raises_everywhere

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(300)]


@njit(nogil=True, cache=True)
def busy(x, rounds):
    """Compute that holds no GIL: ``rounds`` passes of a recurrence over ``x``."""
    for _ in range(rounds):
        for i in range(x.shape[0]):
            x[i] = 0.5 * x[i] + 1.0
    return x[0]


def start_all(comm, n, algorithms):
    """One request per (collective, algorithm) plus extra all-reduces, with what each must give."""
    size, rank = comm.Get_size(), comm.Get_rank()
    started = []
    for algo in algorithms["allreduce"]:
        started.append((mpicoll.iallreduce(exact_input(rank, n, np.float64, "sum"),
                                           algorithm=algo, comm=comm),
                        exact_result(size, n, np.float64, "sum")))
    for algo in algorithms["reduce_scatter_block"]:
        started.append((mpicoll.ireduce_scatter_block(
            exact_input(rank, n * size, np.int64, "max"), op="max", algorithm=algo, comm=comm),
            exact_result(size, n * size, np.int64, "max")[rank * n:(rank + 1) * n]))
    for algo in algorithms["allgather"]:
        started.append((mpicoll.iallgather(exact_input(rank, n, np.int32, "sum"), algorithm=algo,
                                           comm=comm),
                        np.stack([exact_input(r, n, np.int32, "sum") for r in range(size)])))
    for algo in algorithms["bcast"]:
        root = size - 1
        buf = exact_input(root, n, np.float32, "sum") if rank == root else np.zeros(n, np.float32)
        started.append((mpicoll.ibcast(buf, root, algorithm=algo, comm=comm),
                        exact_input(root, n, np.float32, "sum")))
    return started


ALL = {c: [a for a, algo in COLLECTIVES[c].items()     # shared-memory ones have no i-form
            if not algo.has("shared-memory")] for c in COLLECTIVES}


@pytest.mark.parametrize("order", ["forward", "reverse", "shuffled"])
def test_requests_in_flight_during_numba_compute_are_exact(comm, order):
    """Every algorithm of every collective in flight at once (plus large all-reduces) while a
    nogil numba loop runs: exact answers whatever the wait order; with the progress thread they
    finish before the caller ever looks."""
    n = 50_003
    started = start_all(comm, n, ALL)
    x = np.zeros(1 << 16)
    deadline = time.monotonic() + 60
    caller = progress.mode() == "caller"       # MPICOLL_PROGRESS=caller: look between loops
    while not all(r.test() if caller else r.done for r, _ in started) \
            and time.monotonic() < deadline:
        busy(x, 20)
    moved_alone = all(r.done for r, _ in started)
    idx = list(range(len(started)))
    if order == "reverse":
        idx.reverse()
    elif order == "shuffled":
        np.random.default_rng(comm.Get_rank()).shuffle(idx)       # each rank its own order
    results = {i: started[i][0].wait() for i in idx}
    bad = [f"{started[i][0].what}" for i in idx if not np.array_equal(results[i], started[i][1])]
    agree(comm, not bad, f"wrong answers: {bad}")
    if progress.mode() == "thread":
        agree(comm, moved_alone, "the progress thread did not finish the requests while the "
                                 "caller computed")


def test_caller_progress_in_any_order(comm):
    """MPICOLL_PROGRESS=caller (what runs below MPI_THREAD_MULTIPLE): no thread, requests move
    in test()/wait(), and waiting in different orders on different ranks cannot deadlock."""
    with environment(MPICOLL_PROGRESS="caller"):
        assert progress.mode() == "caller"
        started = start_all(comm, 4099, {"allreduce": ["ring", "recursive_doubling"],
                                         "reduce_scatter_block": [], "allgather": ["ring"],
                                         "bcast": ["binomial"]})
        busy(np.zeros(1000), 10)
        idx = list(range(len(started)))
        if comm.Get_rank() % 2:
            idx.reverse()
        results = {i: started[i][0].wait() for i in idx}
        bad = [started[i][0].what for i in idx if not np.array_equal(results[i], started[i][1])]
        agree(comm, not bad, f"wrong answers: {bad}")


def test_blocking_call_while_requests_are_in_flight(comm):
    size, rank = comm.Get_size(), comm.Get_rank()
    reqs = [mpicoll.iallreduce(exact_input(rank, 30_000 + k, np.int64, "sum"), comm=comm)
            for k in range(4)]
    mid = mpicoll.allreduce(exact_input(rank, 777, np.int64, "min"), op="min", comm=comm)
    outs = mpicoll.waitall(reqs)
    ok = np.array_equal(mid, exact_result(size, 777, np.int64, "min")) and all(
        np.array_equal(o, exact_result(size, 30_000 + k, np.int64, "sum"))
        for k, o in enumerate(outs))
    agree(comm, ok, "a blocking call among requests in flight gave a wrong answer")


def test_blocking_and_persistent_calls_while_shared_memory_requests_are_in_flight(comm):
    """The progress thread runs a request in shared memory whole (hierarchical, inner=shm:
    one rank per virtual node here) while this thread runs blocking calls on the compiled
    executor, first and cached, on the same communicator and on another, and a persistent
    one: the Slurm run at 4 ranks on 2 nodes (auto's choice there) returned wrong sums and
    hung, the two threads sharing the executor's request handles and the communicator's
    scratch."""
    size, rank = comm.Get_size(), comm.Get_rank()
    other = comm.Dup()
    try:
        with environment(MPICOLL_RANKS_PER_NODE="1"):
            again = mpicoll.allreduce_init(exact_input(rank, 5_000, np.float64, "sum"),
                                           algorithm="ring", comm=comm)
            outs, wrong = [], []
            for trial in range(3):
                reqs = [mpicoll.iallreduce(exact_input(rank, 30_000 + k, np.int64, "sum"),
                                           algorithm="hierarchical", inner="shm", comm=comm)
                        for k in range(3)]
                mids = [mpicoll.allreduce(exact_input(rank, 3_001, np.int64, "min"), op="min",
                                          algorithm=algo, comm=c)
                        for c in (comm, other) for algo in ("recursive_doubling", "ring")]
                again.start()
                outs = mpicoll.waitall(reqs) + [again.wait()]
                wrong += [f"trial {trial}: blocking call {j}" for j, m in enumerate(mids)
                          if not np.array_equal(m, exact_result(size, 3_001, np.int64, "min"))]
                wrong += [f"trial {trial}: request {k}" for k, o in enumerate(outs[:3])
                          if not np.array_equal(o, exact_result(size, 30_000 + k, np.int64,
                                                                "sum"))]
                if not np.array_equal(outs[3], exact_result(size, 5_000, np.float64, "sum")):
                    wrong.append(f"trial {trial}: persistent")
            again.free()
        agree(comm, not wrong, f"wrong answers: {wrong}")
    finally:
        other.Free()


@pytest.mark.max_ranks(5)
@pytest.mark.parametrize("compress", ["bf16", "fp16", "int8"])
@pytest.mark.parametrize("algorithm", [a for a in COLLECTIVES["allreduce"]
                                       if lookup("allreduce", a).scheduled])
def test_compressed_allreduce_same_bits_everywhere_and_fewer_bytes(comm, compress, algorithm):
    size, rank = comm.Get_size(), comm.Get_rank()
    n = 100_003
    x = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
    exact = sum(np.random.default_rng(r).standard_normal(n).astype(np.float32)
                .astype(np.float64) for r in range(size))
    traffic = state(comm).traffic
    before = traffic["bytes_sent"]
    with environment(MPICOLL_RANKS_PER_NODE="2"):
        # the scheduled default inner, named: a plain hierarchical call may otherwise run its
        # node phases in shared memory, sending nothing inside a node
        algo, nodes = lookup("allreduce", algorithm), state(comm).nodes()
        given = {o.name: o.value(None, nodes) for o in algo.options if o.name == "inner"}
        plain = mpicoll.allreduce(x, algorithm=algorithm, comm=comm, **given)
        middle = traffic["bytes_sent"]
        messages_before = traffic["messages_sent"]
        out = mpicoll.allreduce(x, algorithm=algorithm, comm=comm, compress=compress)
    raw, wire = middle - before, traffic["bytes_sent"] - middle
    messages = traffic["messages_sent"] - messages_before
    everyone = comm.allgather(out.tobytes())
    agree(comm, all(b == everyone[0] for b in everyone), "ranks ended with different bits")
    # the rounded sum (int8's pieces are the schedule's); one rank sends nothing and rounds
    # nothing (mpicoll.compression; test_collectives' left-fold test checks that)
    if compress != "int8" and size > 1:
        rounded = out.copy()
        compression.CODECS[compress].round(rounded)
        agree(comm, np.array_equal(rounded.view(np.uint32), out.view(np.uint32)),
              "the result is not rounded")
    if compress == "int8":
        # values + one 4-byte scale per piece: the 256-element chunks, plus at most one more
        # per message and per slice edge of any rank's schedule that falls inside it (<= 2N)
        limit = raw / 4 + 4 * (raw / 4 / 256 + (1 + 2 * size) * messages)
        agree(comm, wire <= limit, f"int8 sent {wire} B, raw {raw} B, limit {limit:.0f}")
    else:
        agree(comm, wire * 2 == raw, f"{compress} sent {wire} B, raw {raw} B: not half")
    err = float(np.abs(out - exact).max() / np.abs(exact).max())
    bound = {"bf16": 2 ** -8, "fp16": 2 ** -11, "int8": 2 ** -7}[compress] * 2 * size
    agree(comm, err < bound, f"relative error {err:.2e} above {bound:.2e}")
    agree(comm, np.abs(plain - exact).max() < 1e-4 * np.abs(exact).max(), "plain result wrong")


@pytest.mark.max_ranks(5)
@pytest.mark.parametrize("compress", ["bf16", "fp16"])
@pytest.mark.parametrize("algorithm", [a for a in COLLECTIVES["allreduce"]
                                       if lookup("allreduce", a).scheduled])
def test_error_feedback_rides_on_the_first_passes_unchanged(comm, compress, algorithm):
    """The residual added where the run first touches each slice gives the bits of adding it
    to the whole input first (ErrorFeedback.apply, then the call without it): the result and
    the residual kept, over three calls, with a divisor."""
    if comm.Get_size() == 1:
        pytest.skip("one rank sends nothing: no rounding, no residual (mpicoll.compression)")
    rank, n = comm.Get_rank(), 50_001
    rng = np.random.default_rng(rank)
    fed, first = mpicoll.ErrorFeedback(n, divide=3), mpicoll.ErrorFeedback(n, divide=3)
    same = True
    with environment(MPICOLL_RANKS_PER_NODE="2"):
        for _ in range(3):
            x = rng.standard_normal(n).astype(np.float32)
            out = mpicoll.allreduce(x, algorithm=algorithm, comm=comm, compress=compress,
                                    error_feedback=fed)
            y = x.copy()
            first.apply(compression.CODECS[compress], y)
            want = mpicoll.allreduce(y, algorithm=algorithm, comm=comm, compress=compress)
            same &= np.array_equal(out.view(np.uint32), want.view(np.uint32)) and \
                np.array_equal(fed.residual.view(np.uint32), first.residual.view(np.uint32))
    agree(comm, same and np.abs(fed.residual).max() > 0, "error feedback differs")


@pytest.mark.parametrize("who", ["thread", "caller"])
def test_buckets_average_in_bucket_order(comm, who):
    """Gradients ready in a different order on each rank: buckets still start in bucket order
    (no mismatched tags) and hold the exact average -- advanced by the progress thread, or by
    the caller in ready() and wait() (``progress="caller"``)."""
    size, rank = comm.Get_size(), comm.Get_rank()
    shapes = [(64, 33), (33,), (33, 100), (100,), (100, 10), (10,)]
    params = [np.zeros(s, np.float64) for s in shapes]
    b = mpicoll.Buckets(params, bucket_bytes=30_000, comm=comm, gradient_as_bucket_view=True,
                        progress=who)
    assert len(b.buckets) > 2 and b.progress == who
    for step in range(3):
        order = np.random.default_rng(rank + 10 * step).permutation(len(shapes))
        for i in order:
            b.grads[i][...] = np.arange(b.grads[i].size).reshape(shapes[i]) * (rank + 1) + step
            b.ready(int(i))
        b.wait()
        want = [np.arange(np.prod(s)).reshape(s) * (size + 1) / 2 + step for s in shapes]
        agree(comm, all(np.array_equal(g, w) for g, w in zip(b.grads, want)),
              f"step {step}: wrong averages")


def test_validate_catches_mismatched_nonblocking_calls(comm):
    if comm.Get_size() == 1:
        pytest.skip("needs two ranks to disagree")
    rank = comm.Get_rank()
    n = 10 if rank else 11
    raises_everywhere(comm, mpicoll.ArgumentMismatch, mpicoll.iallreduce, np.ones(n), comm=comm,
                      validate=True, match="count")
    raises_everywhere(comm, mpicoll.ArgumentMismatch, mpicoll.iallreduce,
                      np.ones(8, np.float32), comm=comm, validate=True,
                      compress="bf16" if rank else "int8", match="compress")


@pytest.mark.parametrize("who", ["thread", "caller"])
def test_a_library_bucket_started_again_does_not_wait_for_the_others(comm, who):
    """``algorithm="mpi"`` under a deadline checks its arguments across the ranks; a held call
    started again (a ``Buckets``' bucket after its first step) leaves that check to its request
    (posted with the collective), so ``ready`` returns while a rank is still 0.5 s away -- the
    check used to wait for it -- and the averages are exact, the buckets moved by the progress
    thread or by the caller."""
    size, rank = comm.Get_size(), comm.Get_rank()
    if size == 1:
        pytest.skip("needs another rank to wait for")
    grads = [np.zeros(300), np.zeros(200)]
    b = mpicoll.Buckets(grads, 1024, algorithm="mpi", comm=comm, timeout=60, progress=who)
    for step in range(3):
        comm.Barrier()
        if step == 2 and rank == size - 1:
            time.sleep(0.5)
        t0 = time.monotonic()
        for i in (1, 0):
            grads[i][:] = rank + step
            b.ready(i)
        started = time.monotonic() - t0
        b.wait()
        want = (size - 1) / 2 + step                            # (the average)
        agree(comm, all(np.all(g == want) for g in grads), f"step {step}: wrong averages")
    agree(comm, rank == size - 1 or started < 0.25,
          f"the buckets' starts took {started:.3f} s (the last rank 0.5 s late)")


def test_a_library_bucket_started_out_of_order_fails_on_every_rank(comm):
    """Two ``Buckets`` of ``algorithm="mpi"`` (10 and 11 elements), stepped in turn once, then
    rank 0 steps the second first: the checks inside the requests see the counts differ, so
    every rank's ``wait`` raises ``ArgumentMismatch`` at once (not at the deadline) naming the
    count's largest and smallest value and its own, and the communicator is broken (other
    calls may have started since: ``Call.check_failed``)."""
    size, rank = comm.Get_size(), comm.Get_rank()
    if size == 1:
        pytest.skip("needs two ranks to disagree")
    both = [mpicoll.Buckets([np.ones(n)], 1 << 20, algorithm="mpi", comm=comm, timeout=60,
                            progress="caller") for n in (10, 11)]
    for b in both:
        b.ready(0)
        b.wait()
    first = both[1] if rank == 0 else both[0]
    mine = 11 if rank == 0 else 10
    t0 = time.monotonic()
    try:
        first.ready(0)
        first.wait()
        ok, msg = False, "no ArgumentMismatch"
    except mpicoll.ArgumentMismatch as exc:
        text = str(exc)
        ok = exc.in_flight and time.monotonic() - t0 < 30 and "count: 11 and 10" in text and \
            f"this rank passed {mine}" in text
        msg = text
    if not broken(comm):
        ok, msg = False, "the communicator was used again"
    agree(comm, ok, msg)


def test_a_call_given_up_leaves_no_write_into_freed_memory(comm):
    """The last rank calls ``allreduce(algorithm="mpi")`` only after the others gave up on it
    (``CollectiveTimeout`` in its argument check, an ``MPI_Iallreduce``): their check is still
    posted in MPI, and the late rank's completes it. mpi4py does not keep a nonblocking
    collective's buffers alive, so mpicoll must: memory the others allocate after giving up
    (small arrays, where numpy reuses freed ones) is not written into. (Before: one of 128 such
    arrays read [1, -1], the check's result.)"""
    size, rank = comm.Get_size(), comm.Get_rank()
    if size == 1:
        pytest.skip("needs a late rank")
    late = size - 1
    x, out = np.ones(100), np.empty(100)
    mpicoll.allreduce(x, out, algorithm="mpi", comm=comm, timeout=60)
    ok, msg = True, ""
    if rank != late:
        try:
            mpicoll.allreduce(x, out, algorithm="mpi", comm=comm, timeout=1.0)
            ok, msg = False, "no CollectiveTimeout"
        except mpicoll.CollectiveTimeout:
            pass
        gc.collect()
        probes = [np.full(k, -7, np.int64) for k in (2, 4) for _ in range(64)]
    comm.Barrier()                              # (MPI's own: the others have given up)
    if rank == late:
        try:
            mpicoll.allreduce(x, out, algorithm="mpi", comm=comm, timeout=2.0)
            ok, msg = False, "the late rank's call completed"
        except (mpicoll.CollectiveTimeout, mpicoll.CommunicatorBroken, mpicoll.PeerError):
            pass
    comm.Barrier()                              # (MPI progress: the late rank's messages in)
    if rank != late:
        for _ in range(100):
            comm.Iprobe()
        written = [p.tolist() for p in probes if np.any(p != -7)]
        if written:
            ok, msg = False, f"memory allocated after the give-up was written into: {written}"
    agree(comm, ok, msg)


def test_request_timeout_names_the_missing_rank(comm):
    """Rank 0 never starts the call: the others' requests fail with CollectiveTimeout naming
    it, within the deadline, and their communicator is broken afterwards."""
    rank = comm.Get_rank()
    mpicoll.allreduce(np.ones(4), comm=comm)                   # mpicoll's duplicate exists
    if rank == 0:
        ok, msg = True, ""
    else:
        req = mpicoll.iallreduce(np.ones(1000), comm=comm, algorithm="ring")
        t0 = time.monotonic()
        try:
            req.wait(timeout=1.0)
            ok, msg = False, "no timeout"
        except mpicoll.CollectiveTimeout as exc:
            ok, msg = 0 in exc.missing and time.monotonic() - t0 < 10, str(exc)
        if not broken(comm):
            ok, msg = False, "a broken communicator was used again"
    agree(comm, ok, msg)


def broken(comm) -> bool:
    """Whether a new call on ``comm`` raises ``CommunicatorBroken`` as it starts (on a usable
    communicator the request started is left to complete)."""
    try:
        mpicoll.iallreduce(np.ones(4), comm=comm)
    except mpicoll.CommunicatorBroken:
        return True
    return False


@pytest.mark.parametrize("keep", [False, True])
def test_a_kept_request_moves_only_when_its_caller_looks(comm, keep):
    """``Request.start(keep=True)`` (what ``Buckets`` do on a node with no core to spare): the
    progress thread never advances it -- still in flight 0.3 s after the last rank started,
    where the thread finishes one it was given -- and ``wait()`` completes it here."""
    from mpicoll._runtime.call import Call
    if comm.Get_size() == 1 or progress.mode() != "thread":
        pytest.skip("needs two ranks and the progress thread")
    flags = np.full(4, comm.Get_rank(), np.int32)
    req = progress.Request("a test's MPI_Iallreduce", result=flags,
                           library=lambda c: c.Iallreduce(MPI.IN_PLACE, flags, op=MPI.MAX))
    if comm.Get_rank() == comm.Get_size() - 1:
        time.sleep(0.2)                 # the others start first, and cannot finish at once
    other = progress.Request("the thread's MPI_Ibarrier", library=lambda c: c.Ibarrier())
    with Call("allreduce", "mpi", comm, 30.0, None, None) as call:
        req.start(call, call.open().traffic, keep=keep)
    with Call("barrier", "mpi", comm, 30.0, None, None) as call:
        other.start(call, call.open().traffic)          # (keeps the thread looking)
    comm.Barrier()                      # every rank started; now nobody looks for 0.3 s
    time.sleep(0.3)
    done_alone, other_done = req.done, other.done
    got = req.wait()
    other.wait()
    agree(comm, np.all(got == comm.Get_size() - 1), f"got {got}")
    agree(comm, other_done and done_alone != keep,
          f"keep={keep}: done before wait() {done_alone}, the thread's request {other_done}")
