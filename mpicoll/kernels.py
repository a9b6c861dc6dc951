"""Reduction kernels: ``acc = op(acc, incoming)`` in place, over contiguous 1-D arrays.

One numba kernel per op, compiled once per (op, dtype) and cached on disk. Each is a plain loop
that gives the same bits as numpy's ufunc with ``out=acc`` -- ``np.add(acc, x, out=acc)`` and so
on, NaN and infinities included (``tests/test_kernels.py`` proves it). MAX and MIN follow
``np.maximum`` / ``np.minimum``: a NaN on either side wins (the left one if both are), and of
two equal values (+0.0 and -0.0) the right one is kept. So op(a, b) and op(b, a) can differ in
their bits, which is why ``Recv.left`` exists (see ``mpicoll.schedule``).

numba's on-disk cache can race when many processes compile the same function at once, so
``warmup()`` -- called before the first collective -- takes a file lock: one process per machine
compiles and writes the cache while the others wait, then they load it. Set ``NUMBA_CACHE_DIR``
to give a job its own cache.
``MPICOLL_KERNELS=numpy`` swaps in numpy's ufuncs (for comparison; same bits).
"""

from __future__ import annotations

import fcntl
import os
import tempfile

import numpy as np
from numba import njit

from . import settings

__all__ = ["sum_into", "prod_into", "max_into", "min_into", "KERNELS", "NUMPY_KERNELS",
           "DTYPES", "OPS", "kernel", "warmup"]

DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int32), np.dtype(np.int64))
OPS = ("sum", "prod", "max", "min")


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


KERNELS = {"sum": sum_into, "prod": prod_into, "max": max_into, "min": min_into}
NUMPY_KERNELS = {
    "sum": lambda acc, x: np.add(acc, x, out=acc),
    "prod": lambda acc, x: np.multiply(acc, x, out=acc),
    "max": lambda acc, x: np.maximum(acc, x, out=acc),
    "min": lambda acc, x: np.minimum(acc, x, out=acc),
}

_compiled = False


def kernel(op: str):
    """The in-place kernel for ``op`` (``MPICOLL_KERNELS=numpy`` picks numpy's)."""
    return (NUMPY_KERNELS if settings.get("MPICOLL_KERNELS") == "numpy" else KERNELS)[op]


def warmup() -> None:
    """Compile (or load from the disk cache) every (op, dtype) kernel, once per process.

    Processes on one machine take turns under a file lock, so the first compiles and writes the
    cache while the others wait and then load it: no communication, so it cannot hang, and a
    lock whose holder died is released by the kernel.
    """
    global _compiled
    if _compiled:
        return
    lock = os.path.join(tempfile.gettempdir(), f"mpicoll-numba-{os.getuid()}.lock")
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            for dtype in DTYPES:
                acc, x = np.ones(2, dtype), np.ones(2, dtype)
                for fn in KERNELS.values():
                    fn(acc, x)
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
    _compiled = True
