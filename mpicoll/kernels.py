"""Reduction kernels: ``acc = op(acc, incoming)`` in place, over contiguous 1-D arrays.

Which op applies to which dtype is MPI's rule (MPI-4.1 §6.9.2), kept in one table, ``RULES``
(``mpicoll.dtypes``, whose names this module re-exports);
``check(op, dtype)`` raises a TypeError for any other pair. Every kernel is a plain numba loop
that gives the same bits as numpy's ufunc with ``out=acc`` (``tests/unit/test_kernels.py``
proves it, NaN, inf, -0.0 and integer wrap-around included):

==========  ====================================  ===================================
op          numpy                                 applies to (MPI's type classes)
==========  ====================================  ===================================
sum, prod   ``np.add``, ``np.multiply``           integer, floating, complex
max, min    ``np.maximum``, ``np.minimum``        integer, floating
land, lor,  ``np.logical_and/or/xor`` written     integer, logical (bool); the result
lxor        back in the dtype                     is 0 or 1
band, bor,  ``np.bitwise_and/or/xor``             integer
bxor
==========  ====================================  ===================================

MAX and MIN follow ``np.maximum`` / ``np.minimum``: a NaN on either side wins (the left one if
both are); of two equal values (+0.0 and -0.0) float32/float64/bfloat16 keep the right one and
float16 the left one (numpy's half loop compares with >=). So op(a, b) and op(b, a) can differ in
their bits, which is why ``Recv.left`` exists (see ``mpicoll.schedule``).

complex prod: ``(ar*br - ai*bi) + (ar*bi + ai*br)i`` with each part one fused multiply-add,
``fma(ar, br, -(ai*bi))`` and ``fma(ar, bi, ai*br)``, as numpy's vector loop computes it on CPUs
with FMA (x86 since Haswell, AVX-512, ARM). numpy's own ufunc computes a 1-element array
without fusing, so it can differ from itself in the last bit; the kernel fuses always, so every
element gets the same bits whatever slice it arrives in. Which NaN a NaN product carries is not
even fixed in numpy (its vector body and its tail pick differently): the kernel picks as the
body does -- the first NaN of (ar, br, bi, ai) for the real part, of (ar, bi, br, ai) for the
imaginary part, quieted, else the NaN the operation made.

float16 and bfloat16: numba has no half-precision arithmetic, so these kernels work on the bit
patterns (the arrays viewed as uint16, ``storage(dtype)``). As numpy does for float16 and
ml_dtypes for bfloat16, each operand is widened to float32 (exact), sum or product is computed
in float32 and rounded back once, to nearest, ties to even: subnormal results are kept (not
flushed), a result above the largest finite value rounds to +-inf, a NaN stays a NaN (float16:
numpy's conversion, keeping the top 10 bits of the NaN's payload, at least one set; bfloat16:
ml_dtypes' quiet NaN 0x7fc0 with the sign kept). MAX and MIN compare the widened values (exact)
and keep one operand's bits. When both operands of a sum or product are NaNs, numpy's
float16 loop and ml_dtypes' bfloat16 one return the second one's (quieted; for bfloat16 its
sign): the kernels say so (``_nan_of_x``): they return x's NaN, quieted, when x is one. (They
once computed ``x + acc`` and counted on x86 returning the first operand's NaN; but LLVM may
swap the operands of a commutative operation, and on a fresh cache the bfloat16 product took
the other NaN's sign: tests/unit/test_dtypes.py's left fold at P = 3..5.)

Compilation is lazy: a kernel is compiled (or loaded from numba's on-disk cache) for a dtype the
first time ``kernel(op, dtype)`` is asked for it, under ``file_lock``, a lock file in the cache's
own folder (one per checkout, or per ``NUMBA_CACHE_DIR``; none shared across users): processes
that find the function in the cache load it side by side under a shared lock; one that misses
takes the lock exclusively, looks again (another process may have just written it), and only
then compiles and writes the cache while the others wait. Set ``NUMBA_CACHE_DIR`` to give a job
its own cache. ``MPICOLL_KERNELS=numpy`` swaps in numpy's ufuncs (for comparison; the same
bits, but for complex products as said above).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import sys
import tempfile
import threading
import time

import numpy as np
from llvmlite import ir
from numba import from_dtype, njit, types
from numba.core import cgutils
from numba.extending import intrinsic

try:                                    # numba's internals (_patch_numba_cache)
    from numba.core.caching import Cache as _NumbaCache
except ImportError:
    _NumbaCache = None

from . import settings
from .dtypes import (DTYPES, NAMES, OPS, RULES, allowed, as_storage, check, is_bf16, ops_for,
                     read_through, storage)
from .dtypes import __getattr__  # noqa: F401 -- kernels.bfloat16 (imports ml_dtypes)

__all__ = ["DTYPES", "NAMES", "OPS", "RULES", "KERNELS", "check", "ops_for", "allowed", "storage",
           "as_storage", "read_through", "kernel_name", "kernel", "warmup", "warm", "numpy_kernel",
           "sum_into", "prod_into", "max_into", "min_into", "COMBINERS", "entry_points",
           "reduce_at", "combine_at"]


# ----------------------------------------------------------------------------- native kernels


@njit(cache=True, nogil=True)
def sum_into(acc, x):
    for i in range(acc.shape[0]):
        acc[i] = acc[i] + x[i]


@njit(cache=True, nogil=True)
def prod_into(acc, x):
    for i in range(acc.shape[0]):
        acc[i] = acc[i] * x[i]


@njit(cache=True, nogil=True)
def max_into(acc, x):
    for i in range(acc.shape[0]):
        a, b = acc[i], x[i]
        if not (a > b or a != a):       # keep a if a > b or a is NaN, else b (np.maximum)
            acc[i] = b


@njit(cache=True, nogil=True)
def min_into(acc, x):
    for i in range(acc.shape[0]):
        a, b = acc[i], x[i]
        if not (a < b or a != a):       # keep a if a < b or a is NaN, else b (np.minimum)
            acc[i] = b


@njit(cache=True, nogil=True)
def land_into(acc, x):
    for i in range(acc.shape[0]):
        acc[i] = acc[i] != 0 and x[i] != 0


@njit(cache=True, nogil=True)
def lor_into(acc, x):
    for i in range(acc.shape[0]):
        acc[i] = acc[i] != 0 or x[i] != 0


@njit(cache=True, nogil=True)
def lxor_into(acc, x):
    for i in range(acc.shape[0]):
        acc[i] = (acc[i] != 0) != (x[i] != 0)


@njit(cache=True, nogil=True)
def band_into(acc, x):
    for i in range(acc.shape[0]):
        acc[i] = acc[i] & x[i]


@njit(cache=True, nogil=True)
def bor_into(acc, x):
    for i in range(acc.shape[0]):
        acc[i] = acc[i] | x[i]


@njit(cache=True, nogil=True)
def bxor_into(acc, x):
    for i in range(acc.shape[0]):
        acc[i] = acc[i] ^ x[i]


@intrinsic
def _fma(typingctx, a, b, c):
    """``a * b + c`` rounded once (LLVM's llvm.fma)."""
    def codegen(context, builder, signature, args):
        ty = args[0].type
        name = "llvm.fma.f32" if ty == ir.FloatType() else "llvm.fma.f64"
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ty, [ty] * 3), name)
        return builder.call(fn, args)
    return a(a, b, c), codegen


