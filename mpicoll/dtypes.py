"""The dtypes and ops mpicoll reduces, and which op applies to which dtype: MPI's rule
(MPI-4.1 §6.9.2), kept in one table, ``RULES``; ``check(op, dtype)`` raises a TypeError for any
other pair. float16 and bfloat16 are stored as uint16 (``storage``): the kernels
(``mpicoll.kernels``) work on their bit patterns. ``mpicoll.kernels`` re-exports every name."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["DTYPES", "NAMES", "OPS", "RULES", "check", "ops_for", "allowed", "storage",
           "as_storage", "read_through", "is_bf16"]

_NAMES = ("float32", "float64", "int32", "int64",   # the first four: mpicoll's originals
          "int8", "int16", "uint8", "uint16", "uint32", "uint64",
          "float16", "bfloat16", "complex64", "complex128", "bool")
_bf16 = None                # ml_dtypes' bfloat16, once something asked for it (``_bfloat16``)


_KNOWN: dict = {}            # np.dtype -> its name in DTYPES, or None (_Dtypes._name)
_UNSEEN = object()
_DTYPE_TYPES = frozenset(type(np.dtype(t)) for t in ("f4", "f8", "i1", "i2", "i4", "i8", "u1",
                                                        "u2", "u4", "u8", "f2", "c8", "c16", "?"))


class _Dtypes(Sequence):
    """The dtypes the kernels reduce, in this order: a tuple that imports ``ml_dtypes`` (about 1 s
    of CPU, for bfloat16) only when it is listed or indexed, not for ``dtype in DTYPES`` or
    ``DTYPES.index(dtype)`` (a bfloat16 array brings ml_dtypes along: its user imported it)."""

    def __len__(self) -> int:
        return len(_NAMES)

    def __getitem__(self, i):
        return self._all()[i]

    def _all(self) -> tuple:
        return tuple(_bfloat16() if n == "bfloat16" else np.dtype(n) for n in _NAMES)

    def __contains__(self, x) -> bool:
        return self._name(x) is not None

    def index(self, x, *args) -> int:
        name = self._name(x)
        if name is None:
            raise ValueError(f"{x!r} is not in kernels.DTYPES")
        return _NAMES.index(name, *args)

    @staticmethod
    def _name(x):
        if type(x) in _DTYPE_TYPES:             # a dtype seen before: its answer, no allocation
            known = _KNOWN.get(x, _UNSEEN)
            if known is not _UNSEEN:
                return known
            name = _Dtypes._look(x)
            if len(_KNOWN) < 256:
                _KNOWN[x] = name
            return name
        return _Dtypes._look(x)

    @staticmethod
    def _look(x):
        if isinstance(x, str) and x == "bfloat16":
            return x
        try:
            d = x if isinstance(x, np.dtype) else None if x is None else np.dtype(x)
        except TypeError:
            return None
        if d is None or d.name not in _NAMES:
            return None
        return d.name if (is_bf16(d) if d.kind == "V" else d == np.dtype(d.name)) else None

    def __eq__(self, other) -> bool:
        return tuple(self) == other if isinstance(other, tuple) else self is other

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return repr(self._all())


DTYPES = _Dtypes()
NAMES = _NAMES              # DTYPES as strings (str(dtype)), without importing ml_dtypes
OPS = ("sum", "prod", "max", "min", "land", "lor", "lxor", "band", "bor", "bxor")

# MPI-4.1 §6.9.2 "Predefined Reduction Operations": the type classes each op applies to.
# (MPI also lets BAND/BOR/BXOR reduce MPI_BYTE: here that is uint8, an integer.)
RULES = {
    "sum": ("integer", "floating", "complex"),
    "prod": ("integer", "floating", "complex"),
    "max": ("integer", "floating"),
    "min": ("integer", "floating"),
    "land": ("integer", "logical"),
    "lor": ("integer", "logical"),
    "lxor": ("integer", "logical"),
    "band": ("integer",),
    "bor": ("integer",),
    "bxor": ("integer",),
}
_CLASS = {"i": "integer", "u": "integer", "f": "floating", "c": "complex", "b": "logical"}


def _class(dtype: np.dtype) -> str:
    return "floating" if is_bf16(dtype) else _CLASS[dtype.kind]


def is_bf16(dtype: np.dtype) -> bool:
    """Whether ``dtype`` is ml_dtypes' bfloat16 (by name first: no import for other dtypes)."""
    return dtype.kind == "V" and dtype.name == "bfloat16" and dtype == _bfloat16()


