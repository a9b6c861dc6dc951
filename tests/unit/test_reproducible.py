"""Reproducible sums (mpicoll.reproducible), in one process: the collective's phases run on P
virtual ranks by the in-process executor (P up to 64, every scheduled algorithm, virtual nodes),
and every result must have the bits of the local reproducible sum of the whole data set;
accuracy against math.fsum; IEEE's specials; the public entry points at one rank."""

import math

import ml_dtypes
import numpy as np
import pytest

import mpicoll
from mpicoll import reproducible as R
from mpicoll.simulators import inprocess
from mpicoll.registry import ALLREDUCE

SCHEDULED = [a for a, algo in ALLREDUCE.items() if algo.scheduled]
FLOATS = [np.dtype(np.float64), np.dtype(np.float32), np.dtype(np.float16), R.bfloat16]


def wide(terms, count, dtype=np.float64, seed=0, positive=False):
    """``terms`` rows of ``count`` values from 1e-30 to 1e30 (the half types: their own range),
    signed unless ``positive``, with heavy cancellation: a third of the rows are the negations
    of others, a third those negations times (1 + 2^-20)."""
    rng = np.random.default_rng([seed, terms, count])
    dtype = np.dtype(dtype)
    lo, hi = (-30, 30) if dtype.itemsize >= 4 and dtype != np.float16 else (-6, 4)
    if dtype == R.bfloat16:
        lo, hi = -30, 30
    x = 10.0 ** rng.uniform(lo, hi, (terms, count))
    if not positive:
        x *= rng.choice([-1.0, 1.0], (terms, count))
        third = terms // 3
        x[terms - third:] = -x[:third]
        x[terms - 2 * third:terms - third] = -x[third:2 * third] * (1 + 2.0 ** -20)
        x = x[rng.permutation(terms)]
    return x.astype(dtype)


def split(x, parts, how, seed=0):
    """The rows of ``x`` over ``parts`` ranks: contiguous, round-robin, or random and uneven
    (some ranks may get none)."""
    t = x.shape[0]
    if how == "contiguous":
        edges = np.linspace(0, t, parts + 1).astype(int)
        return [x[a:b] for a, b in zip(edges, edges[1:])]
    if how == "round-robin":
        return [x[r::parts] for r in range(parts)]
    rng = np.random.default_rng([seed, parts])
    owner = rng.integers(0, parts, t)
    return [x[rng.permutation(np.flatnonzero(owner == r))] for r in range(parts)]


def bits(a):
    a = np.asarray(a)
    return a.view(np.uint8).tobytes()


