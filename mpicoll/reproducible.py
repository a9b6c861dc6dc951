"""Reproducible sums: the same bits at any rank count, algorithm, executor, segment size and
node layout, for the same global multiset of values (docs/algorithms.md#reproducible-sums).

    y = mpicoll.allreduce(x, reproducible=True)             # float64/32/16, bfloat16; op SUM
    y = mpicoll.reduce_scatter_block(x, reproducible=True)
    s = mpicoll.reproducible.sum(batch, axis=0)             # a BinnedSum: exact, not yet rounded
    y = mpicoll.allreduce(s, reproducible=True)             # = the sum of every rank's batch

How (ReproBLAS's binning, Demmel, Ahrens and Nguyen, with integers on the wire):

1. **Bin codes, MAX.** The exponent range is cut into bins of ``W = 40`` bits on a fixed grid
   (bin b holds the bits of weight ``2^(G + bW)`` to ``2^(G + bW + W - 1)``, G = -1074,
   float64's smallest subnormal bit, for every dtype). Each value's code is the bin of its
   leading bit (int8; -1 for +0.0, -2 for -0.0, 127 for inf/NaN). One element-wise MAX
   all-reduce gives each element's top bin B, the same on every rank.
2. **Slices.** Each value is cut, on its own, into K integer slices: bins B-K+1 .. B, each a
   signed int64 below 2^W in magnitude; the bits below bin B-K+1 are dropped (truncation toward
   zero, per value, so what is dropped depends on the value and B only, never on order or
   grouping).
3. **Integer SUM.** The slices are summed as int64 by any algorithm: integer addition is exact
   and associative while every partial sum stays below 2^62, which n <= 2^(62-W) = 2^22 values
   per element guarantee (``CAPACITY``, checked). An explicit ``algorithm=`` runs the MAX and
   the SUM; ``auto`` (one of mpicoll's schedules: every form runs a ``Job``) all-reduces the
   slices below ``SPLIT_BYTES``. Above, each rank rounds a block of n/N elements and the
   floats are all-gathered: an array's values come to the rank that rounds them by a pairwise
   exchange, which then does all three passes on them (``rounded_rows``: the plain
   all-reduce's bytes, no slices on the wire; float32/float64 on one node: through ``shm``'s
   window instead, no message, ``WINDOW``); a ``BinnedSum``'s slices are reduce-scattered
   ((8K + s + 2)/(2s) of the plain bytes, s the element size: 2.1x for float64, K = 3).
   ``reduce_scatter_block`` takes the same paths, without the all-gather.
   ``algorithm="mpi"`` / ``"shm"`` (blocking only) run the module's ``allreduce`` /
   ``reduce_scatter_block``: nested calls, ``SPLIT`` as set.
4. **One rounding.** The K slice sums are carried into one exact integer and rounded once to the
   nearest float, ties to even (subnormals kept, overflow to +-inf); for the default K, by
   float arithmetic (TwoSum and rounding to odd), the same bits.

So the result is a function of the multiset of values alone: round(sum over values of
trunc_L(value)), with L the bottom of bin B-K+1. Error: |result - exact| <= u.|exact| +
(1 + u).n.2^L, with 2^L <= 2^(-(K-1)W).max|x|; with the default K (``DEFAULT_K``) that is within
eps.sum|x| and, on same-signed data, 1 ulp, for n up to the capacity (float64, float16 -- exact
there --, bfloat16) or n <= 2^15 (float32, K = 2). NaN and inf propagate as
IEEE's sum does (any NaN, or +inf with -inf: NaN, the default quiet NaN, payloads not kept;
else the infinity); the sum of only -0.0 is -0.0, an exact cancellation +0.0.
"""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
from numba import njit, types
from numba.cpython.unsafe.numbers import leading_zeros
from numba.extending import intrinsic

from .buffers import array

__all__ = ["W", "CAPACITY", "DEFAULT_K", "DTYPES", "BinnedSum", "sum", "allreduce",
           "reduce_scatter_block", "wire_bytes", "rounded_rows", "spelled", "Job"]

W = 40                          # bits per bin (and per slice)
CAPACITY = 1 << (62 - W)        # terms per element: |slice sum| < n.2^W <= 2^62, carries fit
SPECIAL, PLUS_ZERO, MINUS_ZERO = 127, -1, -2        # bin codes that are not bins
_NAN_UNIT = 1 << 31             # an inf/NaN element's slices count +inf, -inf and NaN (x 2^31)

bfloat16 = np.dtype(ml_dtypes.bfloat16)
# dtype -> (mantissa bits, exponent bits, the integer view of its bits)
_FORMATS = {np.dtype(np.float64): (52, 11, np.dtype(np.int64)),
            np.dtype(np.float32): (23, 8, np.dtype(np.int32)),
            np.dtype(np.float16): (10, 5, np.dtype(np.int16)),
            bfloat16: (7, 8, np.dtype(np.int16))}
DTYPES = tuple(_FORMATS)
DEFAULT_K = {np.dtype(np.float64): 3, np.dtype(np.float32): 2, np.dtype(np.float16): 2,
             bfloat16: 2}
K_RANGE = (2, 8)
# Above this many limb bytes per rank, ``auto`` reduce-scatters the slices and all-gathers the
# floats (3 collectives, fewer bytes); below, one all-reduce of the slices (fewer messages).
SPLIT_BYTES = 256 << 10
SPLIT = "nodes"     # when auto splits: "nodes" (ranks on several nodes), "always", "never"
# auto, large, an array of float32/float64, every rank on one node where shm runs: the values
# meet in shm's window (``Job._run_window``) instead of the exchange and the all-gather
WINDOW = True


# ----------------------------------------------------------------------------- kernels
#
# The bin grid is float64's for every dtype: bin b holds the bits of weight 2^(G + bW) to
# 2^(G + bW + W - 1), G = -1074 (the smallest subnormal's bit), so the codes are 0..52. The
# codes and the slices read a value's bits (as a signed integer of its width: the sign is its
# sign) and compute in int64; rounding in int64 and float64, each step exact. A slice buffer
# holds blocks of elements, slice-major within a block (``_slices_into``).