@njit(cache=True, nogil=True)
def _nan_of(p, q, fallback):
    """The first NaN of p, q, quieted (as x86 returns an operand's NaN), else ``fallback``."""
    if p != p:
        return p + p
    if q != q:
        return q + q
    return fallback


@njit(cache=True, nogil=True)
def complex_prod_into(acc, x):
    for i in range(acc.shape[0]):
        a, b = acc[i], x[i]
        ar, ai, br, bi = a.real, a.imag, b.real, b.imag
        re_c, im_c = ai * bi, ai * br
        re = _fma(ar, br, -re_c)
        im = _fma(ar, bi, im_c)
        if re != re:        # which NaN: as numpy's vector loop (see the module's doc)
            re = _nan_of(ar, br, _nan_of(bi, ai, re_c if re_c != re_c else re))
        if im != im:
            im = _nan_of(ar, bi, _nan_of(br, ai, im_c if im_c != im_c else im))
        acc[i] = complex(re, im)


# ----------------------------------------------------------------------------- half types


@njit(cache=True, nogil=True)
def _f16_to_f32(h):
    """float16 bits -> float32, exact (numpy's npy_halfbits_to_floatbits)."""
    h = np.uint32(h)
    sign = (h & 0x8000) << 16
    exp, sig = h & 0x7c00, h & 0x03ff
    if exp == 0x7c00:                                   # inf or NaN: the payload shifted
        bits = sign | 0x7f800000 | (sig << 13)
    elif exp != 0:                                      # normal
        bits = sign | (((h & 0x7fff) + 0x1c000) << 13)
    elif sig == 0:                                      # signed zero
        bits = sign
    else:                                               # subnormal: normalise
        e = 0
        sig <<= 1
        while (sig & 0x0400) == 0:
            sig <<= 1
            e += 1
        bits = sign | ((127 - 15 - e) << 23) | ((sig & 0x03ff) << 13)
    return np.uint32(bits).view(np.float32)


