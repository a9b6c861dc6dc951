"""Reproducible sums on one rank: the formats and K, the pieces every path runs (``codes``,
``slices``, ``rounded``, ``rounded_rows``, ``rounded_pair``, ``wire_bytes``) and ``BinnedSum``,
the exact, not yet rounded sum that ``sum`` makes and ``+`` merges."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from .round_kernels import (_CHUNK, _F32_PAIR_K, _pair_sums32_into, _pair_sums_into,
                            _round_fast_into, _round_float_into, _round_into, _round_rows_into)
from .slice_kernels import (CAPACITY, G, K_RANGE, SPECIAL, W, _codes_into, _float_slices_into,
                            _max_rows_into, _shift_into, _slices_into, _specials_into,
                            _window_table)

bfloat16 = np.dtype(ml_dtypes.bfloat16)
# dtype -> (mantissa bits, exponent bits, the integer view of its bits)
_FORMATS = {np.dtype(np.float64): (52, 11, np.dtype(np.int64)),
            np.dtype(np.float32): (23, 8, np.dtype(np.int32)),
            np.dtype(np.float16): (10, 5, np.dtype(np.int16)),
            bfloat16: (7, 8, np.dtype(np.int16))}
DTYPES = tuple(_FORMATS)
DEFAULT_K = {np.dtype(np.float64): 3, np.dtype(np.float32): 2, np.dtype(np.float16): 2,
             bfloat16: 2}

# ----------------------------------------------------------------------------- the pieces

_SCALES = {k: tuple(2.0 ** (-j * W) for j in range(k + 1))      # 2^-jW, j = 0..k
           for k in range(K_RANGE[0], K_RANGE[1] + 1)}
# the dtypes the float-arithmetic kernels take (slices, the fused sum of rows), and the
# (K, dtype) the rounding by float arithmetic serves (``_float_rounding``)
_FLOAT_KERNELS = (np.dtype(np.float64), np.dtype(np.float32))
_FLOAT_ROUNDING = ((2, np.dtype(np.float64)), (3, np.dtype(np.float64)),
                   (2, np.dtype(np.float32)))


def _format(dtype) -> tuple:
    dtype = np.dtype(dtype)
    try:
        return _FORMATS[dtype]
    except KeyError:
        raise TypeError(f"reproducible sums support dtype {', '.join(map(str, DTYPES))}, not "
                        f"{dtype}") from None


def _k(k, dtype) -> int:
    if k is None:
        return DEFAULT_K[np.dtype(dtype)]
    if not isinstance(k, (int, np.integer)) or isinstance(k, (bool, np.bool_)):
        raise TypeError(f"k (slices per value) must be an integer, got {type(k).__name__}")
    if not K_RANGE[0] <= k <= K_RANGE[1]:
        raise ValueError(f"k (slices per value) must be in {K_RANGE[0]}..{K_RANGE[1]}, got {k}")
    return int(k)


def _lowest(dtype) -> int:
    """The exponent of the format's smallest subnormal's bit."""
    mb, eb, _ = _FORMATS[np.dtype(dtype)]
    return 2 - (1 << (eb - 1)) - mb


with np.errstate(over="ignore"):
    _POW2 = np.ldexp(1.0, np.arange(G, G + 2600))   # 2^e at e - G; inf above float64's range


def codes(x: np.ndarray, code_dtype=np.int8) -> np.ndarray:
    """The bin code of every value of ``x`` (flat)."""
    mb, eb, view = _format(x.dtype)
    out = np.empty(x.size, code_dtype)
    _codes_into(np.ascontiguousarray(x).reshape(-1).view(view), mb, eb, out)
    return out


def slices(x: np.ndarray, top: np.ndarray, k: int, *, rows: int = 1, out=None, block=None,
           stride=None, accumulate=False) -> np.ndarray:
    """``x``'s values (``rows`` rows of top.size, summed row-wise) cut into k slices below
    ``top``: an int64 array of top.size * k (or ``out``, laid out in blocks, see the kernel)."""
    mb, eb, view = _format(x.dtype)
    n = top.size
    if out is None:
        out = np.empty(n * k, np.int64)
    block = (n or 1) if block is None else block
    stride = block * k if stride is None else stride
    values = np.ascontiguousarray(x).reshape(-1)
    flat = values.view(view)
    if values.dtype in _FLOAT_KERNELS:
        _float_slices_into(values, rows, top, _SCALES[k], out, block, stride, accumulate)
    else:
        _slices_into(flat, rows, mb, eb, top, k, out, block, stride, accumulate)
    if n and top.max() == SPECIAL:
        if accumulate:
            raise AssertionError("inf/NaN slices are never accumulated: sum() counts all rows")
        _specials_into(flat, rows, mb, eb, top, k, out, block, stride)
    return out


def rounded(limbs: np.ndarray, top: np.ndarray, k: int, dtype, *, block=None,
            stride=None, out=None) -> np.ndarray:
    """The slice sums ``limbs`` below ``top`` as ``dtype``, rounded once (flat; into ``out``
    if given)."""
    dtype = np.dtype(dtype)
    mb, _, _ = _format(dtype)
    if out is not None and dtype.itemsize < 4:
        np.copyto(out, rounded(limbs, top, k, dtype, block=block, stride=stride))
        return out
    if out is None:
        out = np.empty(top.size, dtype if dtype.itemsize >= 4 else np.float64)
    block = (top.size or 1) if block is None else block
    stride = block * k if stride is None else stride
    if (k, dtype) in _FLOAT_ROUNDING:
        _round_float_into(limbs, top, k, mb + 1, _lowest(dtype), _POW2, out, block, stride,
                          np.empty(k + 1, np.int64), _CHUNK, _window_table(k))
    elif dtype.itemsize >= 4:
        drop = 0 if dtype == np.float64 else 10
        _round_fast_into(limbs, top, k, mb + 1, _lowest(dtype), drop, _POW2, out, block, stride,
                         np.empty(k + 1, np.int64))
    else:
        _round_into(limbs, top, k, mb + 1, _lowest(dtype), _POW2, out, block, stride,
                    np.empty(k + 1, np.int64))
    if out.dtype == dtype:
        return out
    with np.errstate(over="ignore"):
        return out.astype(dtype)


def rounded_rows(x: np.ndarray, rows: int, k: int, out: np.ndarray, codes=None,
                 limbs=None, stride=None) -> np.ndarray:
    """``rounded(*sum(x.reshape(rows, -1)))`` into ``out`` (flat, x's dtype): the same bits,
    fused for float32/float64 (``_round_rows_into``); ``codes`` (rows * n int8) and ``limbs``
    (n * k int64): the other dtypes' scratch, made if not given. ``stride``: row r of the n
    = out.size values starts at x[r * stride] (float32/float64; default n: x is rows x n)."""
    mb, eb, view = _format(x.dtype)
    n = out.size
    stride = n if stride is None else stride
    if _in_pairs(rows, x.dtype):
        return rounded_pair(x[:n], x[stride:stride + n], k, out)
    if x.dtype in _FLOAT_KERNELS:
        chunk = max(1, min(_CHUNK, n))
        drop = 0 if x.dtype == np.float64 else 10
        _round_rows_into(x, x.view(view), rows, stride, mb, eb, k, mb + 1, _lowest(x.dtype), drop,
                         (k, x.dtype) in _FLOAT_ROUNDING, _SCALES[k], _POW2, _window_table(k),
                         out, np.empty(chunk, np.int8), np.empty(k * chunk, np.int64),
                         np.empty(chunk), np.empty(chunk, np.bool_), np.empty(k + 1, np.int64))
        return out
    if stride != n:
        raise ValueError(f"rounded_rows: rows apart (stride {stride}) only for float32/float64, "
                         f"not {x.dtype}")
    codes = np.empty(rows * n, np.int8) if codes is None else codes
    top = np.empty(n, np.int8)
    _codes_into(x.view(view), mb, eb, codes)
    _max_rows_into(codes, rows, top)
    limbs = slices(x, top, k, rows=rows, out=limbs)
    return rounded(limbs, top, k, x.dtype, out=out)


def _in_pairs(rows: int, dtype) -> bool:
    """Whether ``rounded_rows`` sums ``rows`` rows of ``dtype`` by ``rounded_pair``, which
    reads each row where it is (so a caller may pass the two rows apart)."""
    return rows == 2 and dtype in _FLOAT_KERNELS


def rounded_pair(a: np.ndarray, b: np.ndarray, k: int, out: np.ndarray) -> np.ndarray:
    """``rounded_rows`` of two rows of float32/float64 values, each read where it is: one
    addition per element (``_pair_sums_into``, ``_pair_sums32_into``)."""
    if a.dtype == np.float32 and k <= _F32_PAIR_K:
        _pair_sums32_into(a, b, k, out)
    else:
        _pair_sums_into(a, b, k, a.dtype == np.float32, out)
    return out


def wire_bytes(count: int, dtype, k=None, size: int = 2, split: bool = True,
               exchange: bool = False) -> int:
    """Bytes one rank sends in a reproducible all-reduce of ``count`` elements over ``size``
    ranks by ring-like algorithms (the MAX of int8 codes, the slices' reduce-scatter, the
    floats' all-gather; ``split=False``: one all-reduce of the slices; ``exchange``: auto's
    path for arrays, the values' pairwise exchange and the floats' all-gather, a plain
    all-reduce's bytes)."""
    dtype, k = np.dtype(dtype), _k(k, dtype)
    frac = (size - 1) / size
    if exchange:
        return round(2 * frac * count * dtype.itemsize)
    codes_bytes = 2 * frac * count
    if split:
        return round(codes_bytes + frac * count * (8 * k) + frac * count * dtype.itemsize)
    return round(codes_bytes + 2 * frac * count * 8 * k)


# ----------------------------------------------------------------------------- local sums

class BinnedSum:
    """An exact, not yet rounded, reproducible sum: per element its top bin (``codes``), k
    slice sums below it (``limbs``, int64, slice-major: element i's slice j at j * size + i)
    and how many values it holds (``terms``). ``np.asarray(s)`` / ``s.value()`` rounds it;
    ``a + b`` merges two;
    ``mpicoll.allreduce(s, reproducible=True)`` sums it over ranks. Made by ``sum``."""

    __slots__ = ("dtype", "shape", "k", "codes", "limbs", "terms")

    def __init__(self, dtype, shape, k, codes, limbs, terms):
        self.dtype, self.shape, self.k = np.dtype(dtype), tuple(shape), k
        self.codes, self.limbs, self.terms = codes, limbs, int(terms)

    @property
    def size(self) -> int:
        return self.codes.size

    def value(self) -> np.ndarray:
        """The sum, rounded once to ``dtype`` (a 0-d array for a scalar sum)."""
        return rounded(self.limbs, self.codes, self.k, self.dtype).reshape(self.shape)

    def __array__(self, dtype=None, copy=None):
        v = self.value()
        return v if dtype is None else v.astype(dtype)

    def __add__(self, other: "BinnedSum") -> "BinnedSum":
        if not isinstance(other, BinnedSum):
            return NotImplemented
        if (other.dtype, other.size, other.k) != (self.dtype, self.size, self.k):
            raise ValueError(f"can't add a BinnedSum of {other.size} {other.dtype} (k="
                             f"{other.k}) to one of {self.size} {self.dtype} (k={self.k})")
        _check_terms(self.terms + other.terms)
        top = np.maximum(self.codes, other.codes)
        limbs = np.empty_like(self.limbs)
        block = top.size or 1
        _shift_into(self.codes, self.limbs, top, self.k, limbs, block, block * self.k, False)
        _shift_into(other.codes, other.limbs, top, self.k, limbs, block, block * self.k, True)
        return BinnedSum(self.dtype, self.shape, self.k, top, limbs, self.terms + other.terms)

    def __repr__(self) -> str:
        return (f"BinnedSum(shape={self.shape}, dtype={self.dtype}, k={self.k}, "
                f"terms={self.terms})")


def _check_terms(n: int) -> None:
    if n > CAPACITY:
        raise OverflowError(f"a reproducible sum of {n} values per element: the int64 slice "
                            f"sums hold at most {CAPACITY} (2^{62 - W}, bins of W = {W} bits)")


def sum(array, axis=0, *, k=None) -> BinnedSum:         # noqa: A001 - the natural name
    """The reproducible sum of ``array`` along ``axis``, exact and not yet rounded: a
    ``BinnedSum`` that rounds to the same bits as any other grouping of the same values
    (``np.asarray`` it, or all-reduce it with ``reproducible=True``)."""
    a = np.asarray(array)
    _format(a.dtype)
    k = _k(k, a.dtype)
    a = np.ascontiguousarray(np.moveaxis(a, axis, 0)) if a.ndim else a.reshape(1)
    rows, shape = a.shape[0], a.shape[1:]
    _check_terms(rows)
    n = int(np.prod(shape, dtype=np.int64))
    top = np.empty(n, np.int8)
    _max_rows_into(codes(a), rows, top)
    limbs = slices(a, top, k, rows=rows)
    return BinnedSum(a.dtype, shape, k, top, limbs, rows)


def warmup() -> None:
    """Compile (or load from numba's disk cache) the kernels a reproducible call with the
    default K runs, for every dtype: the local sum, its merge and rounding; the slices' path
    (codes as int8, or int32 for ``shm``, slices and rounding by blocks); the exchange path's
    sums of two rows and of more. ``python -m mpicoll.tools.warm`` calls it, so that no rank's
    first reproducible call compiles (some 6 s at N = 2 on this project's machine)."""
    for dtype in DTYPES:
        k = DEFAULT_K[dtype]
        x = np.arange(-4.0, 4.0).astype(dtype)
        for rows in (1, 2, 3):
            s = sum(np.tile(x, (rows, 1)), k=k)
            (s + s).value()
            rounded_rows(np.tile(x, rows), rows, k, np.empty(x.size, dtype))
        blk = x.size // 2
        for code_dtype in _CODE_DTYPE.values():
            top = codes(x, code_dtype)
            limbs = slices(x, top, k, block=blk, stride=blk * k + 1,
                           out=np.zeros(2 * (blk * k + 1), np.int64))
            rounded(limbs, top[:blk], k, dtype, block=blk, out=np.empty(blk, dtype))
            rounded(limbs[:x.size * k], top, k, dtype, out=np.empty(x.size, dtype))



# the bin codes' dtype on the wire: int32 for shm (its kernels need >= 4 bytes), else int8
_CODE_DTYPE = {True: np.dtype(np.int32), False: np.dtype(np.int8)}   # shm needs >= 4 bytes
