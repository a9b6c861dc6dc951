"""Every algorithm under MPI against the MPI library's own collective, in the same job."""

import numpy as np
import pytest
from mpi4py import MPI

import mpicoll
from mpicoll import compression, kernels
from mpicoll.simulators import inprocess
from mpicoll._runtime.context import state
from mpicoll.algorithms import allreduce_shm
from mpicoll.executors import compiled
from mpicoll.simulators import inprocess
from mpicoll.registry import ALLGATHER, BCAST, REDUCE_SCATTER_BLOCK, lookup
from mpicoll.testing import (agree, environment, every_case, exact_input, exact_result,
                             raises_everywhere)

# the first four dtypes and ops; tests/mpi/test_dtypes.py covers the others
DTYPES, OPS = kernels.DTYPES[:4], kernels.OPS[:4]

pytestmark = pytest.mark.mpi
MPI_OP = {"sum": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN}


def counts(p):
    # 5 and 8 ranks (oversubscribed in CI): the empty, an uneven and a 1000 count (65537 is most of
    # the time there); every count at P = 1..17 in-process (with 100,003:
    # tests/unit/test_simulated_collectives.py), and all of these here at N = 1..4
    if p > 5:
        return [0, p + 1, 1000]
    return sorted({0, 1, max(p - 1, 1), p, p + 1, 7, 1000, 65537})


def same_bits_everywhere(comm, *arrays) -> bool:
    digest = b"".join(a.tobytes() for a in arrays)
    return len({hash(d) for d in comm.allgather(digest)}) == 1


@pytest.mark.parametrize("algorithm", mpicoll.ALGORITHMS)
def test_allreduce_matches_mpi(comm, algorithm):
    """Exact inputs: every algorithm, op, dtype, in and out of place gives MPI's bits."""
    problems, results = [], []
    for n in counts(comm.size):
        for dtype in DTYPES:
            for op in OPS:
                x = exact_input(comm.rank, n, dtype, op)
                keep = x.copy()
                ref = np.empty_like(x)
                comm.Allreduce(x, ref, op=MPI_OP[op])
                out = mpicoll.allreduce(x, op=MPI_OP[op], algorithm=algorithm, comm=comm)
                inplace = x.copy()
                mpicoll.allreduce(MPI.IN_PLACE, inplace, op=op, algorithm=algorithm, comm=comm)
                label = f"n={n} {dtype} {op}"
                if out.tobytes() != ref.tobytes():
                    problems.append(f"{label}: out-of-place differs from MPI_Allreduce")
                if inplace.tobytes() != ref.tobytes():
                    problems.append(f"{label}: in-place differs from MPI_Allreduce")
                if x.tobytes() != keep.tobytes():
                    problems.append(f"{label}: sendbuf was modified")
                if ref.tobytes() != exact_result(comm.size, n, dtype, op).tobytes():
                    problems.append(f"{label}: MPI's own result is not the exact answer")
                results.append(out)
    agree(comm, not problems, problems[:5])
    agree(comm, same_bits_everywhere(comm, *results), "ranks ended with different bits")


@pytest.mark.parametrize("algorithm", [a for a in mpicoll.ALGORITHMS
                                       if lookup("allreduce", a).scheduled])  # shm: test_shm.py
