"""``shm``, the shared-memory all-reduce (``algorithms/allreduce_shm.py`` on ``mpicoll.shm``),
under MPI.

It has no schedule, so its exact check is its own: every rank ends with the bits of numpy's
ufunc folded over the inputs in rank order -- the left-to-right fold it promises -- for random
floats (where a different order would show in the last bits), every op and dtype MPI allows,
in and out of place, at counts around N and around its chunk size. (Exact inputs against
MPI_Allreduce: tests/mpi/test_collectives.py, which runs every algorithm.) Also: the window's
life (made with messages on the call's tag, freed locally, no file left), and the failures of
issue #22 -- shm on one rank against mpi on another, and ``Free`` after a failed call -- end
in errors, not hangs.
"""

import hashlib
import math
import os
import tempfile
import time

import numba
import numpy as np
import pytest
from mpi4py import MPI

import mpicoll
from mpicoll import kernels, select, shm
from mpicoll._runtime.context import known, state
from mpicoll.errors import ArgumentMismatch, CollectiveTimeout
from mpicoll.schedule import block_displs
from mpicoll.shm import kernels as shm_kernels
from mpicoll.testing import agree, environment, raises_everywhere

pytestmark = pytest.mark.mpi


@pytest.fixture(autouse=True)
def one_node(request, comm):
    """shm runs where every rank shares one node: elsewhere (the Slurm runs) only its refusal
    is tested (``test_shm_refuses_what_it_cannot_do``)."""
    refusal = request.function is test_shm_refuses_what_it_cannot_do
    if len(state(comm).real_nodes) > 1 and not refusal:
        pytest.skip("the ranks span several nodes: shm refuses (tested)")
ORIGINAL = tuple(np.dtype(t) for t in (np.float32, np.float64, np.int32, np.int64))
FOUR = ("sum", "prod", "max", "min")


def inputs(size, n, dtype, seed):
    """Every rank's input (all ranks make all of them: the reference needs them)."""
    out, dtype = [], np.dtype(dtype)
    for r in range(size):
        rng = np.random.default_rng([seed, r, n])
        if dtype.kind == "b":
            x = rng.integers(0, 2, n)
        elif dtype.kind == "c":
            x = rng.standard_normal(n) + 1j * rng.standard_normal(n)
        elif dtype.kind in "iu":
            x = rng.integers(-5, 6, n)
        else:                               # float16, bfloat16, float32, float64
            x = rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n)
            x[rng.random(n) < 0.01] = np.nan if n > 50 else 1.0      # NaNs: max/min keep order
        out.append(x.astype(dtype))
    return out


def rank_order(xs, op, dtype):
    """op over the inputs in rank order, left to right: ((x0 op x1) op x2) ... (a loop of
    numpy's -- or ml_dtypes' -- ufunc, ``kernels.numpy_kernel``; not ``ufunc.reduce``: from 8
    inputs numpy's add.reduce may sum pairwise)."""
    acc = np.array(xs[0], dtype=dtype)
    fold = kernels.numpy_kernel(op, acc.dtype)
    for x in xs[1:]:
        fold(kernels.as_storage(acc), kernels.as_storage(np.asarray(x, dtype)))
    return acc


def counts(p):
    chunk = shm.CHUNK_BYTES // 4            # float32 elements per chunk
    return sorted({0, 1, max(p - 1, 1), p, p + 1, 7, 1001, 65537, chunk + 2 * p + 1})