@njit(cache=True, nogil=True)
def _f32_to_f16(f):
    """float32 -> float16 bits, to nearest, ties to even (numpy's npy_floatbits_to_halfbits)."""
    b = np.int64(np.float32(f).view(np.uint32))
    sign = (b >> 16) & 0x8000
    exp = b & 0x7f800000
    if exp >= 0x47800000:                               # overflow, inf or NaN
        sig = b & 0x007fffff
        if exp == 0x7f800000 and sig != 0:              # NaN: keep the payload's top bits
            h = 0x7c00 + (sig >> 13)
            return np.uint16(sign + (h + 1 if h == 0x7c00 else h))
        return np.uint16(sign + 0x7c00)                 # inf, or overflow to inf
    if exp <= 0x38000000:                               # subnormal half or signed zero
        if exp < 0x33000000:
            return np.uint16(sign)
        e = exp >> 23
        sig = 0x00800000 + (b & 0x007fffff)
        sig >>= 113 - e
        if (sig & 0x3fff) != 0x1000 or (b & 0x7ff) != 0:   # round half to even
            sig += 0x1000
        return np.uint16(sign + (sig >> 13))
    h_exp = (exp - 0x38000000) >> 13
    sig = b & 0x007fffff
    if (sig & 0x3fff) != 0x1000:                        # round half to even
        sig += 0x1000
    return np.uint16(sign + h_exp + (sig >> 13))        # a carry may reach inf: correct


@njit(cache=True, nogil=True)
def _bf16_to_f32(h):
    """bfloat16 bits -> float32, exact."""
    return np.uint32(np.uint32(h) << 16).view(np.float32)


@njit(cache=True, nogil=True)
def _f32_to_bf16(f):
    """float32 -> bfloat16 bits, to nearest, ties to even; NaN -> 0x7fc0 with its sign (as
    ml_dtypes / Eigen)."""
    b = np.int64(np.float32(f).view(np.uint32))
    if f != f:
        return np.uint16(0xffc0 if b >> 31 else 0x7fc0)
    return np.uint16((b + 0x7fff + ((b >> 16) & 1)) >> 16)


@njit(cache=True, nogil=True)
def _nan_of_x(x, r):
    """``r`` (acc op x, in float32), or x's NaN, quieted, when x is one: with two NaNs numpy's
    float16 loop and ml_dtypes' bfloat16 one return the second operand's (see above)."""
    if x != x:
        return np.uint32(np.float32(x).view(np.uint32) | np.uint32(0x00400000)).view(np.float32)
    return r


@njit(cache=True, nogil=True)
def float16_sum_into(acc, x):
    for i in range(acc.shape[0]):
        b = _f16_to_f32(x[i])
        acc[i] = _f32_to_f16(_nan_of_x(b, _f16_to_f32(acc[i]) + b))


