"""Every algorithm, in-process, at P = 1..17 virtual ranks against numpy's reduction.

Counts cover the edge cases of block partitioning (0, 1, P-1, P, P+1) and primes, for every
op x dtype; one count over 100 003 and the hierarchical layouts, for sum and max. Integers
(wrap-around included) and MAX/MIN must be exact; float sums and products must lie within the
bound of any summation order: |err| <= (P-1).eps.sum|x_i| for SUM and (P-1).eps.|prod| (to
first order) for PROD.
"""

import numpy as np
import pytest

from mpicoll.simulators import inprocess
from mpicoll import kernels
from mpicoll.registry import ALLGATHER, ALLREDUCE, BCAST, REDUCE_SCATTER_BLOCK

SIZES = range(1, 18)
# the first four dtypes and ops, exhaustively; tests/unit/test_dtypes.py samples the others
DTYPES, OPS = kernels.DTYPES[:4], kernels.OPS[:4]
# algorithms with inner/outer phases get their own test, over node layouts and phase choices
TWO_LEVEL = [a for a, algo in ALLREDUCE.items() if "inner" in {o.name for o in algo.options}]
FLAT = [a for a, algo in ALLREDUCE.items() if algo.scheduled and a not in TWO_LEVEL]
DTYPE_IDS = [str(d) for d in DTYPES]
LARGE = 100_003


def counts(p):
    return sorted({0, 1, max(p - 1, 0), p, p + 1, 7, 13, 101})


def inputs(p, n, dtype, op, seed=0):
    rng = np.random.default_rng([seed, p, n])
    if np.dtype(dtype).kind == "f":
        if op == "prod":
            return [(1 + rng.uniform(-0.5, 0.5, n) / p).astype(dtype) for _ in range(p)]
        xs = [rng.uniform(-1, 1, n).astype(dtype) for _ in range(p)]
        if n:
            xs[0][0] = np.inf if op in ("max", "sum") else -np.inf   # infinities travel too
        if n > 1:   # signed zeros and NaN payloads, where op(a, b) and op(b, a) differ in bits
            itype = np.int32 if dtype == np.float32 else np.int64
            for r, x in enumerate(xs):
                x[1] = (np.array([np.nan], dtype).view(itype) + r).view(dtype)[0]
                if n > 2:
                    x[2] = -0.0 if r % 2 else 0.0
        return xs
    info = np.iinfo(dtype)
    if op == "prod":                       # wraps around: exact modulo 2^bits in any order
        return [rng.integers(-7, 8, n).astype(dtype) for _ in range(p)]
    return [rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True) for _ in range(p)]


def expected(xs, op):
    ufunc = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[op]
    with np.errstate(over="ignore", invalid="ignore"):
        return ufunc.reduce(np.stack(xs), axis=0, dtype=xs[0].dtype)


def check(out, xs, op, label):
    """Rank 0's result against the reference (exact, or within the bound), then every other
    rank's bits against rank 0's (so the reference is computed once, not once per rank)."""
    ref, got = expected(xs, op), out[0]
    p = len(xs)
    assert got.dtype == ref.dtype, label
    if ref.dtype.kind == "i" or op in ("max", "min"):
        same = (got == ref) | (np.isnan(got) & np.isnan(ref)) if ref.dtype.kind == "f" \
            else got == ref
        bad = np.flatnonzero(~same)
        assert bad.size == 0, f"{label}: rank 0 index {bad[:5]} expected {ref[bad[:5]]} got {got[bad[:5]]}"
    else:
        eps = np.finfo(ref.dtype).eps
        exact = np.stack(xs).astype(np.longdouble)
        if op == "sum":
            truth = exact.sum(axis=0)
            with np.errstate(invalid="ignore"):
                bound = (p - 1) * eps * np.abs(exact).sum(axis=0)
        else:
            truth = exact.prod(axis=0)
            bound = 2 * p * eps * np.abs(truth)
        finite = np.isfinite(truth)
        bound = np.where(finite, bound, 0)
        err = np.abs(got[finite].astype(np.longdouble) - truth[finite])
        assert (err <= bound[finite]).all(), f"{label}: rank 0 error {err.max()} > bound"
        assert np.array_equal(np.isfinite(got), finite), label
    # every rank ends with the same bits
    for rank, other in enumerate(out):
        assert other.dtype == ref.dtype, label
        assert other.tobytes() == got.tobytes(), f"{label}: rank {rank} differs from rank 0"


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("algorithm", FLAT)
@pytest.mark.parametrize("p", SIZES)
def test_allreduce(algorithm, p, dtype, op):
    for n in counts(p):
        xs = inputs(p, n, dtype, op)
        keep = [x.copy() for x in xs]
        out = inprocess.allreduce(xs, op, algorithm)
        check(out, xs, op, f"{algorithm} P={p} n={n} {dtype} {op}")
        assert all(a.tobytes() == b.tobytes() for a, b in zip(xs, keep)), "inputs modified"


