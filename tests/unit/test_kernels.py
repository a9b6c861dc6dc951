"""The numba kernels give the same bits as numpy's ufuncs with out=, NaN, inf, -0.0, subnormals
and integer wrap-around included, for every (op, dtype) pair MPI allows; the others raise."""

import ml_dtypes
import numpy as np
import pytest

from mpicoll import kernels

UFUNC = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum,
         "land": np.logical_and, "lor": np.logical_or, "lxor": np.logical_xor,
         "band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}
PAIRS = [(op, dtype) for dtype in kernels.DTYPES for op in kernels.ops_for(dtype)]
BF16 = np.dtype(ml_dtypes.bfloat16)


def _float_specials(dtype):
    """NaNs (several payloads, both signs, a signalling one), +-inf, +-0, extremes, subnormals."""
    f = ml_dtypes.finfo(dtype) if dtype == BF16 else np.finfo(dtype)
    bits = np.dtype(f"u{dtype.itemsize}")
    exp_mask = np.array([np.inf], dtype).view(bits)[0]
    nans = np.array([exp_mask | 1, exp_mask | (exp_mask >> 3 & ~exp_mask), exp_mask | 5,
                     (exp_mask | 1) | (bits.type(1) << (8 * dtype.itemsize - 1))],
                    bits).view(dtype)
    base = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, float(f.max), -float(f.max),
                     float(f.tiny), -float(f.tiny), float(f.smallest_subnormal),
                     -float(f.smallest_subnormal), float(f.eps), 1.0, -1.0, 2.0, 0.5],
                    np.float64).astype(dtype)
    return np.concatenate([base, nans])


