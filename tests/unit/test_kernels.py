"""The numba kernels give the same bits as numpy's ufuncs with out=, NaN and inf included."""

import numpy as np
import pytest

from mpicoll import kernels

UFUNC = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}


def special_floats(dtype, n, rng):
    """Random values salted with NaNs (several payloads, both signs), +-inf, +-0 and extremes."""
    f = np.finfo(dtype)
    specials = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, f.max, -f.max, f.tiny,
                         -f.tiny, f.eps, 1.0, -1.0], dtype)
    itype = np.int32 if dtype == np.float32 else np.int64
    payload_nans = (specials[:1].view(itype) | itype(5)).view(dtype)   # a NaN with a payload
    specials = np.concatenate([specials, payload_nans])
    x = rng.standard_normal(n).astype(dtype) * rng.choice([1e-30, 1.0, 1e30], n).astype(dtype)
    idx = rng.integers(0, n, n // 3)
    x[idx] = rng.choice(specials, idx.size)
    return x


@pytest.mark.parametrize("op", kernels.OPS)
@pytest.mark.parametrize("dtype", kernels.DTYPES, ids=str)
def test_kernel_bit_identical_to_numpy(op, dtype):
    rng = np.random.default_rng(7)
    for n in (0, 1, 3, 16, 1000, 4099):
        if dtype.kind == "f":
            acc, x = special_floats(dtype, n, rng), special_floats(dtype, n, rng)
        else:
            info = np.iinfo(dtype)    # full range: sums and products wrap around
            acc = rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
            x = rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
        want = acc.copy()
        with np.errstate(all="ignore"):
            UFUNC[op](want, x, out=want)
        got = acc.copy()
        kernels.KERNELS[op](got, x)
        assert got.tobytes() == want.tobytes(), (
            f"{op} {dtype} n={n}: first differing index "
            f"{np.flatnonzero(got.view(np.uint8) != want.view(np.uint8))[:1] // dtype.itemsize}")


@pytest.mark.parametrize("op", kernels.OPS)
def test_numpy_kernels_match(op):
    acc = np.arange(10.0)
    x = np.arange(10.0)[::-1].copy()
    a, b = acc.copy(), acc.copy()
    kernels.KERNELS[op](a, x)
    kernels.NUMPY_KERNELS[op](b, x)
    assert a.tobytes() == b.tobytes()


def test_kernels_work_on_views():
    acc = np.zeros(10)
    kernels.sum_into(acc[2:5], np.ones(3))
    assert acc.tolist() == [0, 0, 1, 1, 1, 0, 0, 0, 0, 0]