def test_shm_gives_the_rank_order_bits(comm):
    problems, results = [], []
    for n in counts(comm.size):
        for dtype in ORIGINAL:
            xs = inputs(comm.size, n, dtype, 1)
            mine = xs[comm.rank]
            keep = mine.copy()
            for op in FOUR:
                if op == "prod" and dtype.kind == "f":
                    xs_op = [np.where(np.isnan(x), x, np.sign(x)) for x in xs]   # +-1: finite
                else:
                    xs_op = xs
                want = rank_order(xs_op, op, dtype)
                out = mpicoll.allreduce(xs_op[comm.rank], op=op, algorithm="shm", comm=comm)
                inplace = xs_op[comm.rank].copy()
                mpicoll.allreduce(MPI.IN_PLACE, inplace, op=op, algorithm="shm", comm=comm)
                label = f"n={n} {dtype} {op}"
                if out.tobytes() != want.tobytes():
                    bad = np.flatnonzero(out.view(np.uint8) != want.view(np.uint8))
                    problems.append(f"{label}: out of place differs from rank order at byte "
                                    f"{bad[0]} ({bad.size} bytes)")
                if inplace.tobytes() != want.tobytes():
                    problems.append(f"{label}: in place differs from rank order")
                results.append(out)
            if mine.tobytes() != keep.tobytes():
                problems.append(f"n={n} {dtype}: sendbuf was modified")
            frozen = xs[comm.rank].copy()
            frozen.flags.writeable = False           # a read-only sendbuf is fine
            out = mpicoll.allreduce(frozen, algorithm="shm", comm=comm)
            if out.tobytes() != rank_order(xs, "sum", dtype).tobytes():
                problems.append(f"n={n} {dtype}: read-only sendbuf gave other bits")
    # ... and is read through a writable alias: numba compiled no read-only copy of the loops
    # (one per dtype, at the first call, on every rank at once: 2 minutes at 4 ranks here)
    readonly = [str(sig) for loop in (shm_kernels.window_copy, shm_kernels.single_copy)
                for sig in loop.signatures
                if any(isinstance(t, numba.types.Array) and not t.mutable for t in sig)]
    if readonly:
        problems.append(f"read-only overloads compiled: {readonly[:2]}")
    agree(comm, not problems, problems[:5])
    digest = b"".join(r.tobytes() for r in results)
    agree(comm, len(set(comm.allgather(hashlib.sha256(digest).hexdigest()))) == 1,
          "ranks ended with different bits")


def test_every_op_and_dtype_mpi_allows(comm):
    """Every (op, dtype) pair MPI allows -- float16, bfloat16, complex, bool, every integer
    width, the logical and bitwise ops -- through the window (N + 1 and 1001 elements) and,
    where the node allows it, in place (20001 elements: from 16 KiB for every item size), in
    and out of place: the rank-order bits on every rank, the same on all."""
    problems, digest = [], hashlib.sha256()
    for dtype in kernels.DTYPES:
        for n in (comm.size + 1, 1001, 20001):
            xs = inputs(comm.size, n, dtype, 3)
            for op in kernels.ops_for(dtype):
                xs_op = xs
                if op == "prod" and dtype.kind != "c" and kernels.allowed("max", dtype) \
                        and dtype.kind not in "iu":             # finite float products
                    xs_op = [np.where(np.isnan(x), x, np.sign(x)).astype(dtype) for x in xs]
                want = rank_order(xs_op, op, dtype)
                out = mpicoll.allreduce(xs_op[comm.rank], op=op, algorithm="shm", comm=comm)
                inplace = xs_op[comm.rank].copy()
                mpicoll.allreduce(MPI.IN_PLACE, inplace, op=op, algorithm="shm", comm=comm)
                for how, got in (("out of place", out), ("in place", inplace)):
                    if got.tobytes() != want.tobytes():
                        problems.append(f"{dtype} {op} n={n} {how}: not the rank-order bits")
                digest.update(out.tobytes())
    agree(comm, not problems, problems[:5])
    agree(comm, len(set(comm.allgather(digest.hexdigest()))) == 1,
          "ranks ended with different bits")


