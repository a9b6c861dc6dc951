"""Reduction ops and the dtypes they apply to: the names every collective accepts, MPI's rules.

An op is ``MPI.SUM`` ... or its lower-case name (``"sum"``); ``name(op)`` turns either into the
name the kernels, the signature and the plan use. ``check`` applies MPI's rules (``kernels.check``:
sum and prod on numbers, max and min not on complex, logical ops on integers and bool, bitwise
ops on integers) and, for the MPI library's own algorithm, that the library has the datatype.
"""

from __future__ import annotations

import functools

import numpy as np
from mpi4py import MPI
from mpi4py.util import dtlib

from . import kernels
from .registry import COLLECTIVES, Algorithm

__all__ = ["OPS", "MPI_OPS", "KEYS", "DTYPE_NAMES", "name", "key", "mpi_name", "library_has", "check",
           "reproducible_setting", "reproducible_for"]

MPI_OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN,
           "land": MPI.LAND, "lor": MPI.LOR, "lxor": MPI.LXOR,
           "band": MPI.BAND, "bor": MPI.BOR, "bxor": MPI.BXOR}
OPS = tuple(MPI_OPS)
DTYPE_NAMES = ", ".join(kernels.NAMES)
KEYS = {id(mpi_op): op for op, mpi_op in MPI_OPS.items()}     # MPI.SUM ... live forever


def key(op) -> str | None:
    """The op's name for a cache key, cheaply: a name given as a string, or one of mpi4py's
    predefined op objects (by identity); None for anything else (the full path checks it)."""
    return op if type(op) is str else KEYS.get(id(op))


def mpi_name(op) -> str:
    """``MPI.BAND`` for mpi4py's predefined op object, else its repr."""
    for attr in dir(MPI):
        value = getattr(MPI, attr)
        if isinstance(value, MPI.Op) and value == op and value != MPI.OP_NULL:
            return f"MPI.{attr}"
    return repr(op)


def name(op) -> str:
    """The op's lower-case name; ``TypeError`` naming it if mpicoll does not reduce with it."""
    if isinstance(op, str) and op.lower() in MPI_OPS:
        return op.lower()
    if isinstance(op, MPI.Op):
        for op_name, mpi_op in MPI_OPS.items():
            if op == mpi_op:
                return op_name
    shown = mpi_name(op) if isinstance(op, MPI.Op) else repr(op)
    if (op == MPI.MAXLOC or op == MPI.MINLOC) if isinstance(op, MPI.Op) else \
            (isinstance(op, str) and op.lower() in ("maxloc", "minloc")):
        best = "MAX" if "max" in shown.lower() else "MIN"
        raise TypeError(
            f"op {shown} is not supported: it reduces (value, index) pairs (MPI's pair types, "
            f"MPI.DOUBLE_INT and the like), and mpicoll reduces arrays of one numeric dtype "
            f"element-wise. Instead: m = allreduce(x, op=MPI.{best}), then allreduce("
            f"np.where(x == m, index, big), op=MPI.MIN) gives the lowest index holding it "
            f"(MPI's rule for ties); or mpi4py's comm.allreduce((value, index), op=MPI.{best}LOC)")
    raise TypeError(f"unsupported op {shown}; expected one of MPI."
                    f"{', MPI.'.join(n.upper() for n in MPI_OPS)} or of {list(MPI_OPS)}")


@functools.lru_cache(maxsize=None)
def library_has(dtype: np.dtype) -> bool:
    """Whether the MPI library has a datatype for ``dtype`` (mpi4py's mapping; none for
    bfloat16, nor for float16 in a library without MPIX_C_FLOAT16)."""
    try:
        return dtlib.from_numpy_dtype(dtype) != MPI.DATATYPE_NULL
    except (ValueError, KeyError, TypeError):
        return False


def check(collective: str, op: str | None, dtype: np.dtype, algo: Algorithm | None) -> None:
    """``op`` applies to ``dtype`` (MPI's rules, ``kernels.check``) and, when the MPI library
    runs the reduction (``algorithm="mpi"``), the library has the type: else a TypeError on
    this rank, before any communication."""
    if op is None:
        return
    kernels.check(op, dtype)
    if algo is not None and algo.library and not library_has(dtype):
        own = ", ".join(repr(n) for n, a in COLLECTIVES[collective].items() if not a.library)
        raise TypeError(f"algorithm={algo.name!r}: the MPI library has no datatype for {dtype}, "
                        f"so it can't reduce it; use 'auto' or one of mpicoll's own algorithms "
                        f"({own})")


def reproducible_setting(value, who: str):
    """``value`` as a standing ``reproducible`` setting (``mpicoll.Comm``'s attribute, the
    PyTorch backend's ``Options``): False, True or an int K; else a TypeError naming ``who``."""
    if not (value is False or value is True or type(value) is int):
        raise TypeError(f"{who}: reproducible is True, False or an int K (slices per value), "
                        f"got {value!r}")
    return value


def reproducible_for(value, dtype: np.dtype, op: str | None, who: str) -> dict:
    """The keyword a standing ``reproducible`` setting adds to one reduction of ``dtype`` by
    ``op`` (a name; None: not one mpicoll reduces with, the call says so): ``{"reproducible":
    value}`` for a float SUM; nothing for the other ops and integer sums (exact already); a
    ValueError for a float PROD (there is no reproducible product)."""
    if value is False or op is None or not (dtype.kind == "f" or dtype.name == "bfloat16"):
        return {}
    if op == "prod":
        raise ValueError(f"{who}: reproducible={value!r} has no reproducible product of "
                         f"{dtype.name} (op PROD, ReduceOp.PRODUCT); set it to False for this call")
    return {"reproducible": value} if op == "sum" else {}