def test_allreduce_random_floats_match_simulator(comm, algorithm):
    """Random floats: the MPI executor gives the in-process executor's bits, and MPI's within
    the rounding of a different order."""
    problems = []
    algo = lookup("allreduce", algorithm)
    nodes = state(comm).nodes() if algo.has("node-layout") else None
    # hierarchical's default inner on the MPI path may be "shm" (no schedule to simulate; its
    # bits: test_hierarchical_shm_node_phases): the scheduled default, named
    given = {o.name: o.value(None, nodes) for o in algo.options if o.name == "inner"}
    for n in (1, comm.size + 1, 4099):
        for dtype in (np.float32, np.float64):
            inputs = [np.random.default_rng([r, n]).standard_normal(n).astype(dtype)
                      for r in range(comm.size)]
            out = mpicoll.allreduce(inputs[comm.rank], algorithm=algorithm, comm=comm, **given)
            options = {"nodes": nodes} if nodes else {}
            sim = inprocess.allreduce(inputs, "sum", algorithm, **options, **given)[comm.rank]
            ref = np.empty_like(out)
            comm.Allreduce(inputs[comm.rank], ref)
            if out.tobytes() != sim.tobytes():
                problems.append(f"n={n} {dtype}: differs from the in-process executor")
            tol = comm.size * np.finfo(dtype).eps * np.abs(np.stack(inputs)).sum(axis=0)
            if not (np.abs(out - ref) <= tol).all():
                problems.append(f"n={n} {dtype}: further from MPI_Allreduce than rounding allows")
            agree(comm, same_bits_everywhere(comm, out), f"n={n} {dtype}: ranks differ")
    agree(comm, not problems, problems[:5])


def left_fold(xs, op):
    """numpy's ufunc applied rank after rank: ``op(...op(op(x0, x1), x2)..., x(p-1))``."""
    acc = xs[0].copy()
    for x in xs[1:]:
        {"sum": np.add, "prod": np.multiply}[op](acc, x, out=acc)
    return acc


@pytest.mark.parametrize("executor,segment", [("python", None), ("compiled", None),
                                              ("compiled", "1000")])
@pytest.mark.parametrize("form", ["blocking", "nonblocking", "persistent"])
def test_naive_gives_every_rank_the_left_folds_bits(comm, form, executor, segment):
    """naive's float sums and products: the same bits on every rank (a hash compared), the
    rank-order left fold's; under bf16/fp16 compression the rounded fold of the rounded inputs.
    (It once folded the rank's own vector innermost: 650-1,231 indices differed at N = 3, 4.)
    ``segment``: MPICOLL_SEGMENT_BYTES, so the compiled executor runs it in lockstep rounds."""
    if executor == "compiled" and compiled.available() is not None:
        pytest.skip(f"compiled executor unavailable: {compiled.available()}")
    problems, results = [], []
    with environment(MPICOLL_EXECUTOR=executor, MPICOLL_SEGMENT_BYTES=segment):
        for n in (1, comm.size + 1, 4099):
            for dtype, op, compress in ((np.float32, "sum", None), (np.float64, "sum", None),
                                        (np.float32, "prod", None), (np.float64, "prod", None),
                                        (np.float32, "sum", "bf16"), (np.float32, "sum", "fp16")):
                if compress and form == "persistent":
                    continue                # (allreduce_init takes no compress)
                rng = [np.random.default_rng([r, n]) for r in range(comm.size)]
                xs = [(1 + g.uniform(-0.5, 0.5, n) / comm.size if op == "prod"
                       else g.standard_normal(n)).astype(dtype) for g in rng]
                extra = {"compress": compress} if compress else {}
                if form == "blocking":
                    out = mpicoll.allreduce(xs[comm.rank], op=op, algorithm="naive", comm=comm,
                                            **extra)
                elif form == "nonblocking":
                    out = mpicoll.iallreduce(xs[comm.rank], op=op, algorithm="naive",
                                             comm=comm, **extra).wait()
                else:
                    out = np.empty_like(xs[comm.rank])
                    h = mpicoll.allreduce_init(xs[comm.rank], out, op=op, algorithm="naive",
                                               comm=comm)
                    results.append(h().copy())      # run now, then started and waited for
                    h.start()
                    h.wait()
                    h.free()
                if compress and comm.size > 1:     # (one rank sends nothing: no rounding)
                    codec = compression.CODECS[compress]
                    for x in xs:
                        codec.round(x)
                    want = left_fold(xs, op)
                    codec.round(want)
                else:
                    want = left_fold(xs, op)
                if out.tobytes() != want.tobytes():
                    bad = np.flatnonzero(out.view(np.uint8) != want.view(np.uint8))
                    problems.append(f"n={n} {np.dtype(dtype)} {op} compress={compress}: "
                                    f"{bad.size} bytes differ from the left fold")
                results.append(out)
    agree(comm, same_bits_everywhere(comm, *results), "ranks ended with different bits")
    agree(comm, not problems, problems[:5])