G = -1074
_TOP_CODE = (1023 - G) // W                 # 52: the bin of float64's largest finite value
_PER_W = 1639       # (p * _PER_W) >> 16 == p // W for every grid place p (numba's // branches)
assert all((p * _PER_W) >> 16 == p // W for p in range((_TOP_CODE + 1) * W))


@njit(cache=True, nogil=True)
def _bitlen(v):
    """The bit length of v > 0 (LLVM's ctlz)."""
    return 64 - leading_zeros(np.uint64(v))


@njit(cache=True, nogil=True, inline="always")
def _magnitude_code(a, mb, eb):
    """The bin code of the nonzero magnitude whose bits are a (a value's bits but the sign;
    SPECIAL for inf/NaN). Selects, no branches: loops vectorise."""
    emask = (1 << eb) - 1
    mmask = (1 << mb) - 1
    first = -((1 << (eb - 1)) - 1) - mb - G     # the grid place of bit 0 of m at e = 0 or 1
    e = np.int64((np.uint64(a) >> np.uint64(mb)) & np.uint64(emask))
    m = a & mmask
    # m's bit length (a subnormal's), from the exponent of float64(m), m < 2^52: exact
    length = np.int64(np.uint64(_float_bits(_bits_float(m | _TWO52_BITS) - _TWO52))
                      >> np.uint64(52)) - 1022
    lead = first + (e + mb if e != 0 else length)      # its leading bit's place, >= 0
    # lead // W, in int32 (AVX2 multiplies 32-bit lanes, not 64-bit ones)
    code = np.int8((np.int32(lead) * np.int32(_PER_W)) >> np.int32(16))
    return np.int8(SPECIAL) if e == emask else code


@njit(cache=True, nogil=True, inline="always")
def _float_code(m):
    """The bin code of float64 magnitude m (the same as ``_magnitude_code`` of its bits for
    m > 0 finite; inf/NaN's above the top code, a zero's -1): from m's exponent, a subnormal's
    scaled by 2^64 first. Float arithmetic and selects, no integer MAX: loops vectorise."""
    subnormal = m < _SMALLEST_NORMAL
    e = np.int64(np.uint64(_float_bits(m * _TWO64 if subnormal else m)) >> np.uint64(52))
    lead = e - (64 if subnormal else 0) - 1023 - G          # the grid place of its leading bit
    return (np.int32(lead) * np.int32(_PER_W)) >> np.int32(16)


@njit(cache=True, nogil=True, inline="always")
def _code(b, mb, eb):
    """The bin code of the value whose bits are b."""
    a = b & ((1 << (mb + eb)) - 1)                      # the bits but the sign
    zero = np.int8(MINUS_ZERO) if b < 0 else np.int8(PLUS_ZERO)
    return _magnitude_code(a, mb, eb) if a != 0 else zero


@njit(cache=True, nogil=True)
def _codes_into(bits, mb, eb, out):
    """out[i] = the bin code of the value whose bits are bits[i]."""
    for i in range(bits.shape[0]):
        out[i] = _code(np.int64(bits[i]), mb, eb)


@njit(cache=True, nogil=True)
def _max_rows_into(codes, rows, out):
    """out[i] = max over r of codes[r * n + i] (n = out.size)."""
    n = out.shape[0]
    for i in range(n):
        out[i] = codes[i] if rows else PLUS_ZERO
    for r in range(1, rows):
        base = r * n
        for i in range(n):
            c = codes[base + i]
            if c > out[i]:
                out[i] = c


@njit(cache=True, nogil=True, inline="always")
def _slice(b, mb, eb, bottom):
    """The slice of bin ``bottom`` / W of the value whose bits are b: sign(x) times the W bits
    of |x| from grid place ``bottom`` up (0 for inf and NaN: see ``_specials_into``). The
    value is m.2^(G + p), m its integer significand and p its bit 0's grid place, so the slice
    is m shifted by p - bottom (left or right) and masked: integer shifts, exact, no branches."""
    emask = (1 << eb) - 1
    e = (b >> mb) & emask
    m = (b & ((1 << mb) - 1)) | (np.int64(e != 0) << mb)
    m = m if e != emask else 0
    d = max(e, 1) - ((1 << (eb - 1)) - 1) - mb - G - bottom
    v = ((m << min(max(d, 0), 63)) >> min(max(-d, 0), 63)) & ((1 << W) - 1)
    negative = b >> 63                                  # 0 or -1
    return (v ^ negative) - negative


@njit(cache=True, nogil=True)
def _slices_into(bits, rows, mb, eb, top, k, out, block, stride, accumulate):
    """Cut each value (``bits``: ``rows`` rows of n = top.size values, summed row-wise) into k
    slices below its element's top bin, into ``out`` in blocks of ``block`` elements, slice-
    major within a block: element i's slice j (j = 0: the lowest bin) at
    out[(i // block) * stride + j * block + i % block]; ``accumulate``: add to what is there.
    The top codes of zeros give 0; those of inf/NaN elements are counted by
    ``_specials_into``. One pass over the values (a loop per slice over chunks of the block
    vectorises, and is faster alone, but took 1.5-2x as long with two ranks sharing the
    machine's two cores: performance.md#reproducible-sums)."""
    n = top.shape[0]
    for r in range(rows):
        add = accumulate or r > 0
        row = bits[r * n:(r + 1) * n]
        for blk in range((n + block - 1) // block):
            o = blk * stride - blk * block
            for i in range(blk * block, min((blk + 1) * block, n)):
                b, bottom = np.int64(row[i]), (np.int64(top[i]) - k + 1) * W
                for j in range(k):
                    v = _slice(b, mb, eb, bottom + j * W)
                    out[o + j * block + i] = out[o + j * block + i] + v if add else v


# float32 and float64 values are cut by float arithmetic, which vectorises (AVX2 has no
# float -> int64 conversion and no 64-bit variable shift per lane, which ``_slices_into`` needs
# per slice): 3.3x faster for float64, K = 3, the same bits (tests/unit/test_reproducible.py).
# v = x.2^-(G + L), L the bottom of the lowest slice's bin, is exact (a power of two, as two
# factors that are normal floats; a v below 1 has no bit in the window either way); then
# slice j = trunc(v.2^-jW) - 2^W.trunc(v.2^-(j+1)W), exact (the integer bits of v.2^-jW
# below 2^W, with v's sign, as ``_slice``), below 2^40, read as an int64 by adding 1.5.2^52
# and taking the bits (exact for integers below 2^51 in magnitude).

_MAGIC = 1.5 * 2.0 ** 52
_TWO52, _TWO52_BITS = 2.0 ** 52, 0x4330000000000000         # 2^52 and its bits
_TWO64, _SMALLEST_NORMAL = 2.0 ** 64, 2.0 ** -1022
_MAGIC_BITS = 0x4338000000000000            # its bits
_TWO_W = float(1 << W)


def _bitcast(source, target, doc: str):
    """A numba intrinsic that reads a ``source`` value's bits as a ``target`` (which
    vectorises, where a view of an array would not)."""
    @intrinsic
    def bitcast(typingctx, value):
        if value != source:
            return None

        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], context.get_value_type(target))
        return target(source), codegen
    bitcast.__doc__ = doc
    return bitcast


_float_bits = _bitcast(types.float64, types.int64, "The bits of a float64 as an int64.")
_bits_float = _bitcast(types.int64, types.float64, "The float64 whose bits are an int64.")
_float32_bits = _bitcast(types.float32, types.int32, "The bits of a float32 as an int32.")
_bits_float32 = _bitcast(types.int32, types.float32, "The float32 whose bits are an int32.")


@njit(cache=True, nogil=True, inline="always")
def _pow2_pair(e):
    """2^e as two normal powers of two, 2^floor(e/2) and 2^(e - floor(e/2)), -2044 <= e <
    2046: a product by both is exact unless it overflows or falls below float64's subnormals'
    grid. e's half by a logical shift, which vectorises (AVX2 has no 64-bit arithmetic
    shift)."""
    half = np.int64(np.uint64(e + 2048) >> np.uint64(1)) - 1024
    return _bits_float((half + 1023) << 52), _bits_float((e - half + 1023) << 52)


@njit(cache=True, nogil=True, inline="always")
def _window_exponent(t, k):
    """-(G + L), L = (t - k + 1).W the bottom of the window below top code t (the codes of
    zeros and inf/NaN taken as 0)."""
    return -G - (min(max(t, 0), _TOP_CODE) - k + 1) * W


@njit(cache=True, nogil=True, inline="always")
def _scaled(x, t, k):
    """x.2^-(G + L), L the bottom of the window below top code t (0 for an inf/NaN element:
    ``_specials_into`` counts it)."""
    up, up2 = _pow2_pair(_window_exponent(t, k))
    v = np.float64(x) * up * up2
    return 0.0 if t == SPECIAL else v


def _window_table(k: int) -> np.ndarray:
    """Per bin code c (row c & 255), the powers of two of its window (``_pow2_pair``'s
    factors): 2^-(G + L) as columns 0 and 1 (column 0 is 0 for inf/NaN: their slices are
    ``_specials_into``'s), 2^(G + L) as columns 2 and 3 (column 2 NaN where the float
    rounding can't use it: zeros' and inf/NaN's codes, a window below the grid). L the
    window's bottom, K = k. Looked up, which took half the time of computing them per
    element."""
    table = _WINDOW_TABLES.get(k)
    if table is None:
        table = np.empty((256, 4))
        for c in range(256):
            t = c - 256 if c > SPECIAL else c
            e = _window_exponent.py_func(t, k)
            half = e // 2
            up, up2 = 2.0 ** half, 2.0 ** (e - half)
            down, down2 = 2.0 ** -half, 2.0 ** (half - e)
            usable = k - 1 <= t <= _TOP_CODE
            table[c] = (0.0 if t == SPECIAL else up, up2, down if usable else np.nan, down2)
        table = _WINDOW_TABLES[k] = table
    return table


_WINDOW_TABLES: dict = {}


@njit(cache=True, nogil=True)
def _window_scales_into(top, table, up, up2, down, down2):
    """Per element, 2^-(G + L) as up.up2 and 2^(G + L) as down.down2 (``_window_table``'s
    columns 0-3 for its top code), L the bottom of its window: a loop of its own (inline in
    the slicing, computing them took twice as long)."""
    for i in range(top.shape[0]):
        c = np.int64(top[i]) & 255
        up[i], up2[i], down[i], down2[i] = table[c, 0], table[c, 1], table[c, 2], table[c, 3]


@njit(cache=True, nogil=True, inline="always")
def _digits_into(v, out, at, step, scales, add):
    """The k slices of scaled value v (``_scaled``) into out[at + j * step], j = 0..k-1."""
    above = 0.0
    for j in range(len(scales) - 2, -1, -1):
        whole = np.trunc(v * scales[j])
        value = _float_bits(whole - above * _TWO_W + _MAGIC) - _MAGIC_BITS
        out[at + j * step] = out[at + j * step] + value if add else value
        above = whole


