"""Every dtype and op through every algorithm of the in-process executor.

test_simulated_collectives.py runs the first four dtypes and ops exhaustively; here every
algorithm runs every dtype with each op MPI allows on it, at a few sizes and counts (test_kernels
checks each kernel against numpy on edge values): integers and bools exactly against numpy's
reduction (wrap-around included), floats and complex on inputs whose result is exact in any
order, and random floats salted with NaN, inf and -0.0 for identical bits on every rank.
"""

import numpy as np
import pytest

from mpicoll import kernels
from mpicoll.simulators import inprocess
from mpicoll.compression import CODECS
from mpicoll.registry import ALLGATHER, ALLREDUCE, BCAST, REDUCE_SCATTER_BLOCK
from mpicoll.testing import exact_input, exact_result

ALLREDUCE_ALGORITHMS = [a for a, algo in ALLREDUCE.items() if algo.scheduled]
IDS = [str(d) for d in kernels.DTYPES]


def random_input(rank, n, dtype, seed=0):
    """Full-range integers, random bools, or floats salted with NaN, +-inf and +-0."""
    rng = np.random.default_rng([seed, rank, n])
    if dtype.kind == "b":
        return rng.integers(0, 2, n).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        x = rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
        x[rng.integers(0, 4, n) == 0] = 0
        return x
    x = (rng.standard_normal(n) + 1j * rng.standard_normal(n) if dtype.kind == "c"
         else rng.standard_normal(n)).astype(dtype)
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0]).astype(dtype)
    pick = rng.integers(0, 8, n)
    x[pick < len(special)] = special[pick[pick < len(special)]]
    return x


def reduction(xs, op, dtype):
    """numpy's ufunc applied rank after rank (order-free for integers and bools)."""
    acc = xs[0].copy()
    with np.errstate(all="ignore"):
        for x in xs[1:]:
            kernels.numpy_kernel(op, dtype)(kernels.as_storage(acc), kernels.as_storage(x))
    return acc


def allreduce(xs, op, algorithm):
    extra = {"ranks_per_node": 2} if ALLREDUCE[algorithm].has("node-layout") else {}
    return inprocess.allreduce(xs, op, algorithm, **extra)


@pytest.mark.parametrize("dtype", kernels.DTYPES, ids=IDS)
@pytest.mark.parametrize("algorithm", ALLREDUCE_ALGORITHMS)
def test_allreduce_every_op(algorithm, dtype):
    for op in kernels.ops_for(dtype):
        for p in (2, 3, 5):
            for n in (1, p + 1, 37):
                label = f"{algorithm} {dtype} {op} P={p} n={n}"
                if dtype.kind in "iub":
                    xs = [random_input(r, n, dtype) for r in range(p)]
                    want = reduction(xs, op, dtype)
                else:
                    xs = [exact_input(r, n, dtype, op) for r in range(p)]
                    want = exact_result(p, n, dtype, op)
                for rank, got in enumerate(allreduce(xs, op, algorithm)):
                    assert got.dtype == dtype, label
                    if dtype.kind == "c":       # the sign of a zero imaginary part depends on
                        assert np.array_equal(got, want), f"{label}: rank {rank} wrong"  # order
                    else:
                        assert got.tobytes() == want.tobytes(), f"{label}: rank {rank} wrong"
                if dtype.kind in "fcV":         # awkward floats: the same bits on every rank
                    xs = [random_input(r, n, dtype) for r in range(p)]
                    out = allreduce(xs, op, algorithm)
                    assert all(o.tobytes() == out[0].tobytes() for o in out), \
                        f"{label}: ranks differ"


