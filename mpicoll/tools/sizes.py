"""Message sizes on the command line: ``8``, ``64K``, ``4M``, ``1G`` (powers of 1024, as in
nccl-tests and OSU), and the geometric ranges of ``-b MIN -e MAX -f FACTOR``."""

from __future__ import annotations

import argparse

__all__ = ["parse_size", "size_arg", "sizes_from"]

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes in ``text`` (``8``, ``64K``, ``4M``, ``1.5G``, ``4MB``); ``ValueError`` if it is none."""
    body = str(text).strip().upper().removesuffix("B")
    unit = body[-1:] if body[-1:] in _UNITS else ""
    try:
        value = float(body[:len(body) - len(unit)]) * _UNITS[unit]
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise ValueError(f"not a size: {text!r} (expected bytes like 8, 64K, 4M or 1G)")
    return int(value)


def size_arg(text: str) -> int:
    """``parse_size`` for argparse: a bad size is a one-line usage error."""
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def sizes_from(minbytes: int, maxbytes: int, factor: float) -> list[int]:
    """``minbytes``, ``minbytes * factor``, ... up to ``maxbytes`` (a factor of 1: every size)."""
    sizes, s = [], max(1, minbytes)
    while s <= maxbytes:
        sizes.append(int(s))
        s = s * factor if factor > 1 else s + 1
    return sizes