@pytest.mark.parametrize("ranks_per_node", [None, "1", "2", "3"])
@pytest.mark.parametrize("inner", [None, "ring", "recursive_halving", "binomial"])
def test_hierarchical_nodes(comm, ranks_per_node, inner):
    """hierarchical with the MPI library's nodes and with virtual nodes of k ranks."""
    with environment(MPICOLL_RANKS_PER_NODE=ranks_per_node):
        hierarchical_nodes(comm, ranks_per_node, inner)


def hierarchical_nodes(comm, ranks_per_node, inner):
    nodes = state(comm).nodes()
    k = int(ranks_per_node) if ranks_per_node else None
    if k:
        agree(comm, nodes == inprocess.virtual_nodes(comm.size, k), f"nodes {nodes}")
    equal = len({len(nd) for nd in nodes}) == 1
    x = exact_input(comm.rank, 1001, np.int64, "sum")
    if inner in ("ring", "recursive_halving") and not equal:
        raises_everywhere(comm, ValueError, mpicoll.allreduce, x, algorithm="hierarchical",
                          inner=inner, comm=comm, match="same number of ranks")
        return
    for outer in ("ring", "recursive_halving", "recursive_doubling", "binomial"):
        out = mpicoll.allreduce(x, algorithm="hierarchical", inner=inner, outer=outer,
                                comm=comm)
        agree(comm, np.array_equal(out, exact_result(comm.size, 1001, np.int64, "sum")),
              f"nodes={nodes} inner={inner} outer={outer}")


@pytest.mark.parametrize("ranks_per_node", [None, "1", "2", "3"])
@pytest.mark.parametrize("order", ["rank", "node", "rail"])
def test_ring_order(comm, ranks_per_node, order):
    """ring in each order, on the MPI library's nodes and on virtual nodes of k ranks: exact
    results, the in-process executor's bits, and the bytes that cross nodes counted as the
    schedules say (order="rank" and "rail" differ on 2 nodes of 2 or more)."""
    with environment(MPICOLL_RANKS_PER_NODE=ranks_per_node):
        nodes = state(comm).nodes()
        traffic = state(comm).traffic
        problems = []
        for n in (1, comm.size + 1, 1001):
            x = exact_input(comm.rank, n, np.int64, "sum")
            before = traffic["internode_bytes"]
            out = mpicoll.allreduce(x, algorithm="ring", order=order, comm=comm)
            crossed = traffic["internode_bytes"] - before
            if not np.array_equal(out, exact_result(comm.size, n, np.int64, "sum")):
                problems.append(f"n={n}: wrong result")
            scheds = inprocess.schedules("allreduce", "ring", comm.size, n, nodes=nodes,
                                         order=order)
            where = {r: j for j, members in enumerate(nodes) for r in members}
            expect = 8 * sum(hi - lo for _, sends in scheds[comm.rank].plan
                             for peer, lo, hi in sends if where[peer] != where[comm.rank])
            if crossed != expect:
                problems.append(f"n={n}: internode_bytes grew by {crossed}, expected {expect}")
            floats = [np.random.default_rng([r, n]).standard_normal(n) for r in range(comm.size)]
            out = mpicoll.allreduce(floats[comm.rank], algorithm="ring", order=order, comm=comm)
            sim = inprocess.allreduce(floats, "sum", "ring", nodes=nodes, order=order)
            if out.tobytes() != sim[comm.rank].tobytes():
                problems.append(f"n={n}: differs from the in-process executor")
            agree(comm, same_bits_everywhere(comm, out), f"n={n}: ranks differ")
            for collective, run in (("reduce_scatter_block", mpicoll.reduce_scatter_block),
                                    ("allgather", mpicoll.allgather)):
                with environment(MPICOLL_RING_ORDER=order):
                    y = exact_input(comm.rank, n * comm.size, np.int64, "sum")
                    got = run(y, algorithm="ring", comm=comm) if collective == "allgather" \
                        else run(y, op="sum", algorithm="ring", comm=comm)
                ref = mpicoll.allgather(y, algorithm="mpi", comm=comm) \
                    if collective == "allgather" else \
                    mpicoll.reduce_scatter_block(y, op="sum", algorithm="mpi", comm=comm)
                if not np.array_equal(got, ref):
                    problems.append(f"n={n}: {collective} wrong")
        agree(comm, not problems, f"nodes={nodes}: {problems[:5]}")