@njit(cache=True, nogil=True)
def _float_block(x, top, out, step, scales, add):
    """The slices of one block of float values ``x`` (n, codes ``top``) into ``out``: slice j
    of element i at out[j * step + i]; ``scales`` = 2^-jW for j = 0..k (its length fixes k
    when compiled). step == n (a whole block) is a loop of its own, which vectorises."""
    k = len(scales) - 1
    n = top.shape[0]
    if step == n:
        for i in range(n):
            _digits_into(_scaled(x[i], np.int64(top[i]), k), out, i, n, scales, add)
    else:
        for i in range(n):
            _digits_into(_scaled(x[i], np.int64(top[i]), k), out, i, step, scales, add)


@njit(cache=True, nogil=True)
def _float_chunk_into(x, up, up2, out, scales, add):
    """The slices of float values x (scales 2^-(G + L) = up.up2, ``_window_scales_into``) into
    out: slice j of element i at out[j * n + i]."""
    n = x.shape[0]
    for i in range(n):
        _digits_into(np.float64(x[i]) * up[i] * up2[i], out, i, n, scales, add)


@njit(cache=True, nogil=True)
def _float_slices_into(x, rows, top, scales, out, block, stride, accumulate):
    """``_slices_into`` for float32/float64 values ``x`` (not their bits)."""
    k = len(scales) - 1
    n = top.shape[0]
    for r in range(rows):
        add = accumulate or r > 0
        for blk in range((n + block - 1) // block):
            lo, hi = blk * block, min((blk + 1) * block, n)
            at = blk * stride
            _float_block(x[r * n + lo:r * n + hi], top[lo:hi],
                         out[at:at + (k - 1) * block + hi - lo], block, scales, add)


@njit(cache=True, nogil=True)
def _specials_into(bits, rows, mb, eb, top, k, out, block, stride, row_stride=-1):
    """For the elements whose top code is SPECIAL: count this rank's +inf (slice 0), -inf
    (slice 1) and NaN (2^31 in both) instead of slices (row r of the values at
    bits[r * row_stride], top.size by default)."""
    n = top.shape[0]
    row_stride = n if row_stride < 0 else row_stride
    emask = (1 << eb) - 1
    mmask = (1 << mb) - 1
    for i in range(n):
        if top[i] != SPECIAL:
            continue
        at = (i // block) * stride + i % block
        for j in range(k):
            out[at + j * block] = 0
        for r in range(rows):
            b = np.int64(bits[r * row_stride + i])
            if (b >> mb) & emask != emask:
                continue
            if b & mmask:
                out[at] += _NAN_UNIT
                out[at + block] += _NAN_UNIT
            elif b < 0:
                out[at + block] += 1
            else:
                out[at] += 1


@njit(cache=True, nogil=True)
def _shift_into(codes, limbs, top, k, out, block, stride, accumulate):
    """Re-express slices taken below ``codes`` (a partial sum's own top bins; ``limbs`` one
    block, slice-major: element i's slice j at limbs[j * n + i]) below ``top`` (>= codes,
    element-wise), into ``out`` laid out as in ``_slices_into``: slices of bins under the new
    window are dropped whole."""
    n = top.shape[0]
    for i in range(n):
        at = (i // block) * stride + i % block
        c, t = np.int64(codes[i]), np.int64(top[i])
        for j in range(k):
            v = 0
            if c == SPECIAL:
                v = limbs[j * n + i]
            elif c >= 0 and t != SPECIAL:
                d = t - c
                if j + d < k:
                    v = limbs[(j + d) * n + i]
            if accumulate:
                out[at + j * block] += v
            else:
                out[at + j * block] = v


@njit(cache=True, nogil=True, inline="always")
def _round_one(limbs, at, step, c, k, p, g, pow2, scratch):
    """The slice sums at limbs[at + j * step] (top bin c) as one number rounded once to p
    significant bits, nearest-even, exponent >= g (the format's subnormals): q.2^e with
    q <= 2^p, exact in float64 (pow2[e - G] = 2^e, inf above float64's range), so a cast to the
    format after is exact too, or overflows to inf as it should."""
    wmask = (1 << W) - 1
    if c == SPECIAL:
        nan = limbs[at] >> 31
        pinf = limbs[at] & (_NAN_UNIT - 1)
        ninf = limbs[at + step] & (_NAN_UNIT - 1)
        if nan or (pinf and ninf):
            return np.nan
        return np.inf if pinf else -np.inf
    if c < 0:
        return -0.0 if c == MINUS_ZERO else 0.0
    # Phase 1: carry into k + 1 digits of W bits and a sign.
    carry = 0
    for j in range(k):
        v = limbs[at + j * step] + carry
        carry = v >> W
        scratch[j] = v - (carry << W)
    v = carry
    carry = v >> W
    scratch[k] = v - (carry << W)
    negative = carry < 0
    flip = wmask if negative else 0    # magnitude: two's complement (no branches)
    one = 1 if negative else 0
    for j in range(k + 1):
        v = (scratch[j] ^ flip) + one
        scratch[j] = v & wmask
        one = v >> W
    h = k
    while h >= 0 and scratch[h] == 0:
        h -= 1
    if h < 0:
        return 0.0                      # an exact cancellation: +0
    # Phase 2: the 62 bits from the leading one (win), and whether any below is set.
    a = scratch[h]
    bl = _bitlen(a)
    b = scratch[h - 1] if h >= 1 else 0
    c2 = scratch[h - 2] if h >= 2 else 0
    s = 62 - bl                         # bits taken after a's: 22..61
    t1 = W - s                          # b's bits below win: -21..18
    t2 = 2 * W - s                      # c2's: 19..58
    win = (a << s) | ((b >> t1) if t1 >= 0 else (b << -t1)) | (c2 >> t2)
    below = (b & ((1 << max(t1, 0)) - 1)) | (c2 & ((1 << t2) - 1))
    for j in range(h - 2):
        below |= scratch[j]
    # Phase 3: round win (bit 0 of weight 2^ew) to p bits, exponent at least g.
    ew = G + (c - k + 1 + h) * W + bl - 62
    e = max(ew + 61 - (p - 1), g)
    drop = e - ew                       # >= 62 - p >= 9
    if drop >= 63:                      # below half the smallest subnormal
        return -0.0 if negative else 0.0
    q = win >> drop
    rem = win & ((1 << drop) - 1)
    half = 1 << (drop - 1)
    q += (rem > half) | ((rem == half) & ((below != 0) | ((q & 1) != 0)))
    value = np.float64(q) * pow2[e - G]
    return -value if negative else value


@njit(cache=True, nogil=True)
def _round_into(limbs, top, k, p, g, pow2, out, block, stride, scratch):
    """out[i] = element i's slice sums (laid out as in ``_slices_into``) rounded once
    (``_round_one``)."""
    n = top.shape[0]
    for blk in range((n + block - 1) // block):
        lo = blk * block
        for i in range(lo, min(lo + block, n)):
            out[i] = _round_one(limbs, blk * stride + i - lo, block, np.int64(top[i]), k, p,
                                g, pow2, scratch)


@njit(cache=True, nogil=True)
def _round_fast_into(limbs, top, k, p, g, drop, pow2, out, block, stride, scratch):
    """``_round_into``'s bits for float64 (p = 53, g = -1074, drop = 0) and float32 (24, -149,
    10) ``out``, fast: the slice sums carried into one signed top digit over k - 1 digits in
    [0, 2^W); where the top digit holds the leading bit (no cancellation of the top bin), the 62
    bits from it are rounded to odd (floor, then the lowest bit or-ed with every bit below: M),
    which keeps the one rounding to p <= 60 bits after it exact (Boldo and Melquiond's round to
    odd): float64(M) rounds M to nearest even (float64), or M is rounded to odd again to 52 bits
    (drop = 10), converted exactly and cast to float32; the scaling by 2^e is exact while the
    result is a normal float64 and overflows to inf as IEEE's. Else (a cancelled top digit,
    results near float64's subnormals, zeros, specials) ``_round_one``."""
    n = top.shape[0]
    wmask = (1 << W) - 1
    for blk in range((n + block - 1) // block):
        lo = blk * block
        for i in range(lo, min(lo + block, n)):
            at = blk * stride + i - lo
            c = np.int64(top[i])
            # Phase 1: carry; keep the two digits under the top one and whether any below is set.
            carry = below = low = mid = 0
            for j in range(k - 1):
                v = limbs[at + j * block] + carry
                carry = v >> W
                below |= low
                low = mid
                mid = v & wmask
            head = limbs[at + (k - 1) * block] + carry
            bl = _bitlen(head ^ (head >> 63))           # its bits but the sign (0 for 0, -1)
            s = 62 - bl                                 # head's bits move up by s
            if not (0 <= c <= _TOP_CODE and 1 <= bl <= 62 and c * W - s + drop >= 52):
                out[i] = _round_one(limbs, at, block, c, k, p, g, pow2, scratch)
                continue
            # Phase 2: floor(sum / 2^(e - L)), e = G + cW - s, in 62 bits, and its sticky bit.
            t1 = W - s                                  # mid's bits below the window: -21..40
            t2 = min(2 * W - s, W)                      # low's: 19..40
            if t1 >= 0:
                win, rest = (head << s) | (mid >> t1), mid & ((1 << t1) - 1)
            else:
                win, rest = (head << s) | (mid << -t1), 0
            win |= low >> t2
            rest |= (low & ((1 << t2) - 1)) | below
            odd = win | (rest != 0)                     # rounded to odd
            odd = (odd >> drop) | ((odd & ((1 << drop) - 1)) != 0)
            out[i] = np.float64(odd) * pow2[c * W - s + drop]


# Rounding by float arithmetic, which vectorises (``_round_fast_into`` carries with 64-bit
# arithmetic shifts, which AVX2 has not): for K = 3 into float64, and K = 2 into float64 or
# float32 (the defaults). Each slice sum, below 2^51 in magnitude (else the exact path), is a
# float64 exactly (the 1.5.2^52 trick backwards) and so is its scaling by 2^jW: the sum is
# taken in units of 2^L (L the window's bottom) and scaled once at the end, exact where the
# result is a normal float64. Two values: their float64 sum is the one rounding (float64), or
# TwoSum gives it and its exact error, and the last bit set odd where the error is not 0 is the
# sum rounded to odd, which float32() rounds to nearest even exactly (53 >= 24 + 2 bits: Boldo
# and Melquiond). Three values: Boldo and Melquiond's correctly rounded sum of three,
# RN(th + RO(tl + ul)) with (uh, ul) = TwoSum(b, c), (th, tl) = TwoSum(a, uh) ("Emulation of
# FMA and correctly rounded sums: proved algorithms using rounding to odd", IEEE TC 57(4),
# 2008). Elsewhere (zeros, inf/NaN, larger sums, overflow, results below 2^-900)
# ``_round_one``; tests/unit/test_reproducible.py checks every case against it.

_ODD_LIMIT = float(1 << 51)     # slice sums below this are float64s exactly (_as_float)
_CHUNK = 512        # elements per chunk of the float rounding and the fused sum of rows (the
                    # slice sums of a chunk: 12 KiB at K = 3)
_TINY = 2.0 ** -900


@njit(cache=True, nogil=True, inline="always")
def _as_float(s):
    """The int64 s, |s| < 2^51, as a float64 (exact)."""
    return _bits_float(s + _MAGIC_BITS) - _MAGIC


@njit(cache=True, nogil=True, inline="always")
def _two_sum(a, b):
    """(RN(a + b), a + b - RN(a + b)): Knuth's TwoSum, exact (no overflow)."""
    s = a + b
    back = s - a
    return s, (a - (s - back)) + (b - back)


@njit(cache=True, nogil=True, inline="always")
def _to_odd(s, e):
    """s + e rounded to odd, from s = RN(s + e) and its exact error e: s, or where e != 0 and
    s's last bit is even its neighbour towards s + e (one step of the bit pattern)."""
    sb = _float_bits(s)
    step = np.int64(1) if (sb ^ _float_bits(e)) >= 0 else np.int64(-1)
    return _bits_float(sb + (step if (e != 0.0) & ((sb & 1) == 0) else np.int64(0)))


@njit(cache=True, nogil=True, inline="always")
def _float_rounding(s0, s1, s2, k, p, down, down2):
    """An element's slice sums s0, s1 (and s2 for k = 3) rounded by float arithmetic (the
    comment above), and whether that is valid (else ``_round_one``). The sums are added in
    units of 2^L, L the window's bottom, where every term and every error is an integer
    (nothing underflows), and the result is scaled once by 2^L = down.down2 (NaN for a top
    code with no such window: zeros, inf/NaN, a window below the grid): exact
    where it is a normal float64 (here |result| >= 2^-900) or 0 (an exact cancellation). A
    slice sum of 2^51 or more reads as a float64 of 2^51 or more, or NaN (``_as_float``)."""
    x0, x1 = _as_float(s0), _as_float(s1)
    ok = (abs(x0) < _ODD_LIMIT) & (abs(x1) < _ODD_LIMIT)
    x1 *= _TWO_W
    if k == 2:
        if p == 53:
            u = x1 + x0
        else:
            s, e = _two_sum(x1, x0)
            u = _to_odd(s, e)
    else:
        x2 = _as_float(s2)
        ok &= abs(x2) < _ODD_LIMIT
        x2 *= _TWO_W * _TWO_W
        uh, ul = _two_sum(x1, x0)
        th, tl = _two_sum(x2, uh)
        s, e = _two_sum(tl, ul)
        u = th + _to_odd(s, e)
    z = u * down * down2
    if p == 24:
        z = np.float64(np.float32(z))
    return z, ok & (abs(z) < np.inf) & ((u == 0.0) | (abs(z) >= _TINY))


@njit(cache=True, nogil=True, inline="always")
def _float_rounding_at(limbs, at, step, i, top, k, p, down, down2):
    """``_float_rounding`` of element i of a chunk whose slice j is at limbs[at + j * step]."""
    return _float_rounding(limbs[at + i], limbs[at + step + i],
                           limbs[at + 2 * step + i] if k == 3 else 0, k, p, down[i], down2[i])


@njit(cache=True, nogil=True)
def _round_float_chunk(limbs, at, step, top, k, p, g, pow2, down, down2, out, scratch):
    """out[i] = element i (of top.size, slice j at limbs[at + j * step]) rounded once:
    ``_float_rounding``, one loop per (k, p) over contiguous slices, vectorised (a flag per
    element stored in it took 1.7x as long: only whether all were valid is kept), then, where
    one was not, ``_round_one`` for those."""
    m = top.shape[0]
    s0, s1 = limbs[at:at + m], limbs[at + step:at + step + m]
    valid = True
    if k == 2 and p == 53:
        for i in range(m):
            out[i], ok = _float_rounding(s0[i], s1[i], 0, 2, 53, down[i], down2[i])
            valid &= ok
    elif k == 2:
        for i in range(m):
            out[i], ok = _float_rounding(s0[i], s1[i], 0, 2, 24, down[i], down2[i])
            valid &= ok
    else:
        s2 = limbs[at + 2 * step:at + 2 * step + m]
        for i in range(m):
            out[i], ok = _float_rounding(s0[i], s1[i], s2[i], 3, 53, down[i], down2[i])
            valid &= ok
    if not valid:
        for i in range(m):
            if not _float_rounding_at(limbs, at, step, i, top, k, p, down, down2)[1]:
                out[i] = _round_one(limbs, at + i, step, np.int64(top[i]), k, p, g, pow2,
                                    scratch)


@njit(cache=True, nogil=True)
def _round_float_into(limbs, top, k, p, g, pow2, out, block, stride, scratch, chunk, table):
    """``_round_into``'s bits by float arithmetic (the comment above) for k = 3 and p = 53,
    or k = 2 and p = 53 or 24, in chunks of ``chunk`` elements."""
    n = top.shape[0]
    values, up, up2, down, down2 = (np.empty(chunk), np.empty(chunk), np.empty(chunk),
                                    np.empty(chunk), np.empty(chunk))
    for blk in range((n + block - 1) // block):
        lo0, hi0 = blk * block, min((blk + 1) * block, n)
        for lo in range(lo0, hi0, chunk):
            hi = min(lo + chunk, hi0)
            t = top[lo:hi]
            _window_scales_into(t, table, up, up2, down, down2)
            _round_float_chunk(limbs, blk * stride + lo - lo0, block, t, k, p, g, pow2, down,
                               down2, values, scratch)
            for i in range(hi - lo):
                out[lo + i] = values[i]


@njit(cache=True, nogil=True)
def _pair_sums_into(a, b, k, single, out):
    """Two values per element (a[i], b[i]): round(trunc_L(a) + trunc_L(b)), the definition,
    is one IEEE addition of the two values cut at 2^L (toward zero, each exact: a float's
    leading bits), in the output's format (float32 when ``single``): correctly rounded, ties
    to even, subnormals kept, overflow to inf, -0 only from two -0s, as ``_round_one``; NaN
    made the default one. L, the window's bottom, from the larger magnitude's code
    (``_float_code``: the codes grow with the magnitude, so it is the MAX of the two). Float
    arithmetic and selects only: the loop vectorises."""
    for i in range(out.shape[0]):
        x, y = np.float64(a[i]), np.float64(b[i])
        e = _window_exponent(_float_code(max(abs(x), abs(y))), k)
        up, up2 = _pow2_pair(e)
        down, down2 = _pow2_pair(-e)
        xt = np.trunc(x * up * up2) * down * down2
        yt = np.trunc(y * up * up2) * down * down2
        z = np.float64(np.float32(xt) + np.float32(yt)) if single else xt + yt
        out[i] = z if z == z else np.nan


# float32's codes lie in 23..30 (its smallest subnormal to inf/NaN), so for K <= 3 every
# window's powers of two, 2^-(G + L) = 2^(1074 - (t - K + 1)W) and its inverse, are products
# of two normal float32s (|exponent| <= 2 x 117): the two-value sum runs in float32 itself,
# eight lanes wide, its codes clamped to 23 (a zero's window: any does).
_F32_CODES = ((-149 - G) // W, (128 - G) // W)
_F32_PAIR_K = 3
assert all(abs(-G - (t - k + 1) * W) <= 2 * 117 for k in range(K_RANGE[0], _F32_PAIR_K + 1)
           for t in range(_F32_CODES[0], _F32_CODES[1] + 1))


@njit(cache=True, nogil=True)
def _pair_sums32_into(a, b, k, out):
    """``_pair_sums_into`` for float32 and K <= _F32_PAIR_K, in float32 arithmetic (the
    comment above): the same bits, three times faster."""
    for i in range(out.shape[0]):
        x, y = a[i], b[i]
        m = max(abs(x), abs(y))
        subnormal = m < np.float32(2.0 ** -126)
        e = np.int32((_float32_bits(m * np.float32(2.0 ** 32) if subnormal else m) >> 23)
                     - (32 if subnormal else 0))
        t = np.int32((np.int32(e - 127 - G) * np.int32(_PER_W)) >> 16)  # the code, as _float_code
        t = min(max(t, np.int32(_F32_CODES[0])), np.int32(_F32_CODES[1]))
        ex = np.int32(-G - (t - k + 1) * W)
        half = np.int32(ex >> 1)
        up, up2 = _bits_float32(np.int32((half + 127) << 23)), \
            _bits_float32(np.int32((ex - half + 127) << 23))
        down, down2 = _bits_float32(np.int32((127 - half) << 23)), \
            _bits_float32(np.int32((127 - ex + half) << 23))
        z = np.trunc(x * up * up2) * down * down2 + np.trunc(y * up * up2) * down * down2
        out[i] = z if z == z else np.float32(np.nan)


@njit(cache=True, nogil=True)
def _round_rows_into(x, bits, rows, stride, mb, eb, k, p, g, drop, fast, scales, pow2, table,
                     out, top, limbs, values, positive, scratch):
    """out[i] = the reproducible sum of x[r * stride + i] over the ``rows`` rows (i <
    out.size; float32/float64 values, ``bits`` their integer view), rounded once: ``sum`` then
    ``rounded``, the same bits, fused by chunks of top.size elements so the slice sums stay in
    the cache; ``fast``: (k, dtype) is one of ``_FLOAT_ROUNDING``'s. ``top``, ``limbs``
    (k * chunk), ``values``, ``positive``: the chunk's scratch."""
    n, chunk = out.shape[0], top.shape[0]
    up, up2, down, down2 = np.empty(chunk), np.empty(chunk), np.empty(chunk), np.empty(chunk)
    for lo in range(0, n, chunk):
        m = min(chunk, n - lo)
        t, sums = top[:m], limbs[:k * m]
        # Phase 1: the top codes, a MAX over the rows: the code of the largest magnitude (the
        # codes grow with it; a NaN kept as the largest: SPECIAL, as inf), by float compares,
        # which vectorise where int64 MAX does not (AVX2); an all-zero element's code, +0.0
        # if any of its zeros is, from the bits, only in a chunk that has one.
        big = values                                    # (scratch, free until phase 3)
        for i in range(m):
            big[i] = abs(np.float64(x[lo + i]))
        for r in range(1, rows):
            row = x[r * stride + lo:r * stride + lo + m]
            for i in range(m):
                v = abs(np.float64(row[i]))
                big[i] = v if (v > big[i]) | (v != v) else big[i]
        zeros = False
        for i in range(m):
            t[i] = np.int8(_float_code(big[i])) if big[i] < np.inf else np.int8(SPECIAL)
            zeros |= big[i] == 0.0
        if zeros:
            for i in range(m):
                positive[i] = bits[lo + i] >= 0
            for r in range(1, rows):
                row = bits[r * stride + lo:r * stride + lo + m]
                for i in range(m):
                    positive[i] |= row[i] >= 0
            for i in range(m):
                if big[i] == 0.0:
                    t[i] = np.int8(PLUS_ZERO) if positive[i] else np.int8(MINUS_ZERO)
        # Phase 2: the slices, summed over the rows.
        _window_scales_into(t, table, up, up2, down, down2)
        for r in range(rows):
            _float_chunk_into(x[r * stride + lo:r * stride + lo + m], up, up2, sums, scales, r > 0)
        special = False
        for i in range(m):
            special |= t[i] == SPECIAL
        if special:
            _specials_into(bits[lo:], rows, mb, eb, t, k, sums, m, k * m, stride)
        # Phase 3: one rounding.
        if fast:
            _round_float_chunk(sums, 0, m, t, k, p, g, pow2, down, down2, values, scratch)
        else:
            _round_fast_into(sums, t, k, p, g, drop, pow2, values, m, k * m, scratch)
        for i in range(m):
            out[lo + i] = values[i]


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


# ----------------------------------------------------------------------------- collectives

_CODE_DTYPE = {True: np.dtype(np.int32), False: np.dtype(np.int8)}   # shm needs >= 4 bytes


def _options(op, compress, error_feedback):
    from mpi4py import MPI
    if not (op == MPI.SUM if isinstance(op, MPI.Op) else
            isinstance(op, str) and op.lower() == "sum"):
        raise ValueError(f"reproducible=True needs op SUM (MPI.SUM or 'sum'), got {op!r}")
    if compress is not None or error_feedback is not None:
        raise ValueError("reproducible=True can't be combined with compress= or "
                         "error_feedback= (they round on the wire)")


def _input(sendbuf, recvbuf, k, shape_of_recv, in_place_copy=True):
    """``(BinnedSum or array, recv array, k)`` from the caller's buffers (in place: a copy of
    recvbuf, or recvbuf itself with ``in_place_copy=False``)."""
    from mpi4py import MPI
    if isinstance(sendbuf, BinnedSum):
        if k is not None and _k(k, sendbuf.dtype) != sendbuf.k:
            raise ValueError(f"k={k} but the BinnedSum was made with k={sendbuf.k}")
        if recvbuf is None:
            recv = np.empty(shape_of_recv(sendbuf.shape, sendbuf.size), sendbuf.dtype)
        else:
            recv = array(recvbuf, "recvbuf", writable=True)
            if recv.dtype != sendbuf.dtype:
                raise ValueError(f"recvbuf dtype {recv.dtype} does not match the BinnedSum's "
                                 f"{sendbuf.dtype}")
        return sendbuf, recv, sendbuf.k
    if sendbuf is MPI.IN_PLACE:
        if recvbuf is None:
            raise ValueError("sendbuf=MPI.IN_PLACE needs a recvbuf holding the input")
        recv = array(recvbuf, "recvbuf", writable=True)
        send = recv.copy() if in_place_copy else recv
    else:
        send = array(sendbuf, "sendbuf")
        if recvbuf is None:
            recv = np.empty(shape_of_recv(send.shape, send.size), send.dtype)
        else:
            recv = array(recvbuf, "recvbuf", writable=True)
            if recv.dtype != send.dtype:
                raise ValueError(f"recvbuf dtype {recv.dtype} does not match sendbuf dtype "
                                 f"{send.dtype}")
    _format(send.dtype)
    return send, recv, _k(k, send.dtype)


def _local_codes(src, code_dtype) -> np.ndarray:
    if isinstance(src, BinnedSum):
        return src.codes.astype(code_dtype)
    return codes(src, code_dtype)


def _local_slices(src, top, k, *, out=None, block=None, stride=None) -> np.ndarray:
    """This rank's slices below ``top`` (laid out as in ``_slices_into``)."""
    if not isinstance(src, BinnedSum):
        return slices(src, top, k, out=out, block=block, stride=stride)
    if out is None:
        out = np.empty(top.size * k, np.int64)
    block = (top.size or 1) if block is None else block
    stride = block * k if stride is None else stride
    _shift_into(src.codes, src.limbs, top, k, out, block, stride, False)
    return out


def _terms(src) -> int:
    return src.terms if isinstance(src, BinnedSum) else 1


def allreduce(sendbuf, recvbuf=None, *, op="sum", algorithm="auto", comm=None, k=None,
              inner=None, outer=None, order=None, timeout=None, on_timeout=None, validate=None,
              compress=None, error_feedback=None):
    """Reproducible all-reduce (SUM): ``mpicoll.allreduce``'s arguments, and ``sendbuf`` may be
    a ``BinnedSum``; ``k``: slices per value (``DEFAULT_K``). The same bits for the same global
    multiset of values whatever the rank count, algorithm, executor, segments or nodes."""
    from mpi4py import MPI
    import mpicoll as api       # the public functions (api.py dispatches reproducible= here)
    _options(op, compress, error_feedback)
    src, recv, k = _input(sendbuf, recvbuf, k, lambda shape, n: shape)
    if recv.size != src.size:
        raise ValueError(f"recvbuf has {recv.size} elements, expected {src.size}")
    common = dict(comm=comm, timeout=timeout, on_timeout=on_timeout, validate=validate)
    explicit = dict(inner=inner, outer=outer, order=order) if algorithm != "auto" else {}
    code_dtype = _CODE_DTYPE[algorithm == "shm" or inner == "shm"]
    n, dtype = src.size, recv.dtype
    # Phase 1: every element's top bin.
    top = api.allreduce(_local_codes(src, code_dtype), op=MPI.MAX, algorithm=algorithm,
                        **explicit, **common)
    size = (comm or MPI.COMM_WORLD).Get_size()
    terms = _terms(src)
    large = _large(algorithm, size, src, k)
    if large and SPLIT != "never" and (SPLIT == "always" or _across_nodes(comm)):
        # Phase 2 (large, several nodes): reduce-scatter the slices (each block ends with the
        # term count), round this rank's block, all-gather the floats.
        block = -(-n // size)
        stride = block * k + 1
        buf = np.zeros(size * stride, np.int64)
        buf[stride - 1::stride] = terms
        _local_slices(src, top, k, out=buf, block=block, stride=stride)
        mine = api.reduce_scatter_block(buf, algorithm="auto", **common)
        _check_terms(int(mine[-1]))
        return _rounded_blocks(mine, block, top, k, recv, comm, common)
    # Phase 2: one all-reduce of the slices and the term count, with the caller's algorithm.
    buf = np.empty(n * k + 1, np.int64)
    _local_slices(src, top, k, out=buf[:n * k])
    buf[-1] = terms
    api.allreduce(MPI.IN_PLACE, buf, op=MPI.SUM, algorithm=algorithm, **explicit, **common)
    _check_terms(int(buf[-1]))
    # Phase 3: one rounding; auto, large: each rank rounds its block, then an all-gather.
    if large:
        rank = (comm or MPI.COMM_WORLD).Get_rank()
        lo = min(rank * -(-n // size), n)
        return _rounded_blocks(buf[lo:], n, top, k, recv, comm, common)
    rounded(buf, top, k, dtype, out=recv.reshape(-1))
    return recv


def _rounded_blocks(limbs, step, top, k, recv, comm, common):
    """``auto``, large (the module's nested calls): this rank rounds its block of the n
    elements, whose slice sums are ``limbs`` (slice j of its element i at limbs[j * step + i]),
    then the floats are all-gathered into ``recv``; returns ``recv``."""
    from mpi4py import MPI
    import mpicoll as api
    comm = comm or MPI.COMM_WORLD
    n, size, rank = recv.size, comm.Get_size(), comm.Get_rank()
    block = -(-n // size)
    lo, hi = min(rank * block, n), min((rank + 1) * block, n)
    floats = np.zeros(size * block, recv.dtype)
    rounded(limbs, top[lo:hi], k, recv.dtype, block=step, out=floats[lo:hi])
    api.allgather(MPI.IN_PLACE, floats, algorithm="auto", **common)
    np.copyto(recv.reshape(-1), floats[:n])
    return recv


def _large(algorithm, size: int, src, k: int) -> bool:
    """Whether ``auto`` splits the work by blocks, each rank rounding its own (more than
    ``SPLIT_BYTES`` of slices per rank; an array's values then travel by the exchange)."""
    return algorithm == "auto" and size > 1 and src.size * k * 8 > SPLIT_BYTES


def _across_nodes(comm) -> bool:
    """Whether the ranks span several nodes (then ``auto`` splits the slices' sum: fewer bytes
    cross the network; on one node the shared-memory all-reduce of the slices is faster)."""
    from mpi4py import MPI
    from ._runtime.context import state
    return len(state(comm or MPI.COMM_WORLD).real_nodes) > 1


def reduce_scatter_block(sendbuf, recvbuf=None, *, op="sum", algorithm="auto", comm=None,
                         k=None, timeout=None, on_timeout=None, validate=None):
    """Reproducible reduce-scatter (SUM): ``mpicoll.reduce_scatter_block``'s arguments, and
    ``sendbuf`` may be a ``BinnedSum``; rank r gets block r of the reproducible sum."""
    from mpi4py import MPI
    import mpicoll as api
    _options(op, None, None)
    size = (comm or MPI.COMM_WORLD).Get_size()

    def block_shape(shape, total):
        return shape[1:] if len(shape) > 1 and shape[0] == size else (total // size,)

    src, recv, k = _input(sendbuf, recvbuf, k, block_shape)
    if src.size % size:
        raise ValueError(f"sendbuf has {src.size} elements, not a multiple of the "
                         f"communicator size {size}")
    n = src.size // size
    if recv.size != n:
        raise ValueError(f"recvbuf has {recv.size} elements, expected {n}")
    common = dict(comm=comm, timeout=timeout, on_timeout=on_timeout, validate=validate)
    top = api.allreduce(_local_codes(src, np.int8), op=MPI.MAX, algorithm="auto", **common)
    stride = n * k + 1
    buf = np.zeros(size * stride, np.int64)
    buf[stride - 1::stride] = _terms(src)
    _local_slices(src, top, k, out=buf, block=n or 1, stride=stride)
    mine = api.reduce_scatter_block(buf, algorithm=algorithm, **common)
    _check_terms(int(mine[-1]))
    rank = (comm or MPI.COMM_WORLD).Get_rank()
    np.copyto(recv.reshape(-1), rounded(mine, top[rank * n:(rank + 1) * n], k, recv.dtype))
    return recv


# ----------------------------------------------------------------------------- every form

def spelled(reproducible):
    """``reproducible=True`` (None: the default K) or an int K, checked (TypeError)."""
    if reproducible is True:
        return None
    if type(reproducible) is not int:
        raise TypeError(f"reproducible must be True, False or an int K (slices per value), "
                        f"got {reproducible!r}")
    return reproducible


class Job:
    """One reproducible SUM bound to its buffers, for the forms that run it later: nonblocking
    (``iallreduce``, ``ireduce_scatter_block``), persistent (``*_init``) and ``Buckets``.

    Made inside the form's ``Call``: this rank's checks first (op SUM, a float dtype, K in
    ``K_RANGE``, no compression; a schedule, not the MPI library's or the shared-memory
    collective: ``NotImplementedError`` naming the form), then two plans (``mpicoll.plan``,
    ``reproducible=K``, one of mpicoll's schedules): the MAX of the bin codes (an all-reduce,
    int8) and the SUM of the slices (the call's own collective, int64: ``plan``), then one
    agreement of the call's signature -- the caller's dtype and count, the SUM's algorithm,
    options and executor, and K -- so a rank with ``reproducible=`` and one without (or another
    K) raise ``ArgumentMismatch``. Both phases run under the call's tag, one after the other
    (MPI's messages between two ranks on one tag arrive in order). ``run(watch)`` is the whole
    call: codes, MAX, slices, SUM, one rounding into recvbuf -- the same function of the values'
    multiset as the blocking call's, so the same bits. ``auto`` on a large array instead runs
    the exchange path (``_init_exchange``): the values' pairwise exchange, each rank's block
    summed and rounded by ``rounded_rows``, and for the all-reduce an all-gather of the
    floats; for a float32/float64 all-reduce on one node, the window path (``_init_window``)."""

    def __init__(self, call, collective: str, sendbuf, recvbuf, *, op, k, algorithm="auto",
                 given=None, form: str = "nonblocking", compress=None, error_feedback=None,
                 pool: dict | None = None):
        def take(count, dtype):         # every element is written before it is read (run)
            spare = pool.pop((count, np.dtype(dtype)), None) if pool is not None else None
            return spare if spare is not None else np.empty(count, dtype)
        from . import plan
        from .buffers import Layout
        from .registry import lookup
        given = {key: v for key, v in (given or {}).items() if v is not None}
        _options(op, compress, error_feedback)
        algo = None if algorithm == "auto" else lookup(collective, algorithm)
        if (algo is not None and (algo.library or algo.has("shared-memory"))) \
                or given.get("inner") == "shm":
            what = f"inner='shm'" if algo is None or not (algo.library or algo.has(
                "shared-memory")) else f"algorithm={algorithm!r}"
            raise NotImplementedError(
                f"reproducible=True in the {form} form of {collective} runs on one of "
                f"mpicoll's schedules, not {what} (the MPI library's or the shared-memory "
                f"collective); pick another algorithm, or the blocking call")
        size, rank = call.comm.Get_size(), call.comm.Get_rank()
        if collective == "allreduce":
            src, recv, k = _input(sendbuf, recvbuf, k, lambda shape, n: shape, False)
            if recv.size != src.size:
                raise ValueError(f"recvbuf has {recv.size} elements, expected {src.size}")
            n = block = src.size
            # auto, large: each rank rounds a block of n/N elements, then the floats are
            # all-gathered. The values of its block come to it from every rank by a pairwise
            # exchange (``exchange``: the plain all-reduce's bytes), or a BinnedSum's slices by
            # a reduce-scatter; small, or an explicit algorithm: one all-reduce of the slices
            split = _large(algorithm, size, src, k)
            exchange = split and not isinstance(src, BinnedSum)
            window = exchange and _on_window(call, src.dtype, src.nbytes)
            blk = -(-n // size) if split else n
            stride = blk * k + 1
            sums = None if exchange else take(size * stride if split else stride, np.int64)
            # the floats are gathered into recvbuf itself where its blocks are whole
            direct = split and size * blk == n and recv.flags.c_contiguous
            self.floats = None if window or not split else recv.reshape(-1) if direct else \
                take(size * blk, recv.dtype)
            self.blk, self.direct = blk, direct
        else:
            def block_shape(shape, total):
                return shape[1:] if len(shape) > 1 and shape[0] == size else (total // size,)
            src, recv, k = _input(sendbuf, recvbuf, k, block_shape, False)
            if src.size % size:
                raise ValueError(f"sendbuf has {src.size} elements, not a multiple of the "
                                 f"communicator size {size}")
            n = block = src.size // size
            if src is not recv and recv.size != n:
                raise ValueError(f"recvbuf has {recv.size} elements, expected {n}")
            # auto, large, an array: block r's values go to rank r by the pairwise exchange,
            # and each rank sums its block's rows (as the all-reduce's exchange path)
            exchange = _large(algorithm, size, src, k) and not isinstance(src, BinnedSum)
            window = False
            stride = n * k + 1
            sums = None if exchange else take(size * stride, np.int64)
            self.floats, self.direct, self.blk = None, False, n
        self.collective, self.k, self.dtype, self.size, self.rank = collective, k, recv.dtype, \
            size, rank
        self.src, self.recv, self.n, self.stride = src, recv, n, stride
        self.out = recv.reshape(-1)[:n]         # in place: recvbuf's first block
        self.values, self.window = None, False
        self.layout = Layout(recv.reshape(-1), (), (), recv, None, recv, block)
        if window:
            self.codes = self.sums = None
            self._init_window(call)
            return
        if exchange:
            # this rank's values (padded to N blocks), then every rank's values of this rank's
            # block, one row per rank; the codes and slices of rows where not fused
            fused = src.dtype in _FLOAT_KERNELS
            self.values = take(2 * size * self.blk, src.dtype)
            sums = take(0 if fused else self.blk * k, np.int64)
            self.codes = take(0 if fused else size * self.blk, np.int8)
        else:
            self.codes = take(src.size, np.int8)        # the codes of the values (the MAX's)
        self.sums = sums
        if self.values is not None:
            self._init_exchange(call)
            return

        def whole(a):
            return Layout(a, (), (), a, None, a, a.size)
        split = collective == "allreduce" and self.floats is not None
        self.split = split
        sums_layout = whole(sums) if collective == "allreduce" and not split else \
            Layout(sums, (), (), sums, None, sums, stride)
        self.plan = p = plan.make(call, "reduce_scatter_block" if split else collective,
                                  algorithm, sums_layout, op="sum", given=given,
                                  form="persistent", reproducible=k)
        g = None if not split else plan.make(
            call, "allgather", "auto", Layout(self.floats, (), (), self.floats, None,
                                              self.floats, self.blk),
            form="persistent", reproducible=k)
        max_algo = p.algorithm.name if collective == "allreduce" and not split else "auto"
        max_given = given if collective == "allreduce" and not split else {}
        self.max_plan = q = plan.make(call, "allreduce", max_algo, whole(self.codes), op="max",
                                      given=max_given, form="persistent", reproducible=k)
        call.open().last_plan = p
        phases = (p, q) if g is None else (p, q, g)
        prepared = {id(x): plan.prepare(call, x) for x in phases if x.kind == "schedule"}
        p.agree(call, dtype=self.dtype, count=block)
        self._max = None if q.kind != "schedule" else plan.bound(call, q, prepared[id(q)],
                                                                 self.codes)
        self._sum = None if p.kind != "schedule" else plan.bound(call, p, prepared[id(p)], sums)
        self._gather = None if g is None or g.kind != "schedule" else plan.bound(
            call, g, prepared[id(g)], self.floats)

    def _init_exchange(self, call) -> None:
        """The exchange path's pieces: the pairwise exchange of values (a schedule no plan
        names: ``alltoall_pairwise``) and, for the all-reduce, the all-gather of the rounded
        floats; one agreement, algorithm ``exchange`` (a rank that passed a ``BinnedSum`` runs
        the slices' reduce-scatter instead: the two raise ``ArgumentMismatch``)."""
        from . import plan
        from .buffers import Layout
        size, rank, blk = self.size, self.rank, self.blk
        _check_terms(size)                      # (one value per rank and element)
        g = None
        if self.collective == "allreduce":
            g = plan.make(call, "allgather", "auto", Layout(self.floats, (), (), self.floats,
                                                            None, self.floats, blk),
                          form="persistent", reproducible=self.k)
        sched, internode = _exchange_schedule(rank, size, blk, call.open().nodes())
        exchange = plan.prepared_schedule(call, sched, internode, None, self.values.dtype)
        prepared = plan.prepare(call, g) if g is not None and g.kind == "schedule" else None
        if g is not None:
            call.open().last_plan = self.plan = g
            fields = g.fields()
        else:
            self.plan = _Described(f"exchange reproducible={self.k}")
            fields = {"reproducible": self.k, **plan.schedule_fields()}
        call.agree("exchange", **{**fields, "op": "sum", "dtype": self.dtype, "count": self.n})
        self._exchange = plan.bound(call, None, exchange, self.values)
        self._gather = None if prepared is None else plan.bound(call, g, prepared, self.floats)

    def _init_window(self, call) -> None:
        """The one-node path (``_on_window``): no schedule, ``shm``'s window; one agreement,
        algorithm ``window`` (its hash also goes beside each rank's values in the window)."""
        from . import plan, shm
        shm.warmup(self.dtype)
        _check_terms(self.size)
        call.open().last_plan = self.plan = _Described(
            f"window reproducible={self.k}", "shared", "window", reproducible=self.k,
            executor="shm", op="sum", dtype=self.dtype, count=self.n)
        self.plan.agree(call)
        self._call, self.window = call, True

    def _run_window(self, watch, call=None) -> None:
        """Every rank's values in the window (shm's Phase 1), this rank's slice of each chunk
        summed over the ranks' rows and rounded (``rounded_rows``: the values' function, as
        the exchange's), the slices copied out (Phase 3)."""
        from . import plan
        from .shm import transport
        size, k, call = self.size, self.k, call or self._call

        def rows(x, stride, out):
            rounded_rows(x, size, k, out, stride=stride)
        transport.allreduce(call.open(), self.src.reshape(-1), self.recv.reshape(-1), "sum",
                            watch, *plan.shm_signature(call), tag=call.tag, rows=rows)

    def _run_exchange(self, watch, tag=None) -> None:
        """The exchange path (``__init__``): values out by blocks, this rank's block's sum
        rounded (the local ``sum`` of the N rows: the same function of the values); for the
        all-reduce, the floats all-gathered."""
        size, rank, blk, k = self.size, self.rank, self.blk, self.k
        mine, rows = self.values[:size * blk], self.values[size * blk:]
        mine[:self.src.size] = self.src.reshape(-1)
        mine[self.src.size:] = 0                        # (the all-reduce's last block)
        self._exchange(watch, tag)
        own = mine[rank * blk:(rank + 1) * blk]
        out = self.out if self.floats is None else self.floats[rank * blk:(rank + 1) * blk]
        if _in_pairs(size, self.dtype):                   # (the own row read in place)
            rounded_pair(own, rows[(1 - rank) * blk:(2 - rank) * blk], k, out)
        else:
            rows[rank * blk:(rank + 1) * blk] = own
            rounded_rows(rows, size, k, out, codes=self.codes, limbs=self.sums)
        if self._gather is not None:
            self._gather(watch, tag)
        if self.floats is not None and not self.direct:
            np.copyto(self.recv.reshape(-1), self.floats[:self.n])

    @property
    def result(self):
        return self.recv

    def release(self, pool: dict) -> None:
        """Give the job's buffers to ``pool`` (a blocking call's or a request's, done): the next
        one of the same size takes them instead of faulting in fresh pages (the slices are
        K x 8/s times the data). Requests in flight together each take their own."""
        if len(pool) > 8:
            pool.clear()
        for a in (self.codes, self.sums, None if self.direct else self.floats, self.values):
            if a is not None:
                pool[(a.size, a.dtype)] = a

    def run(self, watch, call=None) -> None:
        """The whole call (see the class's doc), under ``watch``; ``call``: the one that runs
        it, if not the one it was made in (``Buckets`` start theirs again each step, each time
        in a new call: its tag, and in the window its signature's hash)."""
        tag = None if call is None else call.tag
        if self.window:
            return self._run_window(watch, call)
        if self.values is not None:
            return self._run_exchange(watch, tag)
        src, top, sums, k, n = self.src, self.codes, self.sums, self.k, self.n
        if isinstance(src, BinnedSum):
            top[...] = src.codes
        else:
            mb, eb, view = _format(src.dtype)
            _codes_into(src.reshape(-1).view(view), mb, eb, top)
        if self._max is not None:
            self._max(watch, tag)
        if self.split:
            stride, blk, rank = self.stride, self.blk, self.rank
            sums[stride - 1::stride] = _terms(src)
            for r in range(n // blk, self.size):        # the last blocks' missing elements
                held = min(max(n - r * blk, 0), blk)
                sums[r * stride:r * stride + k * blk].reshape(k, blk)[:, held:] = 0
            _local_slices(src, top, k, out=sums, block=blk, stride=stride)
            if self._sum is not None:
                self._sum(watch, tag)
            mine = sums[rank * stride:(rank + 1) * stride]
            _check_terms(int(mine[-1]))
            lo, hi = min(rank * blk, n), min((rank + 1) * blk, n)
            rounded(mine, top[lo:hi], k, self.dtype, block=blk,
                    out=self.floats[rank * blk:rank * blk + hi - lo])
            if self._gather is not None:
                self._gather(watch, tag)
            if not self.direct:
                np.copyto(self.recv.reshape(-1), self.floats[:n])
            return
        if self.collective == "allreduce":
            _local_slices(src, top, k, out=sums[:n * k])
            sums[-1] = _terms(src)
            if self._sum is not None:
                self._sum(watch, tag)
            _check_terms(int(sums[-1]))
            rounded(sums, top, k, self.dtype, out=self.recv.reshape(-1))
            return
        stride, lo = self.stride, self.rank * self.n
        sums[stride - 1::stride] = _terms(src)
        _local_slices(src, top, k, out=sums, block=n or 1, stride=stride)
        if self._sum is not None:
            self._sum(watch, tag)
        mine = sums[self.rank * stride:(self.rank + 1) * stride]
        _check_terms(int(mine[-1]))
        rounded(mine, top[lo:lo + n], k, self.dtype, out=self.out)


def _on_window(call, dtype, nbytes: int) -> bool:
    """Whether a large all-reduce of ``nbytes`` runs through ``shm``'s window (``WINDOW``):
    float32/float64 (the fused rows), every rank on one node where shm can run, and a window
    (two segments per rank) of at most a quarter of the file system it lives in -- a container's
    64 MB /dev/shm holds no 8 ranks' 4 MiB segments -- the same answer on every rank: the
    layout, the dtype, the setting and that file system's size are."""
    from . import shm
    from .shm import window
    if not (WINDOW and dtype in _FLOAT_KERNELS and shm.usable(call.open(), "sum", dtype)):
        return False
    return 4 * window.footprint(call.comm.Get_size(), window.size_class(nbytes)) <= window.room()


@functools.lru_cache(maxsize=64)
def _exchange_schedule(rank: int, size: int, count: int, nodes: tuple) -> tuple:
    """The pairwise exchange's schedule and the elements it sends to other nodes, kept as
    ``plan.schedule_of`` keeps a registered algorithm's (a schedule is immutable, and the
    compiled executor keeps its segmented plan on it: made once, not per call)."""
    from . import plan
    from .algorithms import alltoall_pairwise
    sched = alltoall_pairwise.schedule(rank, size, count)
    return sched, plan.internode_elements(sched, rank, nodes)


class _Described:
    """What a ``Job`` runs, where no plan names it, for ``describe()`` (requests, handles),
    ``kind`` (a plan's: ``"schedule"``, or ``"shared"`` for the window) and, given the
    algorithm and fields every rank must agree on, ``agree(call)`` (``Buckets``, each launch)."""

    def __init__(self, text: str, kind: str = "schedule", algorithm: str = "", **fields):
        self.text, self.kind, self._agreed = text, kind, (algorithm, fields)

    def agree(self, call, **instead) -> None:
        algorithm, fields = self._agreed
        call.agree(algorithm, **{**fields, **instead})

    def describe(self) -> str:
        return self.text


_SPARE: dict = {}       # (count, dtype) -> a buffer a finished blocking call's Job gave back


def runs_as_job(collective: str, algorithm, inner=None) -> bool:
    """Whether the blocking call runs a ``Job`` (a schedule or ``auto``; not the MPI library's
    or a shared-memory collective, which ``allreduce`` / ``reduce_scatter_block`` above run)."""
    from .registry import lookup
    if inner == "shm" or not isinstance(algorithm, str):
        return False
    if algorithm == "auto":
        return True
    try:
        algo = lookup(collective, algorithm)
    except ValueError:
        return False                    # the plain path names the bad algorithm
    return not (algo.library or algo.has("shared-memory"))


def run(collective: str, k, sendbuf, recvbuf=None, *, op="sum", algorithm="auto", comm=None,
        inner=None, outer=None, order=None, timeout=None, on_timeout=None, validate=None,
        compress=None, error_feedback=None):
    """The blocking form as a ``Job``, run now on the caller's thread; returns recvbuf."""
    from ._runtime.call import Call
    with Call(collective, algorithm, comm, timeout, on_timeout, validate) as call:
        job = Job(call, collective, sendbuf, recvbuf, op=op, k=k, algorithm=algorithm,
                  given={"inner": inner, "outer": outer, "order": order}, form="blocking",
                  compress=compress, error_feedback=error_feedback, pool=_SPARE)
        if job.window:                  # (the window is the requests' in flight first)
            from .executors import progress
            progress.finish_deferred(call.open())
        try:
            job.run(call.watch)
        finally:
            job.release(_SPARE)
        return job.result


def start(collective: str, reproducible, sendbuf, recvbuf, *, op, algorithm, comm, given,
          timeout, on_timeout, validate, compress=None, error_feedback=None):
    """The nonblocking form: a started ``Request`` running a ``Job`` whole in the progress
    engine (``wait()`` returns recvbuf)."""
    from ._runtime.call import Call
    from .executors.progress import Request
    k = spelled(reproducible)
    with Call(collective, algorithm, comm, timeout, on_timeout, validate) as call:
        job = Job(call, collective, sendbuf, recvbuf, op=op, k=k, algorithm=algorithm,
                  given=given, form="nonblocking", compress=compress,
                  error_feedback=error_feedback, pool=_SPARE)
        req = Request(f"{collective} {job.plan.describe()}", result=job.result,
                      deferred=job.run, on_done=lambda: job.release(_SPARE))
        return req.start(call, call.open().traffic)