@njit(cache=True, nogil=True)
def float16_prod_into(acc, x):
    for i in range(acc.shape[0]):
        b = _f16_to_f32(x[i])
        acc[i] = _f32_to_f16(_nan_of_x(b, _f16_to_f32(acc[i]) * b))


@njit(cache=True, nogil=True)
def float16_max_into(acc, x):
    for i in range(acc.shape[0]):
        a, b = _f16_to_f32(acc[i]), _f16_to_f32(x[i])
        if not (a >= b or a != a):      # numpy's half loop: keep a if a >= b or a is NaN
            acc[i] = x[i]


@njit(cache=True, nogil=True)
def float16_min_into(acc, x):
    for i in range(acc.shape[0]):
        a, b = _f16_to_f32(acc[i]), _f16_to_f32(x[i])
        if not (a <= b or a != a):
            acc[i] = x[i]


@njit(cache=True, nogil=True)
def bfloat16_sum_into(acc, x):
    for i in range(acc.shape[0]):
        b = _bf16_to_f32(x[i])
        acc[i] = _f32_to_bf16(_nan_of_x(b, _bf16_to_f32(acc[i]) + b))


@njit(cache=True, nogil=True)
def bfloat16_prod_into(acc, x):
    for i in range(acc.shape[0]):
        b = _bf16_to_f32(x[i])
        acc[i] = _f32_to_bf16(_nan_of_x(b, _bf16_to_f32(acc[i]) * b))


@njit(cache=True, nogil=True)
def bfloat16_max_into(acc, x):
    for i in range(acc.shape[0]):
        a, b = _bf16_to_f32(acc[i]), _bf16_to_f32(x[i])
        if not (a > b or a != a):       # ml_dtypes: keep a if a > b or a is NaN
            acc[i] = x[i]


@njit(cache=True, nogil=True)
def bfloat16_min_into(acc, x):
    for i in range(acc.shape[0]):
        a, b = _bf16_to_f32(acc[i]), _bf16_to_f32(x[i])
        if not (a < b or a != a):
            acc[i] = x[i]


# ----------------------------------------------------------------------------- lookup

KERNELS = {
    "sum": sum_into, "prod": prod_into, "max": max_into, "min": min_into,
    "land": land_into, "lor": lor_into, "lxor": lxor_into,
    "band": band_into, "bor": bor_into, "bxor": bxor_into,
    "complex_prod": complex_prod_into,
    "float16_sum": float16_sum_into, "float16_prod": float16_prod_into,
    "float16_max": float16_max_into, "float16_min": float16_min_into,
    "bfloat16_sum": bfloat16_sum_into, "bfloat16_prod": bfloat16_prod_into,
    "bfloat16_max": bfloat16_max_into, "bfloat16_min": bfloat16_min_into,
}
_UFUNCS = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum,
           "land": np.logical_and, "lor": np.logical_or, "lxor": np.logical_xor,
           "band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}


def kernel_name(op: str, dtype) -> str:
    """The name in ``KERNELS`` of ``op``'s kernel for ``dtype`` (an allowed pair)."""
    dtype = np.dtype(dtype)
    if dtype == np.float16 or is_bf16(dtype):
        return f"{dtype}_{op}"
    if op == "prod" and dtype.kind == "c":
        return "complex_prod"
    return op


# ----------------------------------------------------------------------------- one pass

# out = op(a, b) in one pass, where a loop writes a slice for the first time (out of place):
# sum, prod, max and min of native numbers (by kernel name; max and min with the kernels' NaN
# rule). Every other kernel copies a into out first, then reduces (``combine_at``).


@njit(cache=True, nogil=True)
def sum_combine(out, a, b):
    for i in range(out.shape[0]):
        out[i] = a[i] + b[i]


@njit(cache=True, nogil=True)
def prod_combine(out, a, b):
    for i in range(out.shape[0]):
        out[i] = a[i] * b[i]


@njit(cache=True, nogil=True)
def max_combine(out, a, b):
    for i in range(out.shape[0]):
        x, y = a[i], b[i]
        out[i] = x if (x > y or x != x) else y


