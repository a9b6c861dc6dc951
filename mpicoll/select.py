"""``algorithm="auto"``: which algorithm to run for a message size and communicator size.

The rule is MPICH's classic one (``MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE``): latency-bound
algorithms below a size threshold, bandwidth-optimal ones above it. Thresholds are in bytes of
the whole vector and can be moved with ``MPICOLL_SHORT_MSG``.
"""

from __future__ import annotations

import os

__all__ = ["allreduce", "reduce_scatter_block", "allgather", "bcast", "SHORT_MSG"]

SHORT_MSG = 8192


def _short() -> int:
    return int(os.environ.get("MPICOLL_SHORT_MSG", SHORT_MSG))


def _pof2(size: int) -> bool:
    return size & (size - 1) == 0


def allreduce(nbytes: int, size: int, count: int) -> str:
    """recursive_doubling for short vectors (or count < size), then Rabenseifner on powers of
    two and the ring otherwise."""
    if nbytes <= _short() or count < size:
        return "recursive_doubling"
    return "recursive_halving" if _pof2(size) else "ring"


def reduce_scatter_block(block_bytes: int, size: int) -> str:
    return "recursive_halving" if _pof2(size) or block_bytes * size <= _short() else "ring"


def allgather(nbytes: int, size: int) -> str:
    return "recursive_doubling" if nbytes <= _short() else "ring"


def bcast(nbytes: int, size: int) -> str:
    return "binomial" if nbytes <= _short() or size < 4 else "ring"