def values(dtype, n, rng):
    """n values of dtype: random ones salted with special values (floats) or the full range."""
    if dtype.kind == "b":
        return rng.integers(0, 2, n).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)    # full range: sums and products wrap around
        x = rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
        x[rng.integers(0, max(n, 1), n // 4)] = rng.choice(
            np.array([0, 1, info.max, info.min], dtype), n // 4)
        return x
    scale = rng.choice([1e-6, 1.0, 1e3, 3e4], n) if dtype.itemsize == 2 else \
        rng.choice([1e-30, 1.0, 1e30], n)
    with np.errstate(over="ignore"):        # beyond float16's range: inf
        x = (rng.standard_normal(n) * scale).astype(dtype)
    idx = rng.integers(0, max(n, 1), n // 3)
    x[idx] = rng.choice(_float_specials(dtype), idx.size)
    return x


def _complex(dtype, n, rng):
    """n complex values whose parts are ``values`` of the part's float type."""
    part = np.dtype(f"f{dtype.itemsize // 2}")
    x = np.empty(n, dtype)
    x.real, x.imag = values(part, n, rng), values(part, n, rng)
    return x


def _first_difference(got, want):
    where = np.flatnonzero(got.view(np.uint8) != want.view(np.uint8))
    if where.size == 0:
        return None
    i = where[0] // got.itemsize
    return f"index {i}: got {got[i]!r} want {want[i]!r}"


@pytest.mark.parametrize("op,dtype", PAIRS, ids=[f"{op}-{dt}" for op, dt in PAIRS])
def test_kernel_bit_identical_to_numpy(op, dtype):
    rng = np.random.default_rng([7, kernels.DTYPES.index(dtype), kernels.OPS.index(op)])
    fn = kernels.kernel(op, dtype)
    # numpy's complex multiply fuses (FMA) in its vector loop only: a 1-element array differs
    sizes = (0, 2, 3, 16, 1000, 4099) if (op, dtype.kind) == ("prod", "c") else \
        (0, 1, 3, 16, 1000, 4099)
    for n in sizes:
        make = _complex if dtype.kind == "c" else values
        acc, x = make(dtype, n, rng), make(dtype, n, rng)
        want = acc.copy()
        with np.errstate(all="ignore"):
            UFUNC[op](want, x, out=want)
        got = acc.copy()
        fn(kernels.as_storage(got), kernels.as_storage(x))
        assert got.dtype == want.dtype
        if (op, dtype.kind) == ("prod", "c"):       # numpy's NaN bits vary: see kernels' doc
            parts = got.view(want.real.dtype), want.view(want.real.dtype)
            assert (np.isnan(parts[0]) == np.isnan(parts[1])).all(), (op, str(dtype), n)
            got, want = (np.where(np.isnan(p), np.nan, p) for p in parts)
        assert _first_difference(got, want) is None, (op, str(dtype), n,
                                                     _first_difference(got, want))


@pytest.mark.parametrize("dtype", [np.dtype(np.float16), BF16], ids=str)
@pytest.mark.parametrize("op", ["sum", "prod", "max", "min"])
def test_half_kernels_every_value(op, dtype):
    """Every one of the 65,536 bit patterns against a set of specials and random values, both
    orders: the rounding (to nearest even, subnormals kept, overflow to inf, NaN) as numpy's."""
    rng = np.random.default_rng(11)
    every = np.arange(1 << 16, dtype=np.uint16).view(dtype)
    others = np.concatenate([_float_specials(dtype), values(dtype, 24, rng)])
    fn = kernels.kernel(op, dtype)
    for y in others:
        for a, b in ((every, np.full_like(every, y)), (np.full_like(every, y), every)):
            want = a.copy()
            with np.errstate(all="ignore"):
                UFUNC[op](want, b, out=want)
            got = a.copy()
            fn(got.view(np.uint16), b.view(np.uint16))
            assert _first_difference(got, want) is None, (op, y, _first_difference(got, want))


@pytest.mark.parametrize("dtype", [np.dtype(np.float16), BF16], ids=str)
def test_half_rounding_stated(dtype):
    """The rule in kernels' docstring, on values chosen by hand: ties to even, subnormals kept,
    overflow to inf, NaN stays NaN."""
    fn = kernels.kernel("sum", dtype)
    f = ml_dtypes.finfo(dtype) if dtype == BF16 else np.finfo(dtype)
    eps = float(f.eps)
    one_up = 1 + eps                                  # the next value above 1
    cases = [
        (1.0, eps / 2, 1.0),                          # a tie: 1 is even, stays
        (one_up, eps / 2, 1 + 2 * eps),               # a tie: 1+eps is odd, rounds up
        (float(f.smallest_subnormal), float(f.smallest_subnormal),
         2 * float(f.smallest_subnormal)),            # subnormals are not flushed
        (float(f.max), float(f.max), np.inf),         # overflow to inf
        (-float(f.max), -float(f.max), -np.inf),
    ]
    for a, b, want in cases:
        acc = np.array([a], dtype)
        fn(acc.view(np.uint16), np.array([b], dtype).view(np.uint16))
        assert float(acc[0]) == want, (a, b, float(acc[0]), want)
    acc = np.array([np.nan], dtype)
    fn(acc.view(np.uint16), np.array([1.0], dtype).view(np.uint16))
    assert np.isnan(acc[0])


@pytest.mark.parametrize("dtype", kernels.DTYPES, ids=str)
def test_disallowed_pairs_raise_naming_the_allowed_ops(dtype):
    for op in kernels.OPS:
        if op in kernels.ops_for(dtype):
            continue
        with pytest.raises(TypeError) as err:
            kernels.kernel(op, dtype)
        text = str(err.value)
        assert f"op {op!r}" in text and str(dtype) in text
        assert ", ".join(kernels.ops_for(dtype)) in text


def test_refusal_message():
    with pytest.raises(TypeError) as err:
        kernels.check("band", np.float64)
    assert str(err.value) == ("op 'band' does not apply to dtype float64 (MPI allows band on "
                              "integer types; float64 is floating); ops for float64: sum, prod, "
                              "max, min")
    with pytest.raises(TypeError, match=r"allows sum on integer, floating and complex types; "
                                        r"bool is logical\); ops for bool: land, lor, lxor$"):
        kernels.check("sum", np.bool_)


def test_rules_are_mpis():
    """MPI-4.1 §6.9.2, spelled out for one type of each class."""
    assert kernels.ops_for(np.int16) == kernels.OPS
    assert kernels.ops_for(np.float32) == ("sum", "prod", "max", "min")
    assert kernels.ops_for(BF16) == ("sum", "prod", "max", "min")
    assert kernels.ops_for(np.complex64) == ("sum", "prod")
    assert kernels.ops_for(np.bool_) == ("land", "lor", "lxor")


@pytest.mark.parametrize("op,dtype", PAIRS[::3], ids=[f"{op}-{dt}" for op, dt in PAIRS[::3]])
def test_numpy_kernels_match(op, dtype, monkeypatch):
    rng = np.random.default_rng(3)
    make = _complex if dtype.kind == "c" else values
    acc, x = make(dtype, 50, rng), make(dtype, 50, rng)
    a, b = acc.copy(), acc.copy()
    kernels.kernel(op, dtype)(kernels.as_storage(a), kernels.as_storage(x))
    with np.errstate(all="ignore"):
        kernels.numpy_kernel(op, dtype)(kernels.as_storage(b), kernels.as_storage(x))
    assert a.tobytes() == b.tobytes()


def test_kernels_work_on_views():
    acc = np.zeros(10)
    kernels.sum_into(acc[2:5], np.ones(3))
    assert acc.tolist() == [0, 0, 1, 1, 1, 0, 0, 0, 0, 0]


def test_compilation_is_lazy():
    """Asking for one kernel compiles (or loads) that (op, dtype) only."""
    before = set(kernels._ready)
    kernels.kernel("bxor", np.int16)
    assert ("bxor", np.dtype(np.int16)) in kernels._ready
    assert set(kernels._ready) - before <= {("bxor", np.dtype(np.int16))}


def test_read_through_is_a_writable_alias_of_a_read_only_array():
    """A read-only sendbuf reaches the kernels as a writable array over its own memory (numba
    would compile each kernel again for the read-only type), which keeps the original alive."""
    import gc
    import numba

    frozen = np.arange(6.0)
    frozen.flags.writeable = False
    alias = kernels.read_through(frozen)
    assert alias.flags.writeable and np.shares_memory(alias, frozen)
    assert numba.typeof(alias) == numba.typeof(np.arange(6.0))     # the writable array's type
    writable = np.arange(3)
    assert kernels.read_through(writable) is writable
    from_bytes = np.frombuffer(bytes(range(8)), np.uint8)         # memory nobody may write
    del frozen
    gc.collect()
    assert alias.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert kernels.read_through(from_bytes).tolist() == list(range(8))
