"""reproducible=True under MPI (run at N = 1..5): one fixed data set with a wide dynamic range
and heavy cancellation, split over the ranks in several ways, summed locally
(``mpicoll.reproducible.sum``) and all-reduced with every algorithm, both executors, small
segments and virtual nodes: every result on every rank has the bits of the whole set's local
reproducible sum, which does not depend on N."""

import contextlib

import numpy as np
import pytest

import mpicoll
from mpicoll import reproducible as R
from mpicoll.testing import agree, environment

pytestmark = pytest.mark.mpi
TERMS = 24


def data(count, dtype, seed=0):
    """TERMS rows of ``count`` values from 1e-30 to 1e30, signed, half of them cancelling."""
    rng = np.random.default_rng([seed, count])
    x = 10.0 ** rng.uniform(-30, 30, (TERMS, count)) * rng.choice([-1.0, 1.0], (TERMS, count))
    x[TERMS // 2:] = -x[:TERMS // 2] * (1 + rng.uniform(-2.0 ** -30, 2.0 ** -30, (TERMS // 2,
                                                                                count)))
    if np.dtype(dtype) == np.float16:
        x = np.clip(x, -6e4, 6e4)
    return x[rng.permutation(TERMS)].astype(dtype)


def mine(x, rank, size, how):
    """This rank's rows: contiguous, round-robin, or all of them on the last rank."""
    if how == "contiguous":
        edges = np.linspace(0, len(x), size + 1).astype(int)
        return x[edges[rank]:edges[rank + 1]]
    if how == "round-robin":
        return x[rank::size]
    return x if rank == size - 1 else x[:0]


@contextlib.contextmanager
def setting(name, value):
    """``R.<name> = value`` inside the block: auto's paths (SPLIT, WINDOW)."""
    saved = getattr(R, name)
    setattr(R, name, value)
    try:
        yield
    finally:
        setattr(R, name, saved)


def split(mode):
    """auto's reduce-scatter + all-gather path on one node too (R.SPLIT)."""
    return setting("SPLIT", mode)


def bits(a):
    return np.asarray(a).view(np.uint8).tobytes()


@pytest.mark.parametrize("algorithm", mpicoll.ALGORITHMS + ("auto",))
def test_every_algorithm_same_bits(comm, algorithm):
    problems = []
    for dtype in (np.float64, np.float32, np.float16, R.bfloat16):
        for count in (1, 7, 3 * comm.size + 1):
            x = data(count, dtype)
            want = bits(R.sum(x))
            for how in ("contiguous", "round-robin", "last"):
                part = R.sum(mine(x, comm.rank, comm.size, how))
                got = mpicoll.allreduce(part, reproducible=True, algorithm=algorithm, comm=comm)
                if bits(got) != want:
                    problems.append(f"{np.dtype(dtype)} n={count} {how}")
    agree(comm, not problems, problems[:5])