def _bfloat16() -> np.dtype:
    """ml_dtypes' bfloat16, imported on first use, and its entries in the tables below."""
    global _bf16
    if _bf16 is None:
        import ml_dtypes
        bf16 = np.dtype(ml_dtypes.bfloat16)
        _HALF[bf16] = np.dtype(np.uint16)
        _bf16 = bf16
        _OPS_FOR[bf16] = ops_for(bf16)
        _ALLOWED.update((op, bf16) for op in _OPS_FOR[bf16])
    return _bf16


def __getattr__(name: str):
    if name == "bfloat16":          # kernels.bfloat16: imports ml_dtypes
        return _bfloat16()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def ops_for(dtype) -> tuple:
    """The ops MPI allows on ``dtype``, in ``OPS`` order."""
    found = _OPS_FOR.get(dtype)
    if found is None:
        cls = _class(np.dtype(dtype))
        found = tuple(op for op in OPS if cls in RULES[op])
    return found


_OPS_FOR: dict = {}


def allowed(op: str, dtype) -> bool:
    """Whether MPI allows ``op`` on ``dtype`` (one of ``DTYPES``)."""
    return _class(np.dtype(dtype)) in RULES[op]


def check(op: str, dtype) -> None:
    """Raise TypeError unless MPI allows ``op`` on ``dtype``, naming the ops it allows."""
    if (op, dtype) in _ALLOWED:
        return
    dtype = np.dtype(dtype)
    if not allowed(op, dtype):
        classes = ", ".join(RULES[op][:-1]) + " and " if len(RULES[op]) > 1 else ""
        raise TypeError(f"op {op!r} does not apply to dtype {dtype} (MPI allows {op} on "
                        f"{classes}{RULES[op][-1]} types; {dtype} is {_class(dtype)}); "
                        f"ops for {dtype}: {', '.join(ops_for(dtype))}")


_HALF = {np.dtype(np.float16): np.dtype(np.uint16)}     # + bfloat16, once it is used


_EAGER = [np.dtype(n) for n in _NAMES if n != "bfloat16"]
_OPS_FOR.update((dtype, ops_for(dtype)) for dtype in _EAGER)
_ALLOWED = {(op, dtype) for dtype in _EAGER for op in _OPS_FOR[dtype]}


def storage(dtype) -> np.dtype:
    """The dtype the kernels (and the executors' messages) see: uint16 for the half types."""
    dtype = np.dtype(dtype)
    s = _HALF.get(dtype)
    return s if s is not None else np.dtype(np.uint16) if is_bf16(dtype) else dtype


def as_storage(a: np.ndarray) -> np.ndarray:
    """``a`` viewed as ``storage(a.dtype)`` (the same memory; ``a`` itself for most dtypes)."""
    dtype = a.dtype
    s = _HALF.get(dtype)
    if s is None and dtype.kind == "V" and is_bf16(dtype):    # (kind: no call for the rest)
        s = _HALF[dtype]
    return a if s is None else a.view(s)


def read_through(a: np.ndarray) -> np.ndarray:
    """``a``, or, if it is read-only, a writable array over the same memory, for a kernel that
    only reads it: numba types a read-only array apart, so a read-only sendbuf would compile
    every kernel it reaches once more, at its first call (minutes, on every rank at once)."""
    if a.flags.writeable:
        return a
    return np.asarray(_Alias(a))


class _Alias:
    """``a``'s array interface marked writable; numpy keeps this object, and so ``a``, alive as
    the new array's base."""

    def __init__(self, a: np.ndarray):
        self.array = a
        self.__array_interface__ = dict(a.__array_interface__,
                                        data=(a.__array_interface__["data"][0], False))