def test_window_is_reused_and_grows(comm):
    """Copying through the window (single copy off): repeated calls reuse one window (one
    sequence number per chunk); a larger size class replaces it; shrinking keeps the larger
    one. Every result is right."""
    st = state(comm)
    problems, windows = [], []
    for n in (10, 10, 3000, 10, 40_000, 10, 2_000_000, 1000, 2_000_000):
        x = np.full(n, comm.rank + 1.0)
        with environment(MPICOLL_SHM_SINGLE_COPY="off"):
            out = mpicoll.allreduce(x, algorithm="shm", comm=comm)
        if comm.size > 1:
            windows.append((id(st.shared), st.shared.capacity, st.shared.seq))
        if not np.array_equal(out, np.full(n, comm.size * (comm.size + 1) / 2)):
            problems.append(f"n={n}: wrong sum")
    if comm.size > 1:
        ids = [w[0] for w in windows]
        capacities = [w[1] for w in windows]
        if not (ids[0] == ids[1] and capacities[0] == capacities[1] == shm.MIN_BYTES):
            problems.append(f"the second call of a size did not reuse the window: {windows[:2]}")
        if capacities != sorted(capacities) or capacities[-1] != shm.CHUNK_BYTES:
            problems.append(f"capacities {capacities}")
        if ids[5] != ids[4]:
            problems.append("a smaller call replaced the window")
        chunks = -(-2_000_000 * 8 // shm.CHUNK_BYTES)
        if windows[-1][2] - windows[-2][2] != chunks:
            problems.append(f"sequence numbers {[w[2] for w in windows]}: expected +{chunks} "
                            "for the last call")
    agree(comm, not problems, problems)


def test_counters_say_no_network(comm):
    """0 bytes and messages sent; ``shared_bytes`` = what went into the window (all but my
    slice)."""
    traffic = state(comm).traffic
    before = dict(traffic)
    n = 1003
    mpicoll.allreduce(np.ones(n, np.float32), algorithm="shm", comm=comm)
    spent = {k: traffic[k] - before[k] for k in traffic}
    slices = block_displs(n, comm.size)
    want = (n - (slices[comm.rank + 1] - slices[comm.rank])) * 4 if comm.size > 1 else 0
    agree(comm, spent == {"bytes_sent": 0, "bytes_received": 0, "messages_sent": 0,
                          "internode_bytes": 0, "shared_bytes": want}, f"{spent}, want {want}")


def test_auto_runs_shm_on_one_node(comm):
    """auto: shm from select.SHM_MIN_BYTES on (no byte sent), not below; above
    select.SHM_MAX_BYTES only when the ranks outnumber the cores or shm reads in place
    (``select.shm_wins``); never across nodes."""
    if comm.size == 1:
        pytest.skip("one rank: nothing to choose")
    traffic = state(comm).traffic
    small, large = select.SHM_MIN_BYTES // 8 - 1, select.SHM_MIN_BYTES // 8
    larger = 2 * select.SHM_MAX_BYTES // 8
    shared = []
    for n in (small, large, larger):
        before = traffic["shared_bytes"]
        out = mpicoll.allreduce(np.ones(n), comm=comm)
        shared.append(traffic["shared_bytes"] > before)
        agree(comm, np.array_equal(out, np.full(n, float(comm.size))), f"n={n}: wrong sum")
    want = [False, True, comm.size > os.cpu_count()
            or shm.single_copy_expected(comm.size)]
    agree(comm, shared == want, f"shm ran at ({small}, {large}, {larger}) elements: {shared}, "
          f"expected {want} ({comm.size} ranks, {os.cpu_count()} cores)")


def test_auto_in_place_runs_shm_only_through_its_window(comm):
    """auto in place (``sendbuf=MPI.IN_PLACE``, in every form: blocking, cached, persistent,
    nonblocking): shm where it copies through its window, the ring or another schedule where
    it would read the other ranks' memory (the ring was faster there, ``select.shm_wins``); the
    right sum either way. A rank in place among ranks with arrays raises ArgumentMismatch on
    every rank, naming it (auto decides by it), from the first call."""
    if comm.size == 1:
        pytest.skip("one rank: nothing to choose")
    n = 2 * select.SHM_MIN_BYTES // 8
    want_shm = not shm.single_copy_expected(comm.size)
    traffic, problems = state(comm).traffic, []
    for form in ("blocking", "again (cached)", "persistent", "nonblocking"):
        buf = np.full(n, comm.rank + 1.0)
        before = traffic["shared_bytes"]
        if form == "persistent":
            mpicoll.allreduce_init(MPI.IN_PLACE, buf, comm=comm)()
        elif form == "nonblocking":
            mpicoll.iallreduce(MPI.IN_PLACE, buf, comm=comm).wait()
        else:
            mpicoll.allreduce(MPI.IN_PLACE, buf, comm=comm)
        if (traffic["shared_bytes"] > before) != want_shm:
            problems.append(f"{form}: shm ran: {not want_shm}, wanted: {want_shm}")
        if not np.array_equal(buf, np.full(n, comm.size * (comm.size + 1) / 2)):
            problems.append(f"{form}: wrong sum")
        before = traffic["shared_bytes"]
        out = mpicoll.allreduce(np.ones(n), comm=comm)      # out of place: shm
        if traffic["shared_bytes"] == before or not np.all(out == comm.size):
            problems.append(f"{form}: out of place did not run shm rightly")
    agree(comm, not problems, problems)

    def mixed():
        buf = np.ones(n)
        if comm.rank == 0:
            return mpicoll.allreduce(MPI.IN_PLACE, buf, comm=comm, timeout=30)
        return mpicoll.allreduce(buf, comm=comm, timeout=30)
    raises_everywhere(comm, ArgumentMismatch, mixed, match="in_place")


def test_persistent_shm(comm):
    send, recv = np.empty(5000), np.empty(5000)
    h = mpicoll.allreduce_init(send, recv, algorithm="shm", comm=comm)
    ok = True
    for k in range(4):
        send[:] = np.arange(5000) * (comm.rank + k)
        h()
        ok &= np.array_equal(recv, np.arange(5000) * sum(r + k for r in range(comm.size)))
    agree(comm, ok, "wrong persistent shm result")


def test_shm_refuses_what_it_cannot_do(comm):
    st = state(comm)
    if len(st.real_nodes) == 1:         # a request runs it whole in the progress engine
        out = mpicoll.iallreduce(np.ones(4), algorithm="shm", comm=comm).wait()
        agree(comm, np.array_equal(out, np.full(4, float(comm.size))), f"iallreduce shm: {out}")
    else:
        raises_everywhere(comm, ValueError, mpicoll.iallreduce, np.ones(4), algorithm="shm",
                          comm=comm, match="needs every rank on one node")
    if comm.size == 1:
        return
    real = st._nodes[None]
    st._nodes[None] = (tuple(range(0, comm.size, 2)), tuple(range(1, comm.size, 2)))  # 2 nodes
    try:
        raises_everywhere(comm, ValueError, mpicoll.allreduce, np.ones(4), algorithm="shm",
                          comm=comm, match="needs every rank on one node")
        out = mpicoll.allreduce(np.ones(1 << 16), comm=comm)        # auto: not shm
        agree(comm, np.array_equal(out, np.full(1 << 16, float(comm.size))), "auto's sum")
    finally:
        st._nodes[None] = real


@pytest.mark.parametrize("prepared", [False, True], ids=["full-path", "prepared"])
def test_absent_rank_is_named(comm, prepared):
    """The last rank does not come: the others raise CollectiveTimeout naming it, after about
    the timeout (the spin-waits honour the deadline); it then comes late, finds their roll call
    and raises too, so no rank later frees the window alone (collective). ``prepared``: the
    others' call is a prepared one (an earlier call had the same arguments), whose deadline's
    Watch is made only when the wait outlasts a spin."""
    if comm.size == 1:
        pytest.skip("needs two ranks")
    absent = comm.size - 1
    mpicoll.allreduce(np.ones(1000), algorithm="shm", comm=comm,     # the window exists
                      **({"timeout": 1.0} if prepared else {}))
    if prepared:
        agree(comm, any(e.plan.kind == "shared" and e.runner.op == "sum"
                  for e in state(comm).cached.values()),
              "the first call left no prepared shm call")
    world = MPI.COMM_WORLD
    error, elapsed = None, 0.0
    if comm.rank != absent:
        start = time.monotonic()
        try:
            mpicoll.allreduce(np.ones(1000), algorithm="shm", comm=comm, timeout=1.0)
        except CollectiveTimeout as exc:
            error = exc
        elapsed = time.monotonic() - start
    world.Barrier()
    if comm.rank == absent:             # late: the others' roll call is waiting for it
        try:
            mpicoll.allreduce(np.ones(1000), algorithm="shm", comm=comm, timeout=30.0)
        except CollectiveTimeout as exc:
            error = exc
    if comm.rank != absent:
        agree(comm, error is not None and error.peers == [absent]
              and f"[{absent}] did not answer" in str(error) and elapsed < 4.0,
              f"{error!r} after {elapsed:.2f} s")
    else:
        agree(comm, error is not None and error.gave_up, f"late rank: {error!r}")


@pytest.mark.parametrize("timeout", [math.inf, 30.0])
def test_mismatched_counts_raise_at_once(comm, timeout):
    """Rank 0 passes 10 elements, the others 20 (one window size class): every rank sees a hash
    beside another rank's input that is not its own, and raises ArgumentMismatch naming both
    counts before reducing anything -- with or without a deadline, without waiting for it."""
    if comm.size == 1:
        pytest.skip("needs two ranks")
    mpicoll.allreduce(np.ones(1000), algorithm="shm", comm=comm)     # the window exists
    count = 10 if comm.rank == 0 else 20
    start = time.monotonic()
    exc = raises_everywhere(comm, ArgumentMismatch, mpicoll.allreduce, np.ones(count),
                            algorithm="shm", comm=comm, timeout=timeout, match="count")
    agree(comm, "10" in str(exc) and "20" in str(exc), f"names both counts: {exc}")
    agree(comm, time.monotonic() - start < 10, "raised at once, not at a deadline")


def test_prepared_calls_run_shm(comm):
    """A call with the same arguments as an earlier one runs shm by its prepared decisions
    (``plan.Prepared``, kept by ``cache``): in and out of place, into a given recvbuf or a new one, the right sums,
    the input untouched, the counters counting every call."""
    if comm.size == 1:
        pytest.skip("one rank: shm has nothing to run")
    st = state(comm)
    n = 3001
    x = np.arange(n, dtype=np.float64) * (comm.rank + 1)
    want = np.arange(n, dtype=np.float64) * (comm.size * (comm.size + 1) // 2)
    problems = []
    for k in range(3):
        before = st.traffic["shared_bytes"]
        out = mpicoll.allreduce(x, algorithm="shm", comm=comm)
        recv = np.empty(n)
        mpicoll.allreduce(x, recv, algorithm="shm", comm=comm)
        inplace = x.copy()
        mpicoll.allreduce(MPI.IN_PLACE, inplace, algorithm="shm", comm=comm)
        for name, got in (("new recvbuf", out), ("recvbuf", recv), ("in place", inplace)):
            if not np.array_equal(got, want):
                problems.append(f"call {k} {name}: wrong sum")
        if st.traffic["shared_bytes"] - before <= 0:
            problems.append(f"call {k}: shared_bytes did not grow")
    if not np.array_equal(x, np.arange(n, dtype=np.float64) * (comm.rank + 1)):
        problems.append("sendbuf was modified")
    shm_entries = [e for e in st.cached.values()
                   if e.plan.kind == "shared" and e.runner.op == "sum"]
    if len(shm_entries) != 3:
        problems.append(f"{len(shm_entries)} prepared shm calls, expected 3 (new recvbuf, "
                        "recvbuf, in place)")
    agree(comm, not problems, problems)


def test_prepared_calls_that_mismatch_raise(comm):
    """Both counts ran before (prepared on every rank); then rank 0 passes 10 elements and the
    others 20: each rank takes its prepared call, sees another hash beside another rank's input
    and raises ArgumentMismatch naming both counts."""
    if comm.size == 1:
        pytest.skip("needs two ranks")
    for count in (10, 20):
        mpicoll.allreduce(np.ones(count), algorithm="shm", comm=comm)
    count = 10 if comm.rank == 0 else 20
    exc = raises_everywhere(comm, ArgumentMismatch, mpicoll.allreduce, np.ones(count),
                            algorithm="shm", comm=comm, match="count")
    agree(comm, "10" in str(exc) and "20" in str(exc), f"names both counts: {exc}")


def single_copy_window(comm):
    """``MPICOLL_SHM_SINGLE_COPY=on``'s window on ``comm`` (made by a first call), or a skip
    where the ranks may not read each other's memory (a seccomp profile or ptrace policy
    that refuses process_vm_readv: then ``shm`` copies through the window, tested above)."""
    mpicoll.allreduce(np.ones(8), algorithm="shm", comm=comm)
    window = state(comm).shared
    agree(comm, len(set(comm.allgather(window.single_copy))) == 1, "the ranks disagree")
    if not window.single_copy:
        pytest.skip("process_vm_readv between these ranks is not allowed here")
    return window


def test_single_copy_gives_the_rank_order_bits(comm):
    """Reading the other ranks' buffers in place (``_allreduce_single``), forced on at any
    rank count: every op and dtype, at the sizes where N = 2 reduces the whole vector and where
    each rank reduces its slice, out of place, in place, and mixed (rank 0 in place, the others
    not: every rank then takes slices); numpy's rank-order bits, the input untouched, one
    sequence number per call, and ``shared_bytes`` = what each rank read."""
    if comm.size == 1:
        pytest.skip("one rank: nothing to read")
    with environment(MPICOLL_SHM_SINGLE_COPY="on"):
        window = single_copy_window(comm)
        st, p, problems = state(comm), comm.size, []
        whole_max = shm.WHOLE_MAX_BYTES
        for dtype in ORIGINAL:
            for nbytes in (shm.SINGLE_COPY_MIN_BYTES, whole_max, whole_max + 8,
                           3 * shm.PIECE_BYTES + 24):
                n = nbytes // dtype.itemsize + (p - 1)
                xs = inputs(p, n, dtype, 2)
                for op in FOUR:
                    xs_op = [np.where(np.isnan(x), x, np.sign(x)) for x in xs] \
                        if op == "prod" and dtype.kind == "f" else xs
                    want = rank_order(xs_op, op, dtype).tobytes()
                    mine = xs_op[comm.rank].copy()
                    for place in ("out", "in", "mixed"):
                        inplace = place == "in" or (place == "mixed" and comm.rank == 0)
                        seq, shared = window.seq, st.traffic["shared_bytes"]
                        if inplace:
                            got = mine.copy()
                            mpicoll.allreduce(MPI.IN_PLACE, got, op=op, algorithm="shm",
                                              comm=comm)
                        else:
                            got = mpicoll.allreduce(mine, op=op, algorithm="shm", comm=comm)
                        label = f"{dtype} n={n} {op} {place}"
                        if got.tobytes() != want:
                            problems.append(f"{label}: not the rank-order bits")
                        if mine.tobytes() != xs_op[comm.rank].tobytes():
                            problems.append(f"{label}: the input changed")
                        if window.seq != seq + 1:
                            problems.append(f"{label}: {window.seq - seq} sequence numbers")
                        whole = p == 2 and place == "out" and n * dtype.itemsize <= whole_max
                        lo, hi = (0, n) if whole else \
                            block_displs(n, p)[comm.rank:comm.rank + 2]
                        read = ((p - 1) * (hi - lo) + n - (hi - lo)) * dtype.itemsize
                        if st.traffic["shared_bytes"] - shared != read:
                            problems.append(f"{label}: shared_bytes grew by "
                                            f"{st.traffic['shared_bytes'] - shared}, read {read}")
        agree(comm, not problems, problems[:5])


def test_single_copy_and_window_copy_take_turns(comm):
    """Calls below SINGLE_COPY_MIN_BYTES copy through the window, calls above read in place:
    taking turns, on one window and one sequence, every sum is right."""
    if comm.size == 1:
        pytest.skip("one rank: nothing to read")
    with environment(MPICOLL_SHM_SINGLE_COPY="on"):
        single_copy_window(comm)
        ok = True
        for k, n in enumerate((100, 5000, 3000, 40_000, 100, 1 << 20, 7)):
            out = mpicoll.allreduce(np.full(n, comm.rank + k, np.float32), algorithm="shm",
                                    comm=comm)
            ok &= np.array_equal(out, np.full(n, sum(r + k for r in range(comm.size)),
                                              np.float32))
        agree(comm, ok, "a wrong sum")


@pytest.mark.parametrize("counts", [(5000, 6000), (1000, 6000)], ids=["both-single", "one-each"])
def test_single_copy_mismatch_raises_at_once(comm, counts):
    """Rank 0 passes one count, the others another: both above SINGLE_COPY_MIN_BYTES, or one
    below it (rank 0 copies through the window, the others would read in place). Every rank
    sees another rank's hash beside its flag and raises ArgumentMismatch before reading
    anything."""
    if comm.size == 1:
        pytest.skip("needs two ranks")
    with environment(MPICOLL_SHM_SINGLE_COPY="on"):
        single_copy_window(comm)
        count = counts[0] if comm.rank == 0 else counts[1]
        start = time.monotonic()
        exc = raises_everywhere(comm, ArgumentMismatch, mpicoll.allreduce,
                                np.ones(count, np.float32), algorithm="shm", comm=comm,
                                timeout=30.0, match="count")
        agree(comm, all(str(c) in str(exc) for c in counts), f"names both counts: {exc}")
        agree(comm, time.monotonic() - start < 10, "raised at once, not at a deadline")


def test_single_copy_absent_rank_is_named(comm):
    """The last rank does not come to a single-copy call: the others raise CollectiveTimeout
    naming it after about the timeout; it comes late and raises too."""
    if comm.size == 1:
        pytest.skip("needs two ranks")
    with environment(MPICOLL_SHM_SINGLE_COPY="on"):
        single_copy_window(comm)
        absent, n = comm.size - 1, shm.SINGLE_COPY_MIN_BYTES
        error, elapsed = None, 0.0
        if comm.rank != absent:
            start = time.monotonic()
            try:
                mpicoll.allreduce(np.ones(n), algorithm="shm", comm=comm, timeout=1.0)
            except CollectiveTimeout as exc:
                error = exc
            elapsed = time.monotonic() - start
        MPI.COMM_WORLD.Barrier()
        if comm.rank == absent:
            try:
                mpicoll.allreduce(np.ones(n), algorithm="shm", comm=comm, timeout=30.0)
            except CollectiveTimeout as exc:
                error = exc
        if comm.rank != absent:
            agree(comm, error is not None and error.peers == [absent] and elapsed < 4.0,
                  f"{error!r} after {elapsed:.2f} s")
        else:
            agree(comm, error is not None and error.gave_up, f"late rank: {error!r}")


def test_window_leaves_no_file(comm):
    """Windows of three size classes made and dropped: no file of any rank's is left in
    /dev/shm (the first rank unlinks it once every rank has mapped it)."""
    if comm.size == 1:
        pytest.skip("one rank: no window")
    for n in (10, 5000, 300_000):
        with environment(MPICOLL_SHM_SINGLE_COPY="off"):
            mpicoll.allreduce(np.ones(n), algorithm="shm", comm=comm)
    comm.Barrier()
    prefixes = [f"mpicoll-{os.getuid()}-{pid}-" for pid in comm.allgather(os.getpid())]
    directory = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    left = [f for f in os.listdir(directory) if f.startswith(tuple(prefixes))]
    agree(comm, not left, f"left in {directory}: {left}")


@pytest.mark.parametrize("who", ["first", "last"])
def test_shm_against_mpi_ends_at_the_deadline(comm, who):
    """One rank calls ``shm`` on a fresh communicator, the others ``mpi`` (issue #22: the shm
    rank blocked forever in ``Split_type``). Making the window takes no collective now, only
    messages on the call's tag: every rank raises -- ``ArgumentMismatch`` naming the algorithms,
    or ``CollectiveTimeout`` -- within the deadline and a roll call."""
    if comm.size == 1:
        pytest.skip("needs two ranks")
    shm_rank = 0 if who == "first" else comm.size - 1
    fresh = comm.Dup()
    error, start = None, time.monotonic()
    try:
        mpicoll.allreduce(np.ones(1000), algorithm="shm" if comm.rank == shm_rank else "mpi",
                          comm=fresh, timeout=2.0)
    except (ArgumentMismatch, CollectiveTimeout) as exc:
        error = exc
    elapsed = time.monotonic() - start
    fresh.Free()
    agree(comm, error is not None and elapsed < 2.0 + 4.0, f"{error!r} after {elapsed:.1f} s")
    agree(comm, not isinstance(error, ArgumentMismatch) or "shm" in str(error),
          f"names the algorithms: {error}")


def test_free_after_a_failed_call_does_not_hang(comm):
    """Rank 0 passes count 0 (nothing to do: it returns), the others 10 elements: they time out
    and mark their communicator broken, rank 0's is not. ``Free`` then completes on every rank
    (issue #22: the rank whose communicator was not broken blocked in a collective
    ``MPI_Win_free``; a window's free is local now)."""
    if comm.size == 1:
        pytest.skip("needs two ranks")
    fresh = comm.Dup()
    mpicoll.allreduce(np.ones(1000), algorithm="shm", comm=fresh)      # the window exists
    error = None
    try:
        mpicoll.allreduce(np.ones(0 if comm.rank == 0 else 10), algorithm="shm", comm=fresh,
                          timeout=1.0)
    except CollectiveTimeout as exc:
        error = exc
    broken = known(fresh).broken is not None
    start = time.monotonic()
    fresh.Free()
    elapsed = time.monotonic() - start
    agree(comm, (error is None and not broken) if comm.rank == 0 else
          (error is not None and broken), f"rank {comm.rank}: {error!r}, broken {broken}")
    agree(comm, elapsed < 5.0, f"Free took {elapsed:.1f} s")
