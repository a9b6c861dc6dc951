"""The compression codecs' numba kernels, one per (codec, place the codec acts): over contiguous
fp32 slices, ``nogil``, cached. ``mpicoll.compression`` says what each codec is and why every
rank ends with the same bits; its ``Codec`` calls these.

* ``*_encode`` / ``*_decode`` / ``*_round``: the codec and its rounding ``R = decode . encode``;
* ``*_send``: encode a slice into the wire buffer and round the sender's own copy, one pass;
* ``*_add``: decode a received wire buffer and add it in fp32 into the buffer (as left or right
  operand), one pass, no scratch;
* ``*_feedback`` and the ``*_fed`` forms: error feedback ``x = g / d + e``, ``R(x)``,
  ``e = x - R(x)`` in the same pass.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

CHUNK = 256             # int8: elements per scale

__all__ = ["CHUNK", "bf16_encode", "bf16_decode", "bf16_round", "bf16_send", "bf16_add",
           "bf16_feedback", "bf16_send_fed", "bf16_add_fed", "fp16_encode", "fp16_decode",
           "fp16_round", "fp16_send", "fp16_add", "fp16_feedback", "fp16_send_fed", "fp16_add_fed",
           "int8_encode", "int8_decode", "int8_round", "int8_send", "int8_add", "int8_feedback",
           "int8_send_fed", "int8_add_fed"]


# ----------------------------------------------------------------------------- bf16

@njit(cache=True, nogil=True, inline="always")
def _bf16_bits(u):
    """fp32 bits -> bf16 bits, round to nearest even; a NaN stays a (quiet) NaN."""
    if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
        return np.uint16((u >> np.uint32(16)) | np.uint32(0x0040))
    bias = np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))
    return np.uint16((u + bias) >> np.uint32(16))


@njit(cache=True, nogil=True)
def bf16_encode(x, wire):
    """``wire[i] = bf16(x[i])``; ``x`` is the fp32 input viewed as uint32."""
    for i in range(x.shape[0]):
        wire[i] = _bf16_bits(x[i])


@njit(cache=True, nogil=True)
def bf16_decode(wire, out):
    """``out[i] = fp32(wire[i])``; ``out`` is the fp32 output viewed as uint32."""
    for i in range(wire.shape[0]):
        out[i] = np.uint32(wire[i]) << np.uint32(16)


@njit(cache=True, nogil=True)
def bf16_round(x):
    """``x = R(x)`` in place (``x`` viewed as uint32)."""
    for i in range(x.shape[0]):
        x[i] = np.uint32(_bf16_bits(x[i])) << np.uint32(16)


@njit(cache=True, nogil=True)
def bf16_send(x, wire):
    """``wire[i] = bf16(x[i])`` and ``x[i] = R(x[i])``, in one pass (``x`` viewed as uint32; a
    value already rounded is not written again)."""
    for i in range(x.shape[0]):
        h = _bf16_bits(x[i])
        wire[i] = h
        r = np.uint32(np.uint32(h) << np.uint32(16))
        if r != x[i]:
            x[i] = r


@njit(cache=True, nogil=True)
def bf16_add(wire, acc, left):
    """``acc[i] = fp32(wire[i]) + acc[i]`` (``left``) or ``acc[i] + fp32(wire[i])``: the
    decode and the fp32 sum in one pass (``acc`` fp32)."""
    for i in range(wire.shape[0]):
        w = np.uint32(np.uint32(wire[i]) << np.uint32(16)).view(np.float32)
        acc[i] = w + acc[i] if left else acc[i] + w


@njit(cache=True, nogil=True)
def bf16_feedback(x, e, d):
    """``v = x[i] / d + e[i]; x[i] = R(v); e[i] = v - R(v)`` in one pass (fp32 arrays, fp32
    ``d``)."""
    for i in range(x.shape[0]):
        v = np.float32(x[i] / d + e[i])
        r = np.uint32(np.uint32(_bf16_bits(v.view(np.uint32))) << np.uint32(16)).view(np.float32)
        x[i] = r
        e[i] = v - r


@njit(cache=True, nogil=True)
def bf16_send_fed(x, wire, e, d):
    """``bf16_feedback`` then ``bf16_send``, in one pass (``x``, ``e`` fp32)."""
    for i in range(x.shape[0]):
        v = np.float32(x[i] / d + e[i])
        h = _bf16_bits(v.view(np.uint32))
        r = np.uint32(np.uint32(h) << np.uint32(16)).view(np.float32)
        wire[i] = h
        e[i] = v - r
        x[i] = r


@njit(cache=True, nogil=True)
def bf16_add_fed(wire, acc, left, e, d):
    """``bf16_feedback`` on ``acc``, then ``bf16_add``, in one pass."""
    for i in range(wire.shape[0]):
        v = np.float32(acc[i] / d + e[i])
        r = np.uint32(np.uint32(_bf16_bits(v.view(np.uint32))) << np.uint32(16)).view(np.float32)
        e[i] = v - r
        w = np.uint32(np.uint32(wire[i]) << np.uint32(16)).view(np.float32)
        acc[i] = w + r if left else r + w


# ----------------------------------------------------------------------------- fp16

@njit(cache=True, nogil=True, inline="always")
def _fp16_bits(u):
    """fp32 bits -> IEEE half bits, round to nearest even (numpy's float16 conversion)."""
    sign = (u >> np.uint32(16)) & np.uint32(0x8000)
    f = u & np.uint32(0x7FFFFFFF)
    if f > np.uint32(0x7F800000):                       # NaN: keep the top payload bits
        m = (f >> np.uint32(13)) & np.uint32(0x3FF)
        return np.uint16(sign | np.uint32(0x7C00) | (m if m else np.uint32(1)))
    if f >= np.uint32(0x47800000):                      # >= 65536 (or inf): infinity
        return np.uint16(sign | np.uint32(0x7C00))
    e = f >> np.uint32(23)
    if e < np.uint32(113):                              # below 2^-14: a half subnormal (or 0)
        if e < np.uint32(102):
            return np.uint16(sign)
        mant = (f & np.uint32(0x7FFFFF)) | np.uint32(0x800000)
        shift = np.uint32(126) - e                      # value / 2^-24 = mant >> shift
        q = mant >> shift
        rest = mant & ((np.uint32(1) << shift) - np.uint32(1))
        half = np.uint32(1) << (shift - np.uint32(1))
        if rest > half or (rest == half and (q & np.uint32(1))):
            q += np.uint32(1)
        return np.uint16(sign | q)
    odd = (f >> np.uint32(13)) & np.uint32(1)           # normal: rebias, round, carry
    f = f + np.uint32(0xC8000FFF) + odd                 # (15 - 127) << 23, plus 0xFFF
    return np.uint16(sign | (f >> np.uint32(13)))


@njit(cache=True, nogil=True, inline="always")
def _fp16_value(h):
    """IEEE half bits -> fp32 bits (exact)."""
    h = np.uint32(h)
    sign = (h & np.uint32(0x8000)) << np.uint32(16)
    e = (h >> np.uint32(10)) & np.uint32(0x1F)
    m = h & np.uint32(0x3FF)
    if e == np.uint32(0x1F):
        return sign | np.uint32(0x7F800000) | (m << np.uint32(13))
    if e == np.uint32(0):
        if m == np.uint32(0):
            return sign
        e2 = np.uint32(113)
        while (m & np.uint32(0x400)) == np.uint32(0):
            m <<= np.uint32(1)
            e2 -= np.uint32(1)
        return sign | (e2 << np.uint32(23)) | ((m & np.uint32(0x3FF)) << np.uint32(13))
    return sign | ((e + np.uint32(112)) << np.uint32(23)) | (m << np.uint32(13))


@njit(cache=True, nogil=True)
def fp16_encode(x, wire):
    for i in range(x.shape[0]):
        wire[i] = _fp16_bits(x[i])


@njit(cache=True, nogil=True)
def fp16_decode(wire, out):
    for i in range(wire.shape[0]):
        out[i] = _fp16_value(wire[i])


@njit(cache=True, nogil=True)
def fp16_round(x):
    for i in range(x.shape[0]):
        x[i] = _fp16_value(_fp16_bits(x[i]))


@njit(cache=True, nogil=True)
def fp16_send(x, wire):
    for i in range(x.shape[0]):
        h = _fp16_bits(x[i])
        wire[i] = h
        r = _fp16_value(h)
        if r != x[i]:
            x[i] = r


@njit(cache=True, nogil=True)
def fp16_add(wire, acc, left):
    for i in range(wire.shape[0]):
        w = np.uint32(_fp16_value(wire[i])).view(np.float32)
        acc[i] = w + acc[i] if left else acc[i] + w


@njit(cache=True, nogil=True)
def fp16_feedback(x, e, d):
    for i in range(x.shape[0]):
        v = np.float32(x[i] / d + e[i])
        r = np.uint32(_fp16_value(_fp16_bits(v.view(np.uint32)))).view(np.float32)
        x[i] = r
        e[i] = v - r


@njit(cache=True, nogil=True)
def fp16_send_fed(x, wire, e, d):
    for i in range(x.shape[0]):
        v = np.float32(x[i] / d + e[i])
        h = _fp16_bits(v.view(np.uint32))
        r = np.uint32(_fp16_value(h)).view(np.float32)
        wire[i] = h
        e[i] = v - r
        x[i] = r


@njit(cache=True, nogil=True)
def fp16_add_fed(wire, acc, left, e, d):
    for i in range(wire.shape[0]):
        v = np.float32(acc[i] / d + e[i])
        r = np.uint32(_fp16_value(_fp16_bits(v.view(np.uint32)))).view(np.float32)
        e[i] = v - r
        w = np.uint32(_fp16_value(wire[i])).view(np.float32)
        acc[i] = w + r if left else r + w


# ----------------------------------------------------------------------------- int8

@njit(cache=True, nogil=True, inline="always")
def _pow2_scale(amax):
    """The smallest power of two s with s >= amax / 127 (at least 2^-126; NaN if not finite)."""
    if not amax < np.inf:
        return np.nan
    v = amax / 127.0
    if v == 0.0:
        return 1.0
    m, e = math.frexp(v)                                # v = m * 2^e, 0.5 <= m < 1
    s = math.ldexp(1.0, e - 1) if m == 0.5 else math.ldexp(1.0, e)
    return max(s, 2.0 ** -126)


@njit(cache=True, nogil=True, inline="always")
def _piece_scale(x, i, end):
    amax = 0.0
    for j in range(i, end):
        a = abs(np.float64(x[j]))
        if not a <= amax:                               # a NaN wins (and poisons the scale)
            amax = a if a == a else np.inf
    return _pow2_scale(amax)


@njit(cache=True, nogil=True)
def int8_encode(x, lo, cuts, scales, q):
    """Slice ``x`` (fp32, at absolute offset ``lo``) -> one scale per piece + int8 values; the
    pieces are the slice cut at the absolute offsets ``cuts`` (sorted, ending at the count)."""
    n, i, c = x.shape[0], 0, 0
    k = np.searchsorted(cuts, lo, side="right")
    while i < n:
        end = min(n, cuts[k] - lo)
        s = _piece_scale(x, i, end)
        scales[c] = s
        for j in range(i, end):
            q[j] = np.int8(np.rint(x[j] / s)) if s == s else np.int8(0)
        c += 1
        k += 1
        i = end


@njit(cache=True, nogil=True)
def int8_decode(scales, q, lo, cuts, out):
    n, i, c = q.shape[0], 0, 0
    k = np.searchsorted(cuts, lo, side="right")
    while i < n:
        end = min(n, cuts[k] - lo)
        s = scales[c]
        for j in range(i, end):
            out[j] = np.float32(q[j] * s)
        c += 1
        k += 1
        i = end


@njit(cache=True, nogil=True)
def int8_round(x, lo, cuts):
    """``x = R(x)`` in place: what ``int8_encode`` then ``int8_decode`` give."""
    n, i = x.shape[0], 0
    k = np.searchsorted(cuts, lo, side="right")
    while i < n:
        end = min(n, cuts[k] - lo)
        s = np.float32(_piece_scale(x, i, end))
        for j in range(i, end):
            x[j] = np.float32(np.int8(np.rint(x[j] / s)) * s) if s == s else np.float32(np.nan)
        k += 1
        i = end


@njit(cache=True, nogil=True)
def int8_send(x, lo, cuts, scales, q):
    """``int8_encode``, and ``x = R(x)`` in the same pass."""
    n, i, c = x.shape[0], 0, 0
    k = np.searchsorted(cuts, lo, side="right")
    while i < n:
        end = min(n, cuts[k] - lo)
        s = _piece_scale(x, i, end)
        scales[c] = s
        for j in range(i, end):
            q[j] = np.int8(np.rint(x[j] / s)) if s == s else np.int8(0)
            x[j] = np.float32(q[j] * s)
        c += 1
        k += 1
        i = end


@njit(cache=True, nogil=True)
def int8_add(scales, q, lo, cuts, acc, left):
    """``int8_decode`` and the fp32 sum into ``acc`` in one pass (``left``: as ``bf16_add``)."""
    n, i, c = q.shape[0], 0, 0
    k = np.searchsorted(cuts, lo, side="right")
    while i < n:
        end = min(n, cuts[k] - lo)
        s = scales[c]
        for j in range(i, end):
            w = np.float32(q[j] * s)
            acc[j] = w + acc[j] if left else acc[j] + w
        c += 1
        k += 1
        i = end


@njit(cache=True, nogil=True, inline="always")
def _int8_fed_piece(x, e, d, i, end):
    """Error feedback on one piece: ``v = x / d + e``, ``x = R(v)``, ``e = v - R(v)``."""
    for j in range(i, end):
        x[j] = x[j] / d + e[j]
    s = np.float32(_piece_scale(x, i, end))
    for j in range(i, end):
        r = np.float32(np.int8(np.rint(x[j] / s)) * s) if s == s else np.float32(np.nan)
        e[j] = x[j] - r
        x[j] = r


@njit(cache=True, nogil=True)
def int8_feedback(x, lo, e, d, cuts):
    """``v = x / d + e; x = R(v); e = v - R(v)``, piece by piece (``x`` at offset ``lo``)."""
    n, i = x.shape[0], 0
    k = np.searchsorted(cuts, lo, side="right")
    while i < n:
        end = min(n, cuts[k] - lo)
        _int8_fed_piece(x, e, d, i, end)
        k += 1
        i = end


@njit(cache=True, nogil=True)
def int8_send_fed(x, lo, cuts, scales, q, e, d):
    """``int8_feedback`` then ``int8_send``, piece by piece (each piece stays in cache)."""
    n, i, c = x.shape[0], 0, 0
    k = np.searchsorted(cuts, lo, side="right")
    while i < n:
        end = min(n, cuts[k] - lo)
        _int8_fed_piece(x, e, d, i, end)
        s = _piece_scale(x, i, end)
        scales[c] = s
        for j in range(i, end):
            q[j] = np.int8(np.rint(x[j] / s)) if s == s else np.int8(0)
        c += 1
        k += 1
        i = end


@njit(cache=True, nogil=True)
def int8_add_fed(scales, q, lo, cuts, acc, left, e, d):
    """``int8_feedback`` on ``acc``, then ``int8_add``, piece by piece."""
    n, i, c = q.shape[0], 0, 0
    k = np.searchsorted(cuts, lo, side="right")
    while i < n:
        end = min(n, cuts[k] - lo)
        _int8_fed_piece(acc, e, d, i, end)
        s = scales[c]
        for j in range(i, end):
            w = np.float32(q[j] * s)
            acc[j] = w + acc[j] if left else acc[j] + w
        c += 1
        k += 1
        i = end
