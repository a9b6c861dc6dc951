"""Message sizes on the command line: ``8``, ``64K``, ``4M``, ``1G`` (powers of 1024, as in
nccl-tests and OSU), and the geometric ranges of ``-b MIN -e MAX -f FACTOR``, MAX included."""

from __future__ import annotations

import argparse
import math

from ..settings import bytes_of

__all__ = ["parse_size", "size_arg", "sizes_from", "too_many_sizes", "human", "MAX_SIZES"]

MAX_SIZES = 10_000          # a sweep's sizes at most: -f 1 over 8..64M would be 67 million

def parse_size(text: str) -> int:
    """Bytes in ``text`` (``8``, ``64K``, ``4M``, ``1.5G``, ``4MB``); ``ValueError`` if it is none.
    The same rule as the environment's sizes (``mpicoll.settings.bytes_of``)."""
    return int(bytes_of(text))


def human(n: int) -> str:
    """``n`` bytes as a table writes them: ``4 MiB``, ``64 KiB`` when exact, else ``1000 B``."""
    for unit, f in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f and n % f == 0:
            return f"{n // f} {unit}"
    return f"{n} B"


def size_arg(text: str) -> int:
    """``parse_size`` for argparse: a bad size is a one-line usage error."""
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def sizes_from(minbytes: int, maxbytes: int, factor: float) -> list[int]:
    """``minbytes``, ``minbytes * factor``, ... and ``maxbytes`` itself, as OSU's ``-m MIN:MAX``
    ends at MAX: where a step would jump over it, the last step is shorter (``-b 8 -e 4M -f 4``:
    8, 32, ..., 512K, 2M, 4M). A factor of 1: every size."""
    sizes, s = [], max(1, minbytes)
    while s <= maxbytes:
        sizes.append(int(s))
        s = s * factor if factor > 1 else s + 1
    if sizes and sizes[-1] < maxbytes:
        sizes.append(maxbytes)
    return sizes


def too_many_sizes(minbytes: int, maxbytes: int, factor: float, limit: int = MAX_SIZES) -> str | None:
    """The one-line reason a ``-b/-e/-f`` range has more than ``limit`` sizes, else None
    (counted without building the list)."""
    lo = max(1, minbytes)
    if maxbytes < lo:
        return None
    if factor > 1:
        count = int(math.log(maxbytes / lo, factor) + 1e-9) + 1
        count += lo * factor ** (count - 1) < maxbytes      # and maxbytes, a shorter step
    else:
        count = maxbytes - lo + 1
    if count <= limit:
        return None
    return (f"-f {factor:g} makes {count} sizes from {minbytes} to {maxbytes} B, more than "
            f"{limit}: use a larger -f (e.g. 2) or a narrower -b/-e")
