"""What a timed call returns (``Timing``) and how many elements a call of n bytes has."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .fabric import PATH_NAMES

__all__ = ["Timing", "call_count", "CRITICAL"]

CRITICAL = ("delay", "latency", "transfer", "reduction", "messages")


def call_count(collective: str, nbytes: int, size: int, itemsize: int) -> int:
    """Elements of one call of ``nbytes`` bytes, as ``mpicoll bench`` sizes it."""
    count = max(1, nbytes // itemsize)
    if collective in ("reduce_scatter_block", "allgather"):
        count = max(size, count // size * size)
    return count


def _bus_factor(collective: str, n: int) -> float:
    from ..registry import bus_factor
    return bus_factor(collective, n)


@dataclass
class Timing:
    fabric: str
    size: int
    nbytes: int
    finish: np.ndarray                      # seconds, per rank
    time: float                             # the last finish
    path_bytes: dict                        # bytes sent on each path (intra-node, ...)
    path_messages: dict
    class_bytes: dict                       # bytes carried by each link class (every hop)
    max_link_bytes: float                   # bytes carried by the bottleneck link
    max_link: str                           # the bottleneck: the link that held messages back longest
    internode_hops: int                     # distinct (src, dst) pairs that cross nodes
    cross_rail_hops: int                    # ... that cross rails
    bottleneck_bw: float                    # slowest message rate (bytes / transfer time)
    critical: dict = field(default_factory=dict)   # of the last rank to finish
    waves: int = 0
    collective: str = "allreduce"
    max_link_time: float = 0.0              # seconds the bottleneck held messages back
    protocol: str | None = None             # the protocol picked (fabrics that declare some)
    channels: int = 1
    rounded: int = 0                        # elements added to time unequal ring blocks as equal
    algorithm: str | None = None            # the algorithm NCCL's choice ran (simulate "nccl")

    @property
    def algbw(self) -> float:
        return self.nbytes / self.time if self.time > 0 else 0.0

    @property
    def busbw(self) -> float:
        return self.algbw * _bus_factor(self.collective, self.size)

    @property
    def internode_bytes(self) -> float:
        return self.path_bytes[PATH_NAMES[1]] + self.path_bytes[PATH_NAMES[2]]

    @property
    def internode_messages(self) -> int:
        return self.path_messages[PATH_NAMES[1]] + self.path_messages[PATH_NAMES[2]]

    def critical_path(self) -> str:
        c = self.critical
        parts = ", ".join(f"{k} {c[k] * 1e6:.1f} us" for k in CRITICAL[:4] if c[k] > 0)
        return f"{int(c['messages'])} messages: {parts or '0'}"