# one count over 100 003 (blocks of thousands, uneven): sum and max, as the hierarchical test;
# P = 1, 2, 3 (odd), 5, 8 (a power of two), 17 (test_allreduce: every P up to 17 on short counts)
@pytest.mark.parametrize("op", ["sum", "max"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("algorithm", FLAT)
@pytest.mark.parametrize("p", [1, 2, 3, 5, 8, 17])
def test_allreduce_large(algorithm, p, dtype, op):
    xs = inputs(p, LARGE, dtype, op)
    check(inprocess.allreduce(xs, op, algorithm), xs, op, f"{algorithm} P={p} {dtype} {op}")


def hierarchical_variants(p):
    for k in sorted({1, 2, 3, 4, p}):
        if k > p:
            continue
        yield k, "binomial", "recursive_doubling"
        if p % k == 0:
            for inner in ("ring", "recursive_halving"):
                for outer in ("ring", "recursive_halving", "recursive_doubling", "binomial"):
                    yield k, inner, outer


# The phases' composition does not depend on the op: sum (rounding bound, integer wrap-around)
# and max (exact, NaN and signed-zero order); test_allreduce runs every op through each phase.
@pytest.mark.parametrize("op", ["sum", "max"])
@pytest.mark.parametrize("algorithm", TWO_LEVEL)
@pytest.mark.parametrize("p", SIZES)
def test_allreduce_hierarchical(p, algorithm, op):
    for k, inner, outer in hierarchical_variants(p):
        for n in counts(p):
            for dtype in (np.float64, np.int32):
                xs = inputs(p, n, dtype, op)
                out = inprocess.allreduce(xs, op, algorithm, ranks_per_node=k, inner=inner,
                                         outer=outer)
                check(out, xs, op, f"{algorithm} k={k} {inner}/{outer} P={p} n={n} {dtype}")


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("algorithm", [a for a in REDUCE_SCATTER_BLOCK if a != "mpi"])
@pytest.mark.parametrize("p", SIZES)
def test_reduce_scatter_block(algorithm, p, dtype, op):
    for n in (0, 1, 2, 5, 64):
        xs = inputs(p, p * n, dtype, op)
        out = inprocess.reduce_scatter_block(xs, op, algorithm)
        for r, got in enumerate(out):
            block = [x[r * n:(r + 1) * n] for x in xs]
            check([got], block, op, f"{algorithm} P={p} n={n} {dtype} {op} rank {r}")


@pytest.mark.parametrize("algorithm", [a for a in ALLGATHER if a != "mpi"])
@pytest.mark.parametrize("p", SIZES)
def test_allgather(algorithm, p):
    for n in (0, 1, 2, 5, 64, 1001):
        xs = [np.arange(n, dtype=np.int64) + 1000 * r for r in range(p)]
        for got in inprocess.allgather(xs, algorithm):
            assert np.array_equal(got, np.concatenate(xs)), (algorithm, p, n)


@pytest.mark.parametrize("algorithm", [a for a in BCAST if a != "mpi"])
@pytest.mark.parametrize("p", SIZES)
def test_bcast(algorithm, p):
    for n in counts(p) + [1000]:
        for root in range(p):
            xs = [np.full(n, -1.0) for _ in range(p)]
            xs[root] = np.arange(n, dtype=np.float64)
            for got in inprocess.bcast(xs, root, algorithm):
                assert np.array_equal(got, xs[root]), (algorithm, p, n, root)