@pytest.mark.parametrize("ranks_per_node", [None, "1", "2", "3"])
def test_double_binary_tree_nodes(comm, ranks_per_node):
    """double_binary_tree on virtual nodes of k ranks (trees across them, chains inside):
    exact results for every op and dtype, and the in-process executor's bits."""
    with environment(MPICOLL_RANKS_PER_NODE=ranks_per_node):
        nodes = state(comm).nodes()
        problems = []
        # 5 and 8 ranks (oversubscribed in CI): two counts, not 65537 (most of the time there);
        # every count, op and dtype at P = 1..17 in-process
        # (tests/unit/test_simulated_collectives.py), and all four here at N = 1..4
        for n in ((1, comm.size + 1, 1001, 65537) if every_case(comm.size)
                  else (comm.size + 1, 1001)):
            for dtype in DTYPES:
                for op in OPS:
                    x = exact_input(comm.rank, n, dtype, op)
                    out = mpicoll.allreduce(x, op=op, algorithm="double_binary_tree", comm=comm)
                    if out.tobytes() != exact_result(comm.size, n, dtype, op).tobytes():
                        problems.append(f"n={n} {dtype} {op}: wrong result")
            floats = [np.random.default_rng([r, n]).standard_normal(n) for r in range(comm.size)]
            out = mpicoll.allreduce(floats[comm.rank], algorithm="double_binary_tree", comm=comm)
            sim = inprocess.allreduce(floats, "sum", "double_binary_tree", nodes=nodes)
            if out.tobytes() != sim[comm.rank].tobytes():
                problems.append(f"n={n}: differs from the in-process executor")
            agree(comm, same_bits_everywhere(comm, out), f"n={n}: ranks differ")
        agree(comm, not problems, f"nodes={nodes}: {problems[:5]}")


@pytest.mark.parametrize("algorithm", list(REDUCE_SCATTER_BLOCK))
def test_reduce_scatter_block_matches_mpi(comm, algorithm):
    problems = []
    for n in (0, 1, 3, 1000):
        for dtype in DTYPES:
            for op in OPS:
                x = exact_input(comm.rank, n * comm.size, dtype, op)
                keep = x.copy()
                ref = np.empty(n, dtype)
                comm.Reduce_scatter_block(x, ref, op=MPI_OP[op])
                out = mpicoll.reduce_scatter_block(x, op=op, algorithm=algorithm, comm=comm)
                inplace = x.copy()
                mpicoll.reduce_scatter_block(MPI.IN_PLACE, inplace, op=op, algorithm=algorithm,
                                             comm=comm)
                if out.tobytes() != ref.tobytes() or inplace[:n].tobytes() != ref.tobytes():
                    problems.append(f"n={n} {dtype} {op}")
                if x.tobytes() != keep.tobytes():
                    problems.append(f"n={n} {dtype} {op}: sendbuf modified")
    agree(comm, not problems, problems[:5])


@pytest.mark.parametrize("algorithm", list(ALLGATHER))
def test_allgather_matches_mpi(comm, algorithm):
    problems = []
    for n in (0, 1, 3, 1000):
        for dtype in DTYPES:
            x = exact_input(comm.rank, n, dtype, "sum")
            ref = np.empty((comm.size, n), dtype)
            comm.Allgather(x, ref)
            out = mpicoll.allgather(x, algorithm=algorithm, comm=comm)
            inplace = np.zeros((comm.size, n), dtype)
            inplace[comm.rank] = x
            mpicoll.allgather(MPI.IN_PLACE, inplace, algorithm=algorithm, comm=comm)
            if out.shape != ref.shape or out.tobytes() != ref.tobytes() \
                    or inplace.tobytes() != ref.tobytes():
                problems.append(f"n={n} {dtype}")
    agree(comm, not problems, problems[:5])


