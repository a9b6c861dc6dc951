"""``validate=True``: check that every rank called the collective with the same arguments.

Each rank reduces its call to a *fingerprint* of a few integers (``FIELDS``): the collective,
the algorithm it is about to run, op, dtype, count, root, the algorithm's options (inner, outer,
ring order) and node layout, the compression, a reproducible sum's K, ``average``, error
feedback, the group of calls it is one of (a ``Buckets``' bucket and layout), for ``auto``'s
all-reduce whether it is in place (it decides by it), whether it has a timeout, and whether its
own
argument checks failed. One nonblocking ``MPI_Iallreduce``
(MAX over the fingerprint and its negation: each field's maximum and minus its minimum) on
mpicoll's duplicate communicator, polled under the call's deadline, tells every rank whether all
fingerprints are equal; that is the whole cost when they are. When they are not, an
``MPI_Iallgather`` of the fingerprints lets every rank build the same ``ArgumentMismatch``,
naming the disagreeing ranks and their values.
"""

from __future__ import annotations

import re
import zlib

import numpy as np
from mpi4py import MPI

from ..errors import ArgumentMismatch
from ..kernels import DTYPES, NAMES, OPS
from ..registry import COLLECTIVES
from ..topology import ORDERS

__all__ = ["FIELDS", "fingerprint", "rejected", "check", "wait"]

FIELDS = ("collective", "algorithm", "op", "dtype", "count", "root", "inner", "outer", "order",
          "nodes", "compress", "executor", "segments", "reproducible", "in_place", "average",
          "feedback", "group", "site", "timeout", "error")
_COLLECTIVES = tuple(COLLECTIVES)
# (and "exchange": the reproducible all-reduce's exchange of values, mpicoll.reproducible)
_NAMES = tuple(sorted({name for table in COLLECTIVES.values() for name in table} | {"exchange"}))
_CODECS = ("bf16", "fp16", "int8")        # mpicoll.compression.CODECS
_ERRORS = ("none", "TypeError", "ValueError", "another error")
_EXECUTORS = ("mpi", "shm", "compiled", "python", "progress")   # mpicoll.plan.executor


def _index(table, value) -> int:
    return table.index(value) if value in table else -1


def fingerprint(collective: str, algorithm: str, op: str | None = None, dtype=None,
                count: int = 0, root: int = -1, inner: str | None = None,
                outer: str | None = None, order: str | None = None, nodes: tuple | None = None,
                compress: str | None = None, executor: str | None = None,
                segments: str | None = None, reproducible: int | None = None,
                in_place: bool | None = None, average: bool | None = None,
                feedback: bool | None = None, group: str | None = None,
                site: str | None = None, timeout: bool = False) -> list:
    """The integers that must be equal on every rank (-1: not applicable). ``nodes``, the node
    layout of a node-aware algorithm (``MPICOLL_RANKS_PER_NODE`` could differ between ranks),
    and ``segments``, the compiled executor's segment rule (``MPICOLL_SEGMENT_BYTES``, the
    profile), and ``group`` (``mpicoll.plan.Plan.group``) enter as checksums of their text."""
    root = -1 if root is None else root
    layout = -1 if nodes is None else zlib.crc32(repr(tuple(map(tuple, nodes))).encode())
    rule = -1 if segments is None else zlib.crc32(segments.encode())
    return [_COLLECTIVES.index(collective), _index(_NAMES, algorithm), _index(OPS, op),
            _index(DTYPES, dtype), count, root, _index(_NAMES, inner), _index(_NAMES, outer),
            _index(ORDERS, order), layout, _index(_CODECS, compress),
            _index(_EXECUTORS, executor), rule, -1 if reproducible is None else reproducible,
            -1 if in_place is None else int(in_place), int(bool(average)), int(bool(feedback)),
            -1 if group is None else zlib.crc32(group.encode()) & 0x7FFFFFFF,
            -1 if site is None else zlib.crc32(site.encode()) & 0x7FFFFFFF, int(timeout), 0]


def rejected(collective: str, error: BaseException) -> list:
    """The fingerprint of a rank whose own argument checks raised ``error``."""
    kind = 1 if isinstance(error, TypeError) else 2 if isinstance(error, ValueError) else 3
    return [_COLLECTIVES.index(collective)] + [-1] * (len(FIELDS) - 2) + [kind]


def check(comm: MPI.Intracomm, fp: list, watch=None, how: str = "validate=True") -> None:
    """Raise ``ArgumentMismatch`` on every rank unless ``fp`` is the same on all of them."""
    k = len(fp)
    # (the send buffers are named, so they live until the wait returns: mpi4py does not keep
    # a nonblocking collective's buffers alive, and Open MPI read a freed one in its progress)
    extremes, both = np.empty(2 * k, np.int64), np.array(both_signs(fp), np.int64)
    wait(comm.Iallreduce(both, extremes, op=MPI.MAX), watch,
         "the validate=True check (MPI_Iallreduce)", (both, extremes))
    high = extremes.tolist()
    if high[:k] == [-v for v in high[k:]]:          # every field's max == its min
        return
    table, mine = np.empty((comm.Get_size(), k), np.int64), np.array(fp, np.int64)
    wait(comm.Iallgather(mine, table), watch, "the validate=True report (MPI_Iallgather)",
         (mine, table))
    raise mismatch(_COLLECTIVES[fp[0]], table, how)


