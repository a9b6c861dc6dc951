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

import importlib
import sys
import types

__all__ = ["W", "CAPACITY", "DEFAULT_K", "DTYPES", "BinnedSum", "sum", "allreduce",
           "reduce_scatter_block", "wire_bytes", "rounded_rows", "spelled", "Job"]

# The rooms, each name looked up in them in this order on first use: ``binned`` (the formats,
# the pieces, ``BinnedSum``, ``sum``, ``warmup``), ``collective`` (auto's settings, the argument
# checks, the nested calls), ``job`` (``Job``), ``forms`` (``dispatch``: every form's way in),
# and the kernels, ``slice_kernels`` (the grid, codes, slices) and ``round_kernels``. Only
# ``forms`` loads with ``import mpicoll.api``: the kernels (numba, ml_dtypes) come with the
# first reproducible call or name.
_MODULES = ("binned", "collective", "job", "forms", "slice_kernels", "round_kernels")
# auto's settings, read where they are used (``collective``): ``mpicoll.reproducible.WINDOW =
# False`` sets that module's
_SETTINGS = ("SPLIT_BYTES", "SPLIT", "WINDOW")


def __getattr__(name: str):
    for module in _MODULES:
        found = importlib.import_module(f".{module}", __name__).__dict__
        if name in found:
            if name not in _SETTINGS:
                globals()[name] = found[name]
            return found[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | set(_SETTINGS))


class _Package(types.ModuleType):
    """The package's module: setting one of ``_SETTINGS`` on it sets ``collective``'s."""

    def __setattr__(self, name: str, value) -> None:
        if name in _SETTINGS:
            setattr(importlib.import_module(".collective", __name__), name, value)
        else:
            super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
