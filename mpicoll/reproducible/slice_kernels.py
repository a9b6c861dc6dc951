"""Reproducible sums' kernels, part 1: the bin grid, the bin codes and the slices (numba).

The bin grid is float64's for every dtype: bin b holds the bits of weight 2^(G + bW) to
2^(G + bW + W - 1), G = -1074 (the smallest subnormal's bit), so the codes are 0..52. The codes
and the slices read a value's bits (as a signed integer of its width: the sign is its sign) and
compute in int64; rounding (``round_kernels``) in int64 and float64, each step exact. A slice
buffer holds blocks of elements, slice-major within a block (``_slices_into``). The method:
``mpicoll.reproducible``'s doc and docs/algorithms.md#reproducible-sums.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.cpython.unsafe.numbers import leading_zeros
from numba.extending import intrinsic

W = 40                          # bits per bin (and per slice)
CAPACITY = 1 << (62 - W)        # terms per element: |slice sum| < n.2^W <= 2^62, carries fit
SPECIAL, PLUS_ZERO, MINUS_ZERO = 127, -1, -2        # bin codes that are not bins
_NAN_UNIT = 1 << 31             # an inf/NaN element's slices count +inf, -inf and NaN (x 2^31)
K_RANGE = (2, 8)                # slices per value (K)

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