@pytest.mark.max_ranks(5)
@pytest.mark.parametrize("executor", ["python", "compiled"])
@pytest.mark.parametrize("mode", ["always", "never"])
def test_executors_segments_and_large_counts(comm, executor, mode):
    """Both executors, 4 KiB segments, and counts past SPLIT_BYTES: auto's reduce-scatter +
    all-gather path (mode "always") and its all-reduce + rounding by blocks + all-gather path
    ("never"); plain arrays (one value per rank) and local sums."""
    problems = []
    with environment(MPICOLL_EXECUTOR=executor, MPICOLL_SEGMENT_BYTES="4096"), split(mode):
        for count in (R.SPLIT_BYTES // 16 + 5, 20_011):
            x = data(count, np.float64, seed=1)
            rows = x[:comm.size]                       # one row per rank: a plain array
            want_rows, want = bits(R.sum(rows)), bits(R.sum(x))
            for algorithm in ("auto", "ring", "recursive_halving", "mpi")[:4 if mode == "always"
                                                                          else 1]:
                got = mpicoll.allreduce(rows[comm.rank], reproducible=True,
                                        algorithm=algorithm, comm=comm)
                if bits(got) != want_rows:
                    problems.append(f"plain n={count} {algorithm}")
                part = R.sum(mine(x, comm.rank, comm.size, "round-robin"))
                got = mpicoll.allreduce(part, reproducible=True, algorithm=algorithm, comm=comm)
                if bits(got) != want:
                    problems.append(f"local sums n={count} {algorithm}")
    agree(comm, not problems, problems[:5])


@pytest.mark.max_ranks(5)
@pytest.mark.parametrize("mode", ["always", "never"])
def test_module_allreduce_by_blocks(comm, mode):
    """``mpicoll.reproducible.allreduce`` called itself with ``auto`` (the public calls run a
    ``Job``): past SPLIT_BYTES each rank rounds its block, after a reduce-scatter of the slices
    ("always") or an all-reduce of them ("never"), and the floats are all-gathered: the local
    sum's bits, every dtype, plain arrays and local sums, recvbuf given or not."""
    problems = []
    with split(mode):
        for dtype in (np.float64, np.float32, np.float16, R.bfloat16):
            for count in (R.SPLIT_BYTES // 16 + 5, 3 * comm.size * (R.SPLIT_BYTES // 16)):
                x = data(count, dtype, seed=5)
                rows = x[:comm.size]
                want = bits(R.sum(rows))
                out = np.empty(count, dtype)
                for what, got in (("array", R.allreduce(rows[comm.rank], comm=comm)),
                                  ("recvbuf", R.allreduce(rows[comm.rank], out, comm=comm)),
                                  ("local sum", R.allreduce(R.sum(rows[comm.rank:comm.rank + 1]),
                                                            comm=comm))):
                    if bits(got) != want:
                        problems.append(f"{np.dtype(dtype)} n={count} {what}")
    agree(comm, not problems, problems[:5])


@pytest.mark.parametrize("ranks_per_node", ["1", "2", "3"])
def test_virtual_nodes(comm, ranks_per_node):
    problems = []
    with environment(MPICOLL_RANKS_PER_NODE=ranks_per_node):
        x = data(33, np.float32, seed=2)
        want = bits(R.sum(x))
        part = R.sum(mine(x, comm.rank, comm.size, "contiguous"))
        for algorithm, options in (("hierarchical", dict(inner="binomial")),
                                   ("hierarchical", dict(inner="binomial", outer="ring")),
                                   ("double_binary_tree", {}), ("ring", dict(order="node")),
                                   ("auto", {})):
            got = mpicoll.allreduce(part, reproducible=True, algorithm=algorithm, comm=comm,
                                    **options)
            if bits(got) != want:
                problems.append(f"{algorithm} {options}")
    agree(comm, not problems, problems[:5])


@pytest.mark.parametrize("algorithm", ["auto", "ring", "recursive_halving", "mpi"])
def test_reduce_scatter_block(comm, algorithm):
    n = 5
    x = data(n * comm.size, np.float64, seed=3)
    want = bits(np.asarray(R.sum(x))[comm.rank * n:(comm.rank + 1) * n])
    part = R.sum(mine(x, comm.rank, comm.size, "round-robin"))
    got = mpicoll.reduce_scatter_block(part, reproducible=True, algorithm=algorithm, comm=comm)
    agree(comm, bits(got) == want, f"block {comm.rank}")


def test_specials_and_refusals_everywhere(comm):
    """inf on one rank, -inf on another: NaN everywhere; a bad op raises on every rank."""
    x = np.array([1.0, 2.0, -0.0], np.float64)
    if comm.rank == 0:
        x[:2] = np.inf
    if comm.rank == comm.size - 1:
        x[1] = -np.inf
    got = mpicoll.allreduce(x, reproducible=True, comm=comm)
    want_1 = np.nan if comm.size > 1 else -np.inf
    agree(comm, got[0] == np.inf and (np.isnan(got[1]) if comm.size > 1 else got[1] == -np.inf)
          and bits(got[2:]) == bits(np.array([-0.0])), f"{got} (want inf, {want_1}, -0.0)")
    from mpicoll.testing import raises_everywhere
    raises_everywhere(comm, ValueError, mpicoll.allreduce, x, op="max", reproducible=True,
                      comm=comm, match="op SUM")


# ----------------------------------------------------------------------------- every form

def forms(x, algorithm, comm):
    """``x`` all-reduced with reproducible=True by every form (name, result)."""
    from mpi4py import MPI
    out = [("iallreduce", mpicoll.iallreduce(x, reproducible=True, algorithm=algorithm,
                                             comm=comm).wait())]
    if not isinstance(x, R.BinnedSum):
        out.append(("iallreduce in place", mpicoll.iallreduce(
            MPI.IN_PLACE, x.copy(), reproducible=True, algorithm=algorithm, comm=comm).wait()))
    recv = np.empty(x.shape, x.dtype)
    h = mpicoll.allreduce_init(x, recv, reproducible=True, algorithm=algorithm, comm=comm)
    out.append(("allreduce_init h()", h().copy()))
    recv[...] = 0
    h.start()
    out.append(("allreduce_init start/wait", h.wait().copy()))
    h.free()
    if not isinstance(x, R.BinnedSum):
        grads = [x.copy(), x[:3].copy()]
        b = mpicoll.Buckets(grads, bucket_bytes=x.nbytes, average=False,
                            algorithm=algorithm, comm=comm, reproducible=True)
        for step in range(2):                   # (wait() leaves the sums in grads)
            grads[0][...], grads[1][...] = x, x[:3]
            for i in (1, 0):
                b.ready(i)
            b.wait()
            out.append((f"Buckets step {step}", grads[0].copy()))
    return out


@pytest.mark.max_ranks(5)
@pytest.mark.parametrize("algorithm", ["auto", "ring", "recursive_halving", "hierarchical",
                                       "double_binary_tree"])
def test_every_form_same_bits(comm, algorithm):
    """Nonblocking, persistent (run twice, both ways) and Buckets give the local reproducible
    sum's bits, which the blocking call gives: any N, any algorithm, plain arrays and local
    sums; the plan says reproducible=K."""
    problems = []
    for dtype in (np.float64, np.float32, R.bfloat16):
        # auto splits; 3 * 2^13 divides into whole blocks (the floats gathered into recvbuf)
        large = (R.SPLIT_BYTES // 16 + 5, 3 << 13) if algorithm == "auto" else ()
        for count in (7, 3 * comm.size + 1, 4099) + large:
            x = data(count, dtype, seed=4)
            rows = x[:comm.size]                        # one row per rank: a plain array
            cases = [("plain", rows[comm.rank], bits(R.sum(rows))),
                     ("local sums", R.sum(mine(x, comm.rank, comm.size, "round-robin")),
                      bits(R.sum(x)))]
            for what, mine_x, want in cases:
                for form, got in forms(mine_x, algorithm, comm):
                    if bits(got) != want:
                        problems.append(f"{np.dtype(dtype)} n={count} {what} {form}")
    described = mpicoll.plan.last(comm).describe()
    agree(comm, not problems and "reproducible=" in described, (problems[:5], described))


@pytest.mark.max_ranks(5)
def test_one_node_window_gives_the_exchange_bits(comm):
    """auto, large arrays on one node: the values meet in shm's window (its shared bytes grow,
    the plan says so) and give the bits of the exchange of values (R.WINDOW off) and of the
    local sum, in every form, in place, with inf, -inf, NaN and -0.0 among them, at counts of
    one chunk and of two (a rank's segment holds CHUNK_BYTES), not multiples of N. float16
    takes the exchange (no fused rows for it)."""
    from mpi4py import MPI
    from mpicoll._runtime.context import state
    from mpicoll.shm import window as shm_window
    if comm.size == 1:
        pytest.skip("one rank: nothing to exchange")
    problems = []
    st = state(comm)
    two_chunks = shm_window.CHUNK_BYTES // 8 + 3 * comm.size + 1
    for dtype, count in ((np.float64, R.SPLIT_BYTES // 16 + 5), (np.float32, 3 << 13),
                         (np.float64, two_chunks), (np.float16, R.SPLIT_BYTES // 4 + 1)):
        x = data(count, dtype, seed=9)[:comm.size]
        x[:, 1::101], x[:, 2::101], x[:, 3::103] = np.inf, -0.0, np.nan
        x[-1, 5::101] = -np.inf
        want = bits(R.sum(x))
        got = {}
        for on in (True, False):
            before = st.traffic["shared_bytes"]
            with setting("WINDOW", on):
                y = mpicoll.allreduce(x[comm.rank], reproducible=True, comm=comm)
                used = st.traffic["shared_bytes"] > before
                described = mpicoll.plan.last(comm).describe()
                z = x[comm.rank].copy()
                mpicoll.allreduce(MPI.IN_PLACE, z, reproducible=True, comm=comm)
                got[f"window={on} blocking"] = y
                got[f"window={on} in place"] = z
                for form, r in forms(x[comm.rank], "auto", comm):
                    got[f"window={on} {form}"] = r
            expect = on and np.dtype(dtype) != np.float16
            if used != expect or ("window" in described) != expect:
                problems.append(f"{np.dtype(dtype)} n={count} window={on}: shared bytes "
                                f"{'grew' if used else 'did not grow'}, plan {described!r}")
        problems += [f"{np.dtype(dtype)} n={count} {k}" for k, v in got.items()
                     if bits(v) != want]
    agree(comm, not problems, problems[:6])


def test_one_node_window_needs_room(comm, monkeypatch):
    """Where the windows' file system is small (a container's /dev/shm: ``shm.window.room``),
    auto keeps the exchange of values (no shared bytes, not the window's plan), the same bits."""
    from mpicoll._runtime.context import state
    from mpicoll.shm import window as shm_window
    if comm.size == 1:
        pytest.skip("one rank: nothing to exchange")
    x = data(R.SPLIT_BYTES // 16 + 5, np.float64, seed=11)[:comm.size]
    st = state(comm)
    for room, path in ((64 << 10, "exchange"), (64 << 30, "window")):
        monkeypatch.setattr(shm_window, "room", lambda room=room: room)
        before = st.traffic["shared_bytes"]
        got = mpicoll.allreduce(x[comm.rank], reproducible=True, comm=comm)
        described = mpicoll.plan.last(comm).describe()
        agree(comm, bits(got) == bits(R.sum(x)) and (path == "window") ==
              (st.traffic["shared_bytes"] > before) and (path == "window") ==
              ("window" in described), (room, described))


def test_one_node_window_mismatch_raises_everywhere(comm):
    """On the window path, one rank with reproducible=True and the others without (their
    auto: shm) raise ArgumentMismatch on every rank, naming reproducible, before the deadline:
    first when the window is still to be made, then on the window made."""
    from mpicoll.errors import ArgumentMismatch
    from mpicoll.testing import raises_everywhere
    if comm.size == 1:
        pytest.skip("no other rank to disagree with")
    x = data(R.SPLIT_BYTES // 16 + 5, np.float64, seed=10)[comm.rank]
    for fresh in (True, False):
        sub = comm.Dup()
        try:
            if not fresh:           # the window made, by both kinds of call
                mpicoll.allreduce(x, comm=sub)
                mpicoll.allreduce(x, reproducible=True, comm=sub)
            raises_everywhere(comm, ArgumentMismatch, mpicoll.allreduce, x,
                              reproducible=comm.rank == 0, comm=sub, timeout=60,
                              match="reproducible")
        finally:
            sub.Free()


@pytest.mark.max_ranks(5)
@pytest.mark.parametrize("algorithm", ["auto", "ring", "recursive_halving"])
def test_reduce_scatter_block_every_form(comm, algorithm):
    """Every form, plain arrays (small; and large, auto's exchange of values), float32 and
    bfloat16 (the fused kernel and the separate ones): the bits of the local sum's block."""
    from mpi4py import MPI
    bad = []
    large = (R.SPLIT_BYTES // 8 // comm.size + 3,) if algorithm == "auto" else ()
    for dtype, n in [(d, n) for d in (np.float32, R.bfloat16) for n in (6,) + large]:
        x = data(n * comm.size, dtype, seed=5)
        rows = x[:comm.size]
        want = bits(np.asarray(R.sum(rows))[comm.rank * n:(comm.rank + 1) * n])
        got = {"blocking": mpicoll.reduce_scatter_block(rows[comm.rank], reproducible=True,
                                                        algorithm=algorithm, comm=comm),
               "ireduce_scatter_block": mpicoll.ireduce_scatter_block(
                   rows[comm.rank], reproducible=True, algorithm=algorithm, comm=comm).wait()}
        h = mpicoll.reduce_scatter_block_init(rows[comm.rank], np.empty(n, dtype),
                                              reproducible=True, algorithm=algorithm,
                                              comm=comm)
        got["reduce_scatter_block_init"] = h().copy()
        h.start()
        got["reduce_scatter_block_init start"] = h.wait().copy()
        h.free()
        buf = rows[comm.rank].copy()
        got["in place"] = mpicoll.ireduce_scatter_block(MPI.IN_PLACE, buf, reproducible=True,
                                                        algorithm=algorithm,
                                                        comm=comm).wait()[:n]
        bad += [f"{np.dtype(dtype)} n={n} {form}" for form, y in got.items()
                if bits(y) != want]
    agree(comm, not bad, bad)


def test_mismatch_raises_everywhere(comm):
    """One rank with reproducible=True (or another K) and the others without: ArgumentMismatch
    on every rank, naming the field (validate=True; without it the tags differ and the
    deadline's roll call names it)."""
    from mpicoll.errors import ArgumentMismatch
    from mpicoll.testing import raises_everywhere
    if comm.size == 1:
        pytest.skip("no other rank to disagree with")
    x = data(9, np.float64, seed=6)[0]

    def blocking(value):
        return mpicoll.allreduce(x, reproducible=value, comm=comm, validate=True)

    def nonblocking(value):
        return mpicoll.iallreduce(x, reproducible=value, comm=comm, validate=True).wait()

    def persistent(value):
        return mpicoll.allreduce_init(x, np.empty_like(x), reproducible=value, comm=comm,
                                      validate=True)

    for fn in (blocking, nonblocking, persistent):
        for other in (False, 4):
            raises_everywhere(comm, ArgumentMismatch, fn, True if comm.rank == 0 else other,
                              match="reproducible")


def test_arrays_and_local_sums_mixed_under_auto_raise_everywhere(comm):
    """Large, under auto: plain arrays run the exchange of values (on one node: the window),
    a BinnedSum the slices' reduce-scatter; one rank with each raises ArgumentMismatch on every
    rank, at once (no deadline), naming both."""
    from mpicoll.errors import ArgumentMismatch
    from mpicoll.testing import raises_everywhere
    if comm.size == 1:
        pytest.skip("no other rank to disagree with")
    x = data(R.SPLIT_BYTES // 16 + 5, np.float64, seed=8)[comm.rank]
    mine_x = R.sum(x[None]) if comm.rank == 0 else x
    raises_everywhere(comm, ArgumentMismatch, mpicoll.allreduce, mine_x, reproducible=True,
                      comm=comm, match="exchange|window")


@pytest.mark.max_ranks(5)
@pytest.mark.parametrize("algorithm", ["auto", "ring", "recursive_doubling"])
def test_comm_attribute_every_form(comm, algorithm):
    """``mpicoll.Comm(..., reproducible=True)`` (and the attribute set later): Allreduce,
    Iallreduce, Allreduce_init and Reduce_scatter_block, with mpi4py's buffer specs, give the
    local reproducible sum's bits; MAX and integer sums run as usual; a float PROD raises
    ValueError on every rank (before any communication); a bad value is a TypeError."""
    from mpi4py import MPI
    mc = mpicoll.Comm(comm, algorithm)
    assert mc.reproducible is False
    mc.reproducible = True
    n, size, rank = 4099, comm.size, comm.rank
    rows = data(n, np.float64, seed=6)[:size]
    want = bits(R.sum(rows))
    got = {}
    out = np.empty(n)
    mc.Allreduce([rows[rank], MPI.DOUBLE], [out, MPI.DOUBLE], op=MPI.SUM)
    got["Allreduce"] = out.copy()
    out = np.empty(n)
    mc.Allreduce(rows[rank], out)                       # plain arrays: not the fast path
    got["Allreduce plain"] = out.copy()
    out = np.empty(n)
    MPI.Request.Waitall([mc.Iallreduce(rows[rank], out)])
    got["Iallreduce"] = out.copy()
    out = np.empty(n)
    p = mc.Allreduce_init(rows[rank], out)
    p.Start()
    p.Wait()
    p.Free()
    got["Allreduce_init"] = out.copy()
    bad = [form for form, y in got.items() if bits(y) != want]
    m = 5
    x = data(m * size, np.float32, seed=7)[:size]
    part = np.empty(m, np.float32)
    mc.Reduce_scatter_block(x[rank], part)
    if bits(part) != bits(np.asarray(R.sum(x))[rank * m:(rank + 1) * m]):
        bad.append("Reduce_scatter_block")
    top = np.empty(n)
    mc.Allreduce(rows[rank], top, op=MPI.MAX)
    if not np.array_equal(top, rows.max(axis=0)):
        bad.append("MAX")
    counts = np.empty(3, np.int64)
    mc.Allreduce(np.full(3, rank, np.int64), counts)
    if not np.array_equal(counts, np.full(3, size * (size - 1) // 2)):
        bad.append("int64 SUM")
    try:
        mc.Allreduce(rows[rank], np.empty(n), op=MPI.PROD)
        bad.append("float PROD did not raise")
    except ValueError as exc:
        if "PROD" not in str(exc):
            bad.append(f"PROD: {exc}")
    try:
        mc.reproducible = "yes"
        bad.append("reproducible='yes' accepted")
    except TypeError:
        pass
    agree(comm, not bad and mc.reproducible is True and "reproducible=True" in repr(mc), bad)