def both_signs(values: list) -> list:
    """``values`` and their negations: one ``MPI_Iallreduce`` with ``MPI_MAX`` of this gives
    every entry's largest value and (negated) its smallest over the ranks."""
    return values + [-v for v in values]


def spread(high, low, mine) -> list[str]:
    """The fields whose largest value over the ranks (``high``) differs from the smallest
    (``low``), shown with both and with this rank's (``mine``: fingerprints, as ``check``'s
    MAX exchange gives them, without the table of every rank's)."""
    return [f"{f}: {_show(f, high)} and {_show(f, low)} (the largest and smallest over the "
            f"ranks; this rank passed {_show(f, mine)})"
            for i, f in enumerate(FIELDS[:-1]) if high[i] != low[i]]


def wait(request, watch, step: str, keep: tuple) -> None:
    """Complete the collective ``request`` on the buffers ``keep`` (kept alive with it if the
    wait under ``watch``'s deadline gives up: ``Watch.wait``)."""
    if watch is None:
        request.Wait()
    else:
        watch.wait([request], step, keep=keep)


def _show(field: str, row) -> str:
    v = int(row[FIELDS.index(field)])
    if field == "collective":
        return _COLLECTIVES[v]
    if field == "order":
        return ORDERS[v] if v >= 0 else "default"
    if field in ("algorithm", "inner", "outer"):
        return _NAMES[v] if v >= 0 else "default"
    if field == "op":
        return OPS[v] if v >= 0 else "none"
    if field == "dtype":
        return NAMES[v] if v >= 0 else "?"     # (by name: ml_dtypes stays unimported)
    if field == "compress":
        return _CODECS[v] if v >= 0 else "none"
    if field == "nodes":
        return f"layout #{v:08x}" if v >= 0 else "none"
    if field == "executor":
        return _EXECUTORS[v] if v >= 0 else "?"
    if field == "segments":
        return f"rule #{v:08x}" if v >= 0 else "none"
    if field == "reproducible":        # K slices per value (mpicoll.reproducible)
        return f"K={v}" if v >= 0 else "no"
    if field == "in_place":             # auto's all-reduce: sendbuf=MPI.IN_PLACE or not
        return "none" if v < 0 else "sendbuf=MPI.IN_PLACE" if v else "a sendbuf array"
    if field in ("average", "feedback"):
        return "on" if v else "off"
    if field == "group":                # Buckets: a checksum of the bucket and the layout
        return f"group #{v:08x}" if v >= 0 else "none"
    if field == "site":                 # validate="callsite": a checksum of file:line
        return f"call site #{v:08x}" if v >= 0 else "none"
    if field == "timeout":
        return "on" if v else "off"
    return str(v)


# fields that follow from the others: the executor and segment rule from the algorithm (auto's
# choice, by count) and the settings, the node layout from MPICOLL_RANKS_PER_NODE; named, with
# the setting behind them, only when no argument the caller passed differs
_DERIVED = {"executor": "executor (MPICOLL_EXECUTOR)",
            "segments": "segments (MPICOLL_SEGMENT_BYTES, else the profile's optimum)",
            "nodes": "node layout (MPICOLL_RANKS_PER_NODE)"}


def differences(differ: dict) -> list[str]:
    """``{field: {value: ranks}}`` of the fields that differ, as the caller reads them: the
    arguments passed, then the algorithm run; the executor, segment rule and node layout only
    when nothing else differs (they follow from it), their setting named."""
    def shown(value: str) -> str:
        if value.startswith("model:"):          # segments: the cost model's optimum
            return "the profile's optimum"
        return value[:-1] + " B" if re.fullmatch(r"\d+B", value) else value
    passed = [f for f in differ if f not in _DERIVED and f != "algorithm"]
    names = passed + ["algorithm"] if passed or "algorithm" in differ else list(differ)
    return [f"{_DERIVED.get(f, f)}: " + ", ".join(f"{shown(v)} on rank(s) {rs}"
                                                  for v, rs in differ[f].items())
            for f in names if f in differ]


def mismatch(collective: str, table: np.ndarray, how: str = "validate=True") -> ArgumentMismatch:
    """The error for a table of every rank's fingerprint: the differing fields, grouped by value.

    A field's largest group of equal values (ties: the one with the lowest rank) is taken as
    right; the ranks outside it are the disagreeing ones.
    """
    size = len(table)
    errors = [r for r in range(size) if table[r, -1] > 0]
    others = [r for r in range(size) if table[r, -1] <= 0]
    parts, ranks, fields = [], set(errors), {}
    if errors:
        kinds = sorted({_ERRORS[table[r, -1]] for r in errors})
        parts.append(f"rank(s) {errors} rejected their own arguments ({', '.join(kinds)})")
    for field in FIELDS[:-1]:
        groups: dict = {}
        for r in others:
            groups.setdefault(_show(field, table[r]), []).append(r)
        if len(groups) > 1:
            ordered = sorted(groups.items(), key=lambda item: (-len(item[1]), item[1][0]))
            fields[field] = dict(ordered)
            ranks.update(r for _, rs in ordered[1:] for r in rs)
    parts += differences(fields)
    return ArgumentMismatch(f"{collective}: the ranks called it with different arguments "
                            f"({how}): " + "; ".join(parts), ranks, fields)