@njit(cache=True, nogil=True)
def min_combine(out, a, b):
    for i in range(out.shape[0]):
        x, y = a[i], b[i]
        out[i] = x if (x < y or x != x) else y


COMBINERS = {"sum": sum_combine, "prod": prod_combine, "max": max_combine, "min": min_combine}


# ----------------------------------------------------------------------------- entry points

# Compiled loops (the executor's, shm's) call a kernel through the address of its compiled
# code, given to them as an int64, not by name: numba compiles a function that another one
# calls into the caller, and links and optimises it again there, so each loop held every
# kernel of its dtype (up to 18), and ``tools.warm`` compiled them for minutes before a first
# result (docs/performance.md, "Cold start"). Through the address, each loop is compiled once
# per storage dtype with no kernel inside, and each kernel once per (op, dtype), when first
# used. The call is numba's own calling convention (the one a direct call uses) on the same
# array types the kernel was compiled for; the loops call it per segment or per block, so the
# indirection costs one call, not one per element.


@intrinsic
def reduce_at(typingctx, kernel, acc, x):
    """``acc = op(acc, x)`` by the kernel at address ``kernel`` (``entry_points``), in
    compiled code; ``acc`` and ``x`` 1-D contiguous arrays of its storage dtype."""
    if _arrays_of_entry((acc, x)):
        return types.void(kernel, acc, x), _call_entry


@intrinsic
def _combine_entry(typingctx, combiner, out, a, b):
    """``out = op(a, b)`` by the one-pass kernel at address ``combiner``."""
    if _arrays_of_entry((out, a, b)):
        return types.void(combiner, out, a, b), _call_entry


def _arrays_of_entry(arrays) -> bool:
    """Whether ``arrays`` are the type the kernels are compiled for (``warmup``)."""
    return all(isinstance(t, types.Array) and t.ndim == 1 and t.layout == "C"
               and t.dtype == arrays[0].dtype for t in arrays)


def _call_entry(context, builder, signature, args):
    arrays = signature.args[1:]
    fnty = context.call_conv.get_function_type(types.none, arrays)
    function = builder.inttoptr(args[0], fnty.as_pointer())
    context.call_conv.call_function(builder, function, types.none, arrays, args[1:])
    return context.get_dummy_value()


@njit(cache=True, nogil=True)
def combine_at(kernel, combiner, out, a, b):
    """``out = op(a, b)`` in compiled code (``out`` apart from ``a`` and ``b``): the one-pass
    kernel at ``combiner``, or, when it is 0, ``out[:] = a`` then the kernel at ``kernel``."""
    if combiner != 0:
        _combine_entry(combiner, out, a, b)
    else:
        out[:] = a
        reduce_at(kernel, out, b)


_entries: dict = {}         # (op, dtype) -> (kernel, combiner) addresses


def entry_points(op: str, dtype) -> tuple:
    """``(kernel, combiner)``: the addresses of ``op``'s kernel for ``dtype`` (an allowed pair)
    and of its one-pass ``*_combine`` (0 where it has none), compiled or loaded first, for
    ``reduce_at`` and ``combine_at``; valid as long as this process runs."""
    found = _entries.get((op, dtype))
    if found is None:
        warmup(op, dtype)
        name, array = kernel_name(op, dtype), _array_type(storage(dtype))
        combiner = COMBINERS.get(name)
        found = _entries[op, np.dtype(dtype)] = (
            _address(KERNELS[name], (array, array)),
            0 if combiner is None else _address(combiner, (array,) * 3))
    return found


def _address(dispatcher, signature: tuple) -> int:
    """Where the compiled code of ``dispatcher`` for ``signature`` starts (numba's own entry,
    not its Python wrapper)."""
    compiled = dispatcher.overloads[signature]
    return compiled.library.get_pointer_to_function(compiled.fndesc.llvm_func_name)


def _array_type(dtype: np.dtype):
    return types.Array(from_dtype(dtype), 1, "C")