def simulated(parts, algorithm="ring", path="allreduce", **options):
    """The reproducible all-reduce of ``parts`` (one BinnedSum or array per virtual rank), its
    phases run by the in-process executor; returns every rank's result."""
    p, first = len(parts), parts[0]
    dtype = first.dtype
    k = first.k if isinstance(first, R.BinnedSum) else R.DEFAULT_K[dtype]
    tops = inprocess.allreduce([R._local_codes(s, np.int8) for s in parts], op="max",
                               algorithm=algorithm, **options)
    assert all(np.array_equal(t, tops[0]) for t in tops)
    top, n = tops[0], tops[0].size
    if path == "allreduce":
        bufs = [np.append(R._local_slices(s, top, k), R._terms(s)) for s in parts]
        sums = inprocess.allreduce(bufs, op="sum", algorithm=algorithm, **options)
        return [R.rounded(t[:-1], top, k, dtype) for t in sums]
    block = -(-n // p)                          # reduce-scatter, round, all-gather
    stride = block * k + 1
    bufs = []
    for s in parts:
        buf = np.zeros(p * stride, np.int64)
        buf[stride - 1::stride] = R._terms(s)
        bufs.append(R._local_slices(s, top, k, out=buf, block=block, stride=stride))
    mine = inprocess.reduce_scatter_block(bufs, op="sum", algorithm=path)
    floats = [R.rounded(m, top[min(r * block, n):min((r + 1) * block, n)], k, dtype,
                        block=block) for r, m in enumerate(mine)]
    gathered = np.concatenate([np.concatenate([f, np.zeros(block - f.size, dtype)])
                               for f in floats])[:n]
    return [gathered] * p


# ----------------------------------------------------------------------------- the same bits

@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_any_split_any_algorithm_same_bits(dtype):
    """N = 1..8 ranks, three ways of splitting, every scheduled algorithm: all the bits of the
    whole set's local reproducible sum."""
    x = wide(40, 23, dtype, seed=1)
    want = bits(R.sum(x))
    for p in range(1, 9):
        for how in ("contiguous", "round-robin", "random"):
            parts = [R.sum(part) for part in split(x, p, how)]
            for algorithm in SCHEDULED:
                for got in simulated(parts, algorithm):
                    assert bits(got) == want, (dtype, p, how, algorithm)


@pytest.mark.parametrize("p", [2, 5, 8, 16, 64])
def test_virtual_nodes_and_reduce_scatter_path_same_bits(p):
    """hierarchical and double_binary_tree over virtual nodes of 1..4 ranks, ring in node
    order, and the reduce-scatter + all-gather path (ring and recursive halving), at P up to 64."""
    x = wide(2 * p + 3, 17, np.float64, seed=2)
    want = bits(R.sum(x))
    parts = [R.sum(part) for part in split(x, p, "random", seed=p)]
    for per_node in (1, 2, 3, 4):
        runs = [("hierarchical", dict(ranks_per_node=per_node, inner="ring")),
                ("hierarchical", dict(ranks_per_node=per_node, inner="binomial",
                                      outer="ring")),
                ("double_binary_tree", dict(ranks_per_node=per_node)),
                ("ring", dict(ranks_per_node=per_node, order="node"))]
        if per_node == 1:
            runs += [(a, {}) for a in ("recursive_halving", "recursive_doubling", "binomial")]
        for algorithm, options in runs:
            if algorithm == "hierarchical" and per_node > 1 and p % per_node \
                    and options["inner"] == "ring":
                continue                            # equal nodes only
            for got in simulated(parts, algorithm, **options):
                assert bits(got) == want, (p, per_node, algorithm, options)
    for path in ("ring", "recursive_halving"):
        for got in simulated(parts, path=path):
            assert bits(got) == want, (p, path)


def test_one_value_per_rank_at_64_ranks():
    """Plain arrays (one term per rank, no local sum) at P = 64: the bits of the local sum."""
    x = wide(64, 31, np.float32, seed=3)
    want = bits(R.sum(x))
    for algorithm in ("ring", "recursive_doubling", "binomial", "naive"):
        for got in simulated(list(x), algorithm):
            assert bits(got) == want, algorithm


def test_grouping_and_order_of_local_sums():
    """Local merges in any grouping (a + b, micro-batches) give the one-shot sum's bits."""
    x = wide(30, 9, np.float64, seed=4)
    want = bits(R.sum(x))
    rng = np.random.default_rng(4)
    for _ in range(5):
        order = rng.permutation(30)
        acc = R.sum(x[order[:1]])
        for lo in range(1, 30, 4):
            acc = R.sum(x[order[lo:lo + 4]]) + acc
        assert bits(acc) == want
        assert acc.terms == 30


# ----------------------------------------------------------------------------- accuracy

def fsum(x):
    return np.array([math.fsum(x[:, i].astype(np.float64)) for i in range(x.shape[1])])


def ulp(v, dtype):
    v = np.abs(np.asarray(v, np.float64))
    info = np.finfo(dtype)
    e = np.floor(np.log2(np.maximum(v, float(info.smallest_normal))))
    return np.exp2(e - (info.nmant))


@pytest.mark.parametrize("dtype", [np.float64, np.float32, R.bfloat16], ids=str)
def test_all_positive_within_one_ulp(dtype):
    x = wide(200, 64, dtype, seed=5, positive=True)
    exact = fsum(x)
    got = np.asarray(R.sum(x)).astype(np.float64)
    assert np.all(np.abs(got - exact) <= ulp(exact, dtype))


@pytest.mark.parametrize("dtype", [np.float64, np.float32, R.bfloat16], ids=str)
def test_cancellation_within_eps_times_sum_of_magnitudes(dtype):
    x = wide(201, 64, dtype, seed=6)
    exact = fsum(x)
    got = np.asarray(R.sum(x)).astype(np.float64)
    eps = float(np.finfo(dtype).eps)
    bound = eps * np.abs(x.astype(np.float64)).sum(axis=0)
    assert np.all(np.abs(got - exact) <= bound)
    assert np.any(np.abs(exact) < 1e-3 * np.abs(x.astype(np.float64)).max(axis=0))  # cancelled


def test_float16_is_correctly_rounded():
    """float16's whole range fits in two bins: the sum is exact, then rounded once, so it is
    the correctly rounded exact sum (fsum of float16 values is exact in float64)."""
    x = wide(300, 50, np.float16, seed=7)
    want = fsum(x).astype(np.float16)
    assert bits(R.sum(x)) == bits(want)


def test_more_slices_never_less_accurate():
    x = wide(100, 40, np.float32, seed=8)
    exact = fsum(x)
    errs = [np.abs(np.asarray(R.sum(x, k=k)).astype(np.float64) - exact).max()
            for k in (2, 3, 4)]
    assert errs[1] <= errs[0] and errs[2] <= errs[1]
    assert np.array_equal(np.asarray(R.sum(x, k=4)), exact.astype(np.float32))


# ----------------------------------------------------------------------------- IEEE cases

@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_one_value_is_itself(dtype):
    """Every finite value, subnormals and the extremes included, and the specials' kinds."""
    info = np.finfo(dtype)
    v = np.array([0.0, -0.0, float(info.max), -float(info.max), float(info.smallest_normal),
                  float(info.smallest_subnormal), -float(info.smallest_subnormal), 1.0, -3.5,
                  np.inf, -np.inf], dtype)
    assert bits(R.sum(v[None])) == bits(v)
    assert np.isnan(np.asarray(R.sum(np.array([[np.nan]], dtype)))).all()


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_specials_zeros_and_overflow(dtype):
    info = np.finfo(dtype)
    big, tiny = float(info.max), float(info.smallest_subnormal)
    cols = [([np.inf, 1.0, -5.0], np.inf), ([-np.inf, 1.0], -np.inf),
            ([np.inf, -np.inf], np.nan), ([np.nan, np.inf], np.nan), ([1.0, np.nan], np.nan),
            ([-0.0, -0.0], -0.0), ([0.0, -0.0], 0.0), ([2.5, -2.5], 0.0), ([-2.5, 2.5], 0.0),
            ([big, big], np.inf), ([-big, -big], -np.inf), ([big, big, -big], big),
            ([tiny, tiny], 2 * tiny), ([tiny, -tiny, tiny], tiny)]
    width = max(len(c) for c, _ in cols)
    x = np.zeros((width, len(cols)), np.float64)
    want = np.array([w for _, w in cols], np.float64).astype(dtype)
    for i, (c, _) in enumerate(cols):
        x[:len(c), i] = c
    with np.errstate(over="ignore"):
        x = x.astype(dtype)
    for i, (c, _) in enumerate(cols):               # padding: +0.0 (or -0.0 for -0 sums)
        if all(np.signbit(v) and v == 0 for v in c):
            x[len(c):, i] = -0.0
    got = np.asarray(R.sum(x))
    assert bits(got[~np.isnan(want)]) == bits(want[~np.isnan(want)])
    assert np.array_equal(np.isnan(got), np.isnan(want))


def test_rounding_ties_to_even_and_subnormal_results():
    """1 + 2^-53 (a tie: stays 1), 1 + 2^-53 + 2^-100 (above: 1 + 2^-52), and a sum that lands
    in the subnormal range, rounded there."""
    x = np.array([[1.0, 1.0, 2.0 ** -1074 * 3, 1.0],
                  [2.0 ** -53, 2.0 ** -53, -2.0 ** -1074, 2.0 ** -53],
                  [0.0, 2.0 ** -100, 0.0, 2.0 ** -53]])
    got = np.asarray(R.sum(x, k=8))
    assert got.tolist() == [1.0, 1.0 + 2.0 ** -52, 2.0 ** -1073, 1.0 + 2.0 ** -52]


def test_capacity_and_bad_arguments():
    s = R.sum(np.ones((3, 2)))
    big = R.BinnedSum(s.dtype, s.shape, s.k, s.codes, s.limbs, R.CAPACITY)
    with pytest.raises(OverflowError, match="at most"):
        big + s
    with pytest.raises(TypeError, match="dtype"):
        R.sum(np.ones(3, np.int32))
    with pytest.raises(ValueError, match="k"):
        R.sum(np.ones(3), k=1)
    with pytest.raises(ValueError, match="k="):
        s + R.sum(np.ones((3, 2)), k=4)


# ----------------------------------------------------------------------------- entry points

def test_public_calls_at_one_rank():
    """mpicoll.allreduce / reduce_scatter_block with reproducible=True at one rank: the local
    reproducible sum's bits, for arrays and BinnedSums; refusals name the problem."""
    from mpi4py import MPI
    x = wide(5, 12, np.float32, seed=9)
    s = mpicoll.reproducible.sum(x)
    assert bits(mpicoll.allreduce(s, reproducible=True, comm=MPI.COMM_SELF)) == bits(s)
    assert bits(mpicoll.allreduce(x[0], reproducible=3, comm=MPI.COMM_SELF)) == bits(x[0])
    assert bits(mpicoll.reduce_scatter_block(s, reproducible=True, comm=MPI.COMM_SELF)) \
        == bits(s)
    buf = x[1].copy()
    mpicoll.allreduce(MPI.IN_PLACE, buf, reproducible=True, comm=MPI.COMM_SELF)
    assert bits(buf) == bits(x[1])
    with pytest.raises(ValueError, match="op SUM"):
        mpicoll.allreduce(x[0], op=MPI.MAX, reproducible=True, comm=MPI.COMM_SELF)
    with pytest.raises(ValueError, match="compress"):
        mpicoll.allreduce(x[0], compress="bf16", reproducible=True, comm=MPI.COMM_SELF)
    with pytest.raises(TypeError, match="dtype"):
        mpicoll.allreduce(np.ones(3, np.int64), reproducible=True, comm=MPI.COMM_SELF)
    with pytest.raises(TypeError, match="reproducible"):
        mpicoll.allreduce(x[0], reproducible="yes", comm=MPI.COMM_SELF)


def test_wire_bytes():
    """The reduce-scatter path sends (8K + s)/(2s) + 1/s times a ring all-reduce's bytes, the
    exchange of values exactly a ring all-reduce's: what the in-process executor counts."""
    from mpicoll.algorithms import alltoall_pairwise
    n = 1 << 20
    plain = 2 * n * 8 * 3 / 4
    assert R.wire_bytes(n, np.float64, size=4) / plain == pytest.approx((24 + 8 + 2) / 16)
    assert R.wire_bytes(n, np.float64, size=4, exchange=True) == plain
    p, blk = 4, n // 4
    scheds = [alltoall_pairwise.schedule(r, p, blk) for r in range(p)]
    sent = inprocess.run(scheds, [np.zeros(2 * p * blk) for _ in range(p)], op=None)
    gathered = inprocess.run(inprocess.schedules("allgather", "ring", p, n),
                             [np.zeros(n) for _ in range(p)], op=None)
    assert [8 * (a + b) for a, b in zip(sent.elements_sent, gathered.elements_sent)] == \
        [R.wire_bytes(n, np.float64, size=p, exchange=True)] * p


def _random_sums(rng, n, k):
    """Random slice sums below random codes: every magnitude, runs of zero low bits (ties),
    single bits, tiny and cancelled top digits, and a few specials' counts."""
    kind = rng.integers(0, 5, (n, k))
    v = rng.integers(-2 ** 62, 2 ** 62, (n, k)) >> rng.integers(0, 63, (n, k))
    v = np.where(kind == 0, 0, v)
    v = np.where(kind == 1, (v >> 20) << 20, v)
    v = np.where(kind == 2, np.where(v < 0, -1, 1) << rng.integers(0, 62, (n, k)), v)
    v = np.where(kind == 3, rng.integers(-3, 4, (n, k)), v)
    top = rng.integers(-2, R._TOP_CODE + 1, n).astype(np.int8)
    special = rng.random(n) < 0.02
    top[special] = R.SPECIAL
    v[special, :2] &= (1 << 33) - 1
    return v.reshape(-1), top


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_fast_rounding_is_the_exact_one(dtype):
    """The float64 and float32 rounding's round-to-odd shortcut gives the exact path's bits:
    sums of two or three values (ties are common), heavy cancellation, and random slice sums
    for every K (subnormal, overflowing and special results included)."""
    rng = np.random.default_rng(10)
    dtype = np.dtype(dtype)
    p, g = (53, -1074) if dtype == np.float64 else (24, -149)

    def exact(limbs, top, k):
        out = np.empty(top.size)
        R._round_into(limbs, top, k, p, g, R._POW2, out, top.size or 1, top.size * k,
                      np.empty(k + 1, np.int64))
        with np.errstate(over="ignore"):
            return out.astype(dtype)

    cases = [rng.standard_normal((2, 4000)).astype(dtype),
             rng.standard_normal((3, 4000)).astype(dtype),
             wide(7, 4000, dtype, seed=10)]
    for x in cases:
        s = R.sum(x)
        assert bits(R.rounded(s.limbs, s.codes, s.k, dtype)) == bits(exact(s.limbs, s.codes,
                                                                           s.k))
    for k in range(R.K_RANGE[0], R.K_RANGE[1] + 1):
        limbs, top = _random_sums(rng, 3000, k)
        fast, want = R.rounded(limbs, top, k, dtype), exact(limbs, top, k)
        nan = np.isnan(fast) & np.isnan(want)
        assert bits(fast[~nan]) == bits(want[~nan]), k


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_float_slices_are_the_bit_shift_ones(dtype):
    """float32/float64 values are cut by float arithmetic (``_float_slices_into``); the integer
    kernel (``_slices_into``, which the half types use) is the definition: the same slices for
    every K, block layout (a partial last block too), several rows, accumulated or not, on
    random bit patterns (subnormals, zeros of both signs, the largest finite values) and wide
    data, with top codes from the value's own up to the largest and the special code."""
    rng = np.random.default_rng(11)
    dtype = np.dtype(dtype)
    mb, eb, view = R._format(dtype)
    n = 6007
    patterns = rng.integers(np.iinfo(view).min, np.iinfo(view).max, 3 * n, dtype=view,
                            endpoint=True).view(dtype)
    patterns[::97] = 0
    patterns[1::97] = -0.0
    patterns[2::97] = np.finfo(dtype).max
    patterns[3::97] = -np.finfo(dtype).smallest_subnormal
    patterns[~np.isfinite(patterns)] = 1.0
    patterns[4::97] = np.inf                        # their elements' top is SPECIAL
    cases = [patterns.reshape(3, n), wide(3, n, dtype, seed=11)]
    for x in cases:
        own = np.max([R.codes(row) for row in x], axis=0).astype(np.int8)
        raised = np.where((own >= 0) & (own < R.SPECIAL),
                          np.minimum(own + rng.integers(0, 4, n), R._TOP_CODE), own)
        for k in range(R.K_RANGE[0], R.K_RANGE[1] + 1):
            for top in (own, raised.astype(np.int8)):
                for rows, block in ((1, n), (3, n), (1, 1000), (3, 777)):
                    stride = block * k + 3
                    size = -(-n // block) * stride
                    flat = np.ascontiguousarray(x[:rows]).reshape(-1)
                    for accumulate in (False, True):
                        if accumulate and top.max() == R.SPECIAL:
                            continue
                        start = rng.integers(-2 ** 40, 2 ** 40, size)
                        want, got = start.copy(), start.copy()
                        R._slices_into(flat.view(view), rows, mb, eb, top, k, want, block,
                                       stride, accumulate)
                        R._float_slices_into(flat, rows, top, R._SCALES[k], got, block,
                                             stride, accumulate)
                        hole = np.ones(size, bool)     # the stride's padding is not written
                        for b in range(-(-n // block)):
                            width = min(block, n - b * block)
                            for j in range(k):
                                at = b * stride + j * block
                                hole[at:at + width] = False
                        if top.max() == R.SPECIAL:  # inf/NaN elements: _specials_into's
                            special = np.flatnonzero(top == R.SPECIAL)
                            for j in range(k):
                                hole[(special // block) * stride + j * block
                                     + special % block] = True
                        assert np.array_equal(got[~hole], want[~hole]), (k, rows, block)
                        assert np.array_equal(got[hole], start[hole]) or top.max() == R.SPECIAL


def test_bench_flag():
    """``mpicoll bench --reproducible`` adds the reproducible call; it refuses what it can't do."""
    from mpicoll.tools import bench
    args = bench.parse_args(["--reproducible", "-d", "float64"])
    assert args.reproducible and args.dtype == "float64"
    for bad in (["-d", "int32"], ["--op", "max"], ["--collective", "allgather"]):
        with pytest.raises(SystemExit) as exc:
            bench.parse_args(["--reproducible", *bad])
        assert exc.value.code == 2


def test_every_form_refuses_bad_values_on_the_calling_rank():
    """Nonblocking, persistent and Buckets take reproducible= as the blocking call does and
    refuse what it can't do before any communication, naming it; the MPI library's and the
    shared-memory collectives (no schedule to run the phases on) raise NotImplementedError
    naming the form, never run silently without it."""
    from mpi4py import MPI
    x = wide(3, 8, np.float64, seed=11)[0]
    self = dict(comm=MPI.COMM_SELF)
    starts = {"iallreduce": lambda **kw: mpicoll.iallreduce(x, **self, **kw).wait(),
              "allreduce_init": lambda **kw: mpicoll.allreduce_init(x, **self, **kw)(),
              "ireduce_scatter_block":
                  lambda **kw: mpicoll.ireduce_scatter_block(x, **self, **kw).wait(),
              "reduce_scatter_block_init":
                  lambda **kw: mpicoll.reduce_scatter_block_init(x, **self, **kw)(),
              "Buckets": lambda **kw: mpicoll.Buckets([x.copy()], average=False, **self, **kw)}
    for name, run in starts.items():
        with pytest.raises(ValueError, match="op SUM"):
            run(op=MPI.MAX, reproducible=True)
        with pytest.raises(ValueError, match=r"k \(slices per value\) must be in 2\.\.8"):
            run(reproducible=9)
        with pytest.raises(TypeError, match="reproducible must be"):
            run(reproducible=2.0)
        with pytest.raises(NotImplementedError, match="algorithm='mpi'"):
            run(reproducible=True, algorithm="mpi")
    with pytest.raises(TypeError, match="dtype"):
        mpicoll.iallreduce(np.ones(3, np.int64), reproducible=True, **self)
    with pytest.raises(TypeError, match="dtype"):
        mpicoll.Buckets([np.ones(3, np.int32)], average=False, reproducible=True, **self)
    with pytest.raises(NotImplementedError, match="nonblocking form of allreduce.*'shm'"):
        mpicoll.iallreduce(x, reproducible=True, algorithm="shm", **self)
    with pytest.raises(ValueError, match="compress"):
        mpicoll.iallreduce(x.astype(np.float32), compress="bf16", reproducible=True, **self)
    # one rank: every form is the value itself, and the plan says K
    assert bits(mpicoll.iallreduce(x, reproducible=4, **self).wait()) == bits(x)
    h = mpicoll.allreduce_init(x, np.empty_like(x), reproducible=4, **self)
    assert bits(h()) == bits(x) and "reproducible=4" in h.plan.describe()


# ----------------------------------------------------------------------------- the exchange path

def test_pairwise_exchange_schedule():
    """alltoall_pairwise: after the run, rank r's received block s is rank s's block r, at
    every size and count; every step is one send and one copied receive, and each rank sends
    (P - 1) blocks."""
    from mpicoll.algorithms import alltoall_pairwise
    from mpicoll.schedule import check_step
    for p in range(1, 10):
        for count in (0, 1, 3):
            scheds = [alltoall_pairwise.schedule(r, p, count) for r in range(p)]
            for sched in scheds:
                for step in sched.steps:
                    check_step(step)
            bufs = [np.concatenate([np.arange(p * count) + 1000 * r, np.full(p * count, -1)])
                    .astype(np.float64) for r in range(p)]
            result = inprocess.run(scheds, bufs, op=None)
            for r in range(p):
                for s in range(p):
                    if s != r:
                        got = bufs[r][p * count + s * count:p * count + (s + 1) * count]
                        assert np.array_equal(got, np.arange(r * count, (r + 1) * count)
                                              + 1000 * s), (p, count, r, s)
            assert result.elements_sent == [(p - 1) * count] * p


def exchanged(rows, k=None):
    """auto's path for plain arrays, as the Job runs it: the values padded to P blocks, the
    pairwise exchange (in-process executor), each rank's block summed over the P rows and
    rounded (``rounded_rows``), the floats all-gathered; returns every rank's result."""
    from mpicoll.algorithms import alltoall_pairwise
    p, n = rows.shape
    dtype = rows.dtype
    k = R.DEFAULT_K[dtype] if k is None else k
    blk = -(-n // p)
    bufs = [np.zeros(2 * p * blk, dtype) for _ in range(p)]
    for r in range(p):
        bufs[r][:n] = rows[r]
    inprocess.run([alltoall_pairwise.schedule(r, p, blk) for r in range(p)], bufs, op=None)
    floats = []
    for r in range(p):
        mine = bufs[r][p * blk:]
        mine[r * blk:(r + 1) * blk] = bufs[r][r * blk:(r + 1) * blk]
        floats.append(R.rounded_rows(mine, p, k, np.empty(blk, dtype)))
    return [r[:n] for r in inprocess.allgather(floats)]


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_exchange_path_same_bits(dtype):
    """One row per rank (plain arrays), P up to 64, counts that do and don't divide into P
    blocks: every rank gets the whole set's local reproducible sum's bits."""
    for p in (1, 2, 3, 5, 8, 16, 64):
        for count in (1, 7, 3 * p + 1):
            x = wide(p, count, dtype, seed=p)
            want = bits(R.sum(x))
            for got in exchanged(x):
                assert bits(got) == want, (p, count)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_fused_rows_are_sum_then_rounded(dtype):
    """``rounded_rows`` (float32/float64: codes, slices and rounding fused by chunks) has the
    bits of ``rounded(sum(rows))``: every K, 1 to 5 rows, counts around the chunk's size, on
    random bit patterns (subnormals, zeros of both signs in every mix, the largest values,
    inf of both signs, NaN) and wide data."""
    rng = np.random.default_rng(12)
    dtype = np.dtype(dtype)
    _, _, view = R._format(dtype)
    for rows in (1, 2, 3, 5):
        for n in (1, R._CHUNK - 1, R._CHUNK + 1, 1500):
            patterns = rng.integers(np.iinfo(view).min, np.iinfo(view).max, rows * n,
                                    dtype=view, endpoint=True).view(dtype).copy()
            patterns[~np.isfinite(patterns)] = 1.0
            picks = rng.choice([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0], rows * n,
                               p=[0.15, 0.15, 0.01, 0.01, 0.005, 0.675])
            patterns = np.where(picks != 1.0, picks.astype(dtype), patterns)
            patterns[:rows * n:max(1, n // 7)] = np.finfo(dtype).max
            for x in (patterns.reshape(rows, n), wide(rows, n, dtype, seed=rows)):
                for k in range(R.K_RANGE[0], R.K_RANGE[1] + 1):
                    s = R.sum(x, k=k)
                    want = R.rounded(s.limbs, s.codes, k, dtype)
                    got = R.rounded_rows(np.ascontiguousarray(x).reshape(-1), rows, k,
                                         np.empty(n, dtype))
                    assert bits(got) == bits(want), (rows, n, k)
                    # the rows apart (shm's window: a segment per rank), garbage between
                    apart = np.full((rows, n + 37), np.nan, dtype)
                    apart[:, :n] = x
                    if dtype not in R._FLOAT_KERNELS:
                        with pytest.raises(ValueError, match="rows apart"):
                            R.rounded_rows(apart.reshape(-1), rows, k, np.empty(n, dtype),
                                           stride=n + 37)
                        continue
                    got = R.rounded_rows(apart.reshape(-1), rows, k, np.empty(n, dtype),
                                         stride=n + 37)
                    assert bits(got) == bits(want), (rows, n, k, "apart")


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_two_rows_by_one_addition(dtype):
    """Two ranks' rows (``rounded_pair``: one IEEE addition of the two values cut at the
    window, in float32 itself for float32 and K <= 3) have the bits of ``rounded(sum(rows))``
    on the pairs where a cut or the addition could go wrong: exact cancellation (+0), two -0s
    (-0), a zero beside anything, a value and its double (overflow at the largest), partners
    one unit apart, subnormals of both sizes, a partner far below the window, inf and NaN,
    for every K."""
    rng = np.random.default_rng(14)
    dtype = np.dtype(dtype)
    _, _, view = R._format(dtype)
    fi = ml_dtypes.finfo(dtype)
    n = 4096
    a = rng.integers(np.iinfo(view).min, np.iinfo(view).max, n, dtype=view,
                     endpoint=True).view(dtype).copy()
    a[~np.isfinite(a)] = 1.0
    partners = [-a, a, np.zeros_like(a), -np.zeros_like(a),
                (a.view(view) + 1).view(dtype),
                (a * dtype.type(2.0 ** -30)).astype(dtype), np.full_like(a, np.nan),
                np.full_like(a, np.inf), np.full_like(a, -np.inf),
                rng.permutation(a), np.full_like(a, fi.smallest_subnormal),
                np.full_like(a, -fi.max)]
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan], dtype)
    for b in partners:
        x = np.stack([a, b.astype(dtype)])
        # and the specials against each other, every ordered pair
        x[0, :len(special) ** 2] = np.tile(special, len(special))
        x[1, :len(special) ** 2] = np.repeat(special, len(special))
        for k in range(R.K_RANGE[0], R.K_RANGE[1] + 1):
            s = R.sum(x, k=k)
            want = R.rounded(s.limbs, s.codes, k, dtype)
            for pair in (x, x[::-1]):
                got = R.rounded_rows(np.ascontiguousarray(pair).reshape(-1), 2, k,
                                     np.empty(n, dtype))
                assert bits(got) == bits(want), k


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_float_rounding_on_ties_and_small_sums(dtype):
    """The rounding by float arithmetic (K = 2 and 3 into float64, K = 2 into float32) gives
    the exact path's bits on slice sums below 2^51 (the ones it takes): exact ties, one unit
    above and below a tie, random low bits, either sign, carries moved between digits, and
    every top code."""
    import random
    rand = random.Random(13)
    dtype = np.dtype(dtype)
    p, g = (53, -1074) if dtype == np.float64 else (24, -149)
    for k in ((2, 3) if dtype == np.float64 else (2,)):
        digits, tops = [], []
        for _ in range(20000):
            width = rand.randint(p + 1, k * R.W + 8)
            d = width - p
            t = ((rand.getrandbits(p) | 1 << (p - 1)) << d) + rand.choice(
                [1 << (d - 1), (1 << (d - 1)) + 1, (1 << (d - 1)) - 1, 0, 1,
                 rand.getrandbits(d)])
            t = -t if rand.random() < 0.5 else t
            row = [(t >> (j * R.W)) & ((1 << R.W) - 1) for j in range(k - 1)]
            row.append(t >> ((k - 1) * R.W))
            for j in range(k - 1, 0, -1):               # move some of each carry down
                q = rand.randint(-2 ** 9, 2 ** 9)
                row[j] -= q
                row[j - 1] += q << R.W
            digits.append(row)
            tops.append(rand.randint(k - 1, R._TOP_CODE))
        limbs = np.array(digits, np.int64).T.reshape(-1).copy()
        top = np.array(tops, np.int8)
        exact = np.empty(top.size)
        R._round_into(limbs, top, k, p, g, R._POW2, exact, top.size, top.size * k,
                      np.empty(k + 1, np.int64))
        with np.errstate(over="ignore"):
            exact = exact.astype(dtype)
        assert bits(R.rounded(limbs, top, k, dtype)) == bits(exact), k