@pytest.mark.parametrize("algorithm", list(BCAST))
def test_bcast_matches_mpi(comm, algorithm):
    problems = []
    # 5 and 8 ranks (oversubscribed in CI): the first, a middle and the last root; every root at
    # P = 1..17 in-process (tests/unit/test_simulated_collectives.py), and here at N = 1..4
    roots = (range(comm.size) if every_case(comm.size)
             else sorted({0, comm.size // 2, comm.size - 1}))
    for root in roots:
        for n in (0, 1, comm.size + 1, 10007):
            for dtype in DTYPES:
                ref = exact_input(root, n, dtype, "sum") if comm.rank == root \
                    else np.zeros(n, dtype)
                comm.Bcast(ref, root=root)
                buf = exact_input(root, n, dtype, "sum") if comm.rank == root \
                    else np.zeros(n, dtype)
                mpicoll.bcast(buf, root, algorithm=algorithm, comm=comm)
                if buf.tobytes() != ref.tobytes():
                    problems.append(f"root={root} n={n} {dtype}")
    agree(comm, not problems, problems[:5])


def test_multidimensional_arrays(comm):
    x = exact_input(comm.rank, 60, np.float64, "sum").reshape(3, 4, 5)
    out = mpicoll.allreduce(x, algorithm="ring", comm=comm)
    agree(comm, out.shape == (3, 4, 5) and np.array_equal(
        out.reshape(-1), exact_result(comm.size, 60, np.float64, "sum")), "3-D all-reduce")
    g = mpicoll.allgather(x, comm=comm)
    agree(comm, g.shape == (comm.size, 3, 4, 5), f"allgather shape {g.shape}")


def test_user_communicator_is_untouched(comm):
    """mpicoll's messages travel on its own duplicate: a pending user message is not taken."""
    peer = (comm.rank + 1) % comm.size
    token = np.array([comm.rank], np.int64)
    req = comm.Isend(token, peer, tag=1)
    for algorithm in ("ring", "recursive_doubling"):
        mpicoll.allreduce(np.ones(10), algorithm=algorithm, comm=comm)
    got = np.empty(1, np.int64)
    comm.Recv(got, (comm.rank - 1) % comm.size, tag=1)
    req.Wait()
    agree(comm, got[0] == (comm.rank - 1) % comm.size, f"got {got[0]}")


@pytest.mark.parametrize("single_copy", ["off", "on"])
@pytest.mark.parametrize("ranks_per_node", [None, "1", "2"])
def test_hierarchical_shm_node_phases(comm, ranks_per_node, single_copy):
    """hierarchical(inner="shm"): the node phases in a shared-memory window around the outer
    all-reduce of each shard. Random floats give, on every rank, each node's rank-order fold
    (per shard) all-reduced across the nodes by the outer schedule -- the simulator's bits for
    the node sums as inputs; again by the prepared call; in place, chunked (past 4 MiB), exact
    integers too; copying through the window, or reading the node's buffers in place from
    16 KiB (``single_copy``: whole-vector shards, the outer recursive doubling's bits are the
    same per element). By default (inner not chosen) a large enough call runs it (no message
    inside a node)."""
    with environment(MPICOLL_RANKS_PER_NODE=ranks_per_node, MPICOLL_SHM_SINGLE_COPY=single_copy):
        st = state(comm)
        nodes = st.nodes()
        usable = (len({len(n) for n in nodes}) == 1 and all(
            any(set(n) <= set(r) for r in st.real_nodes) for n in nodes))
        if not usable:
            raises_everywhere(comm, ValueError, mpicoll.allreduce, np.ones(8),
                              algorithm="hierarchical", inner="shm", comm=comm,
                              match="same number of ranks|inside one real node")
            return
        problems = []
        # the chunked count (past 4 MiB) at N = 1..4 only: at 5 and 8 ranks (oversubscribed in CI)
        # every rank drawing every rank's 4 MiB is most of the test's time
        chunked = ((4 << 20) // 8 + 3,) if every_case(comm.size) else ()
        for n in (1, comm.size + 1, 4099) + chunked:
            inputs = [np.random.default_rng([r, n]).standard_normal(n) for r in range(comm.size)]
            out = mpicoll.allreduce(inputs[comm.rank], algorithm="hierarchical", inner="shm",
                                    comm=comm)
            again = mpicoll.allreduce(inputs[comm.rank], algorithm="hierarchical", inner="shm",
                                      comm=comm)        # a prepared call (cache)
            if again.tobytes() != out.tobytes():
                problems.append(f"n={n}: the prepared call gave other bits")
            inplace = inputs[comm.rank].copy()
            mpicoll.allreduce(MPI.IN_PLACE, inplace, algorithm="hierarchical", inner="shm",
                              comm=comm)
            node_sums = []
            for members in nodes:
                acc = inputs[members[0]].copy()
                for r in members[1:]:
                    np.add(acc, inputs[r], out=acc)
                node_sums.append(acc)
            L, chunk = len(nodes[0]), allreduce_shm.CHUNK_BYTES // 8
            want = np.empty(n)
            for at in range(0, n, chunk):       # each chunk's shards across the nodes
                size = min(chunk, n - at)
                for i in range(L):
                    lo, hi = allreduce_shm._slice(size, L, i)
                    if hi > lo:
                        parts = [s[at + lo:at + hi] for s in node_sums]
                        want[at + lo:at + hi] = inprocess.allreduce(
                            parts, "sum", "recursive_doubling")[0] if len(nodes) > 1 \
                            else parts[0]
            if out.tobytes() != want.tobytes():
                problems.append(f"n={n}: not the node folds all-reduced across nodes")
            if inplace.tobytes() != out.tobytes():
                problems.append(f"n={n}: in place differs")
            x = exact_input(comm.rank, n, np.int64, "sum")
            ref = np.empty_like(x)
            comm.Allreduce(x, ref)
            got = mpicoll.allreduce(x, algorithm="hierarchical", inner="shm", comm=comm)
            if not np.array_equal(got, ref):
                problems.append(f"n={n} int64: differs from MPI_Allreduce")
        agree(comm, not problems, problems[:5])
        agree(comm, same_bits_everywhere(comm, out), "ranks differ")
        if comm.size > 1 and len(nodes[0]) > 1:
            before = dict(st.traffic)
            mpicoll.allreduce(np.ones(1 << 14), algorithm="hierarchical", comm=comm)
            sent = st.traffic["bytes_sent"] - before["bytes_sent"]
            shared = st.traffic["shared_bytes"] - before["shared_bytes"]
            node = next(j for j, m in enumerate(nodes) if comm.rank in m)
            lo, hi = allreduce_shm._slice(1 << 14, len(nodes[0]), nodes[node].index(comm.rank))
            outer = lookup("allreduce", "recursive_doubling").module.bytes_sent(
                node, len(nodes), (hi - lo) * 8) if len(nodes) > 1 else 0
            agree(comm, shared > 0 and sent == outer,
                  f"default inner: shared {shared} B, sent {sent} B (the outer phase: {outer})")


def test_node_layout_is_the_mpi_librarys(comm):
    """The set-up finds the nodes by the ranks' node names (it makes no communicator: issue
    40); they are the groups MPI's own ``COMM_TYPE_SHARED`` split makes, Slurm's emulated nodes
    of one host included (tests/slurm runs this suite across two)."""
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        mine = tuple(local.allgather(comm.Get_rank()))
    finally:
        local.Free()
    expected = tuple(sorted(set(comm.allgather(mine))))
    assert state(comm).real_nodes == expected