def numpy_kernel(op: str, dtype):
    """numpy's ufunc for ``op`` with ``out=acc``, on arrays of ``storage(dtype)``."""
    ufunc, dtype = _UFUNCS[op], np.dtype(dtype)
    if storage(dtype) == dtype:
        return lambda acc, x: ufunc(acc, x, out=acc)
    return lambda acc, x: ufunc(acc.view(dtype), x.view(dtype), out=acc.view(dtype))


_ready: set = set()         # (kernel name, storage dtype) compiled or loaded in this process
_warm: set = set()          # (op, dtype) whose kernel is in _ready (the fast path)


def warmup(op: str | None = None, dtype=None) -> float:
    """Compile (or load from the disk cache) ``op``'s kernel for ``dtype`` (and its one-pass
    ``COMBINERS`` kernel, if it has one), once per process; return the seconds spent (0.0 if
    it was ready; nothing to do without arguments).

    Under ``file_lock``: processes that find the kernel in numba's cache load it side by side;
    on a miss one compiles and writes the cache while the others wait, then load it. No
    communication, so it cannot hang, and a lock whose holder died is released by the kernel.
    """
    if op is None or (op, dtype) in _warm:
        return 0.0
    key = (kernel_name(op, dtype), storage(dtype))
    if key in _ready:
        _warm.add((op, np.dtype(dtype)))
        return 0.0
    started = time.monotonic()
    array = _array_type(key[1])
    with file_lock(f"the {op} kernel for {np.dtype(dtype)}"):
        KERNELS[key[0]].compile((array, array))
        if key[0] in COMBINERS:
            COMBINERS[key[0]].compile((array,) * 3)
    _ready.add(key)
    _warm.add((op, np.dtype(dtype)))
    return time.monotonic() - started


def warm(op: str, dtype: np.dtype) -> bool:
    """Whether ``warmup(op, dtype)`` has nothing left to do: a set look-up, so that a call
    skips ``_runtime.loading``'s helper thread (~100 us a call) once the kernel is there."""
    return (op, dtype) in _warm


class file_lock:
    """The lock under which numba loads or compiles mpicoll's functions: a file in the folder
    of numba's cache of them (``lock_path()``), so checkouts, caches and users never share one.

    It is taken shared: processes that find what they need in the cache load it side by side.
    A cache miss inside the block (numba's ``Cache.load_overload`` finding nothing) turns it
    exclusive, and the cache is looked up again before numba compiles: a process that waited
    for another's compilation loads its result instead of compiling it a second time. Nested
    blocks in one thread are one lock. A process that dies holding it releases it (``flock``).

    ``what`` names what the block loads, for the line that says so if numba compiles it
    instead (``_Notice``): nothing is printed when everything is found in the cache.
    """

    def __init__(self, what: str | None = None):
        self.what = what

    def __enter__(self):
        _threads.acquire()          # one thread of a process at a time: a thread waiting to turn
        held = _lock_state.__dict__.setdefault("depth", 0)    # the lock exclusive holds numba's
        _lock_state.depth = held + 1                          # compiler lock, which another
        if held:                                              # thread's shared load would need
            return self
        try:
            _patch_numba_cache()
            self.file = open(lock_path(), "a")
            _lock_state.exclusive = not _patched
            fcntl.flock(self.file, fcntl.LOCK_EX if _lock_state.exclusive else fcntl.LOCK_SH)
            _lock_state.file = self.file
            _lock_state.what, _lock_state.notice = self.what, None
        except BaseException:
            _lock_state.depth -= 1
            _threads.release()
            raise
        return self

    def __exit__(self, *exc):
        _lock_state.depth -= 1
        try:
            if _lock_state.depth == 0:
                notice, _lock_state.what, _lock_state.notice = _lock_state.notice, None, None
                if notice is not None:      # ended before the next compiling process starts
                    notice.done()
                fcntl.flock(self.file, fcntl.LOCK_UN)
                self.file.close()
                _lock_state.file = None
        finally:
            _threads.release()


