"""Reproducible sums' kernels, part 2: one rounding of the K slice sums to the nearest float
(integer and float arithmetic, the same bits), the sums of two rows and the fused sum of rows
(numba). The grid and the slices: ``slice_kernels``."""

from __future__ import annotations

import numpy as np
from numba import njit

from .slice_kernels import (G, K_RANGE, MINUS_ZERO, PLUS_ZERO, SPECIAL, W, _MAGIC, _MAGIC_BITS,
                            _NAN_UNIT, _PER_W, _TOP_CODE, _TWO_W, _bitlen, _bits_float,
                            _bits_float32, _float32_bits, _float_bits, _float_chunk_into,
                            _float_code, _pow2_pair, _specials_into, _window_exponent,
                            _window_scales_into)

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