@pytest.mark.parametrize("p", [2, 3, 4, 5])
def test_naive_is_the_rank_order_left_fold_on_every_rank(p):
    """naive: every rank ends with the bits of numpy's ufunc applied rank after rank, for every
    dtype and op (float16 and bfloat16, NaN payloads, +-0 and infinities included); with the
    inputs rounded to bf16 or fp16 first, as compression does, too. (Its ranks once folded
    their own vector innermost: at N = 3, 4 hundreds of float sums and products differed.)"""
    for dtype in kernels.DTYPES:
        for op in kernels.ops_for(dtype):
            for n in (0, 1, p + 1, 257):
                xs = [random_input(r, n, dtype, seed=p) for r in range(p)]
                want = reduction(xs, op, dtype)
                for rank, got in enumerate(inprocess.allreduce(xs, op, "naive")):
                    assert got.tobytes() == want.tobytes(), \
                        f"{dtype} {op} P={p} n={n}: rank {rank} differs from the left fold"
    for compress in ("bf16", "fp16"):           # as compressed calls see them: R(x) everywhere
        codec = CODECS[compress]
        xs = [np.random.default_rng([p, r]).standard_normal(1001).astype(np.float32)
              for r in range(p)]
        for x in xs:
            codec.round(x)
        want = reduction(xs, "sum", np.dtype(np.float32))
        for rank, got in enumerate(inprocess.allreduce(xs, "sum", "naive")):
            assert got.tobytes() == want.tobytes(), f"{compress} P={p}: rank {rank} differs"


@pytest.mark.parametrize("dtype", kernels.DTYPES[4:], ids=IDS[4:])
@pytest.mark.parametrize("algorithm", [a for a in REDUCE_SCATTER_BLOCK if a != "mpi"])
def test_reduce_scatter_block_every_op(algorithm, dtype):
    for op in kernels.ops_for(dtype):
        for p, n in ((3, 5), (4, 1)):
            xs = [exact_input(r, p * n, dtype, op) for r in range(p)]
            want = exact_result(p, p * n, dtype, op)
            for r, got in enumerate(inprocess.reduce_scatter_block(xs, op, algorithm)):
                assert got.tobytes() == want[r * n:(r + 1) * n].tobytes(), \
                    (algorithm, str(dtype), op, p, n, r)


@pytest.mark.parametrize("dtype", kernels.DTYPES[4:], ids=IDS[4:])
def test_allgather_and_bcast_move_the_bits(dtype):
    """No reduction: any dtype's bits arrive unchanged (NaN payloads included)."""
    p, n = 5, 11
    xs = [random_input(r, n, dtype) for r in range(p)]
    for algorithm in (a for a in ALLGATHER if a != "mpi"):
        for got in inprocess.allgather(xs, algorithm):
            assert got.tobytes() == np.concatenate(xs).tobytes(), (algorithm, str(dtype))
    for algorithm in (a for a in BCAST if a != "mpi"):
        for got in inprocess.bcast([x.copy() for x in xs], 2, algorithm):
            assert got.tobytes() == xs[2].tobytes(), (algorithm, str(dtype))


def test_disallowed_pair_raises_before_running():
    with pytest.raises(TypeError, match="ops for complex64: sum, prod"):
        inprocess.allreduce([np.ones(3, np.complex64)] * 2, "max", "ring")


def test_validate_fingerprints_every_dtype_and_op():
    """validate=True's fingerprint names each dtype and op apart (by index into kernels')."""
    from mpicoll._runtime import validate
    rows = {(str(d), op): validate.fingerprint("allreduce", "ring", op, d, 5)
            for d in kernels.DTYPES for op in kernels.OPS}
    assert len({tuple(r) for r in rows.values()}) == len(rows)
    for (dtype, op), row in rows.items():
        assert validate._show("dtype", row) == dtype and validate._show("op", row) == op


def test_auto_never_runs_mpi_for_a_type_the_library_lacks(monkeypatch):
    """Even where auto's table says ``mpi``, bfloat16 reductions go to mpicoll's own algorithm
    (MPICH's classic rule); float32 still gets ``mpi`` (the control)."""
    from mpi4py import MPI

    import mpicoll
    from mpicoll import plan, select
    monkeypatch.setattr(select, "choose", lambda *args, **kwargs: "mpi")
    chosen = []
    for dtype in (kernels.bfloat16, np.dtype(np.float32)):
        x = np.arange(6).astype(dtype)
        assert mpicoll.allreduce(x, comm=MPI.COMM_SELF).tobytes() == x.tobytes()
        chosen.append(plan.last(MPI.COMM_SELF).algorithm.name)
        assert mpicoll.reduce_scatter_block(x, comm=MPI.COMM_SELF).tobytes() == x.tobytes()
        chosen.append(plan.last(MPI.COMM_SELF).algorithm.name)
    assert chosen == ["recursive_doubling", "recursive_halving", "mpi", "mpi"]