class _Notice:
    """The one line that says numba compiles something at its first use (a miss in the cache
    inside a ``file_lock`` that names it), on stderr: ``mpicoll: first use: numba compiles WHAT
    (then cached)``, then a dot per second while it lasts, then the seconds it took. Off while
    ``notices`` is False (``tools.warm`` says what it compiles itself)."""

    def __init__(self, what: str):
        self.started, self.stop = time.monotonic(), threading.Event()
        _say(f"mpicoll: first use: numba compiles {what} (then cached) ")
        self.ticker = threading.Thread(target=self._tick, name="mpicoll-compile-notice",
                                       daemon=True)
        self.ticker.start()

    def _tick(self) -> None:
        while not self.stop.wait(1.0):
            _say(".")

    def done(self) -> None:
        self.stop.set()
        self.ticker.join()
        _say(f" {time.monotonic() - self.started:.1f} s\n")


def _say(text: str) -> None:
    sys.stderr.write(text)
    sys.stderr.flush()


notices = True              # say what numba compiles at first use (``_Notice``)
_lock_state = threading.local()     # depth, file, exclusive, what, notice: this thread's lock
_threads = threading.RLock()
_patched = False
_lock_path: str | None = None


def lock_path() -> str:
    """The lock file of ``file_lock``: ``mpicoll-numba.lock`` in the folder where numba caches
    mpicoll's kernels (``NUMBA_CACHE_DIR``'s subfolder for this checkout, else the checkout's
    ``__pycache__``, else numba's per-user folder); if numba's cache can't say, one per user
    and checkout in the temporary folder."""
    global _lock_path
    if _lock_path is None:
        try:
            folder = sum_into._cache._cache_path        # numba's cache locator's choice
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, "mpicoll-numba.lock")
            open(path, "a").close()
        except (AttributeError, OSError):
            tag = hashlib.sha1(os.path.dirname(os.path.abspath(__file__)).encode()).hexdigest()
            path = os.path.join(tempfile.gettempdir(),
                                f"mpicoll-numba-{os.getuid()}-{tag[:12]}.lock")
        _lock_path = path
    return _lock_path


def use_lock_file(path: str) -> None:
    """Take ``file_lock`` on ``path`` in this process, not on ``lock_path()``: for a process
    that compiles numba functions no other process compiles meanwhile (``mpicoll.tools.warm``'s
    second process), which need not wait for the others' turns."""
    global _lock_path
    _lock_path = path


def _patch_numba_cache() -> None:
    """Wrap numba's ``Cache.load_overload`` once: inside a shared ``file_lock``, a miss takes the
    lock exclusively and looks again (double-checked), so only one process compiles. Outside
    ``file_lock`` it behaves as numba's. If numba's internals differ, ``file_lock`` stays
    exclusive (correct, only slower)."""
    global _patched
    if _patched:
        return
    original = getattr(_NumbaCache, "load_overload", None)
    if original is None:
        return

    def load_overload(self, sig, target_context):
        found = original(self, sig, target_context)
        if found is None and getattr(_lock_state, "file", None) is not None \
                and not _lock_state.exclusive:
            fcntl.flock(_lock_state.file, fcntl.LOCK_EX)    # drops the shared lock, then waits
            _lock_state.exclusive = True
            found = original(self, sig, target_context)
        if found is None and getattr(_lock_state, "what", None) is not None \
                and _lock_state.notice is None and notices:
            _lock_state.notice = _Notice(_lock_state.what)     # numba compiles it now
        return found

    _NumbaCache.load_overload = load_overload
    _patched = True


_chosen: dict = {}          # (op, dtype, MPICOLL_KERNELS) -> kernel


def kernel(op: str, dtype):
    """The in-place kernel ``f(acc, x)`` for ``op`` on arrays of ``storage(dtype)`` (viewed with
    ``as_storage``), compiled if needed; ``MPICOLL_KERNELS=numpy`` picks numpy's ufunc. Raises
    TypeError for a pair MPI does not allow."""
    mode = settings.get("MPICOLL_KERNELS")
    found = _chosen.get((op, dtype, mode))
    if found is None:
        check(op, dtype)
        if mode == "numpy":
            found = numpy_kernel(op, dtype)
        else:
            warmup(op, dtype)
            found = KERNELS[kernel_name(op, dtype)]
        _chosen[op, np.dtype(dtype), mode] = found
    return found
