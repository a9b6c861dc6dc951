"""The node layout: which ranks share a node, as a tuple of nodes, each the tuple of its ranks.

Under MPI the layout comes from the library's ``COMM_TYPE_SHARED`` split, or from
``MPICOLL_RANKS_PER_NODE`` (``mpicoll._runtime.context``); the in-process executor, the trace
and the model make virtual nodes here.
"""

from __future__ import annotations

__all__ = ["virtual_nodes"]


def virtual_nodes(size: int, ranks_per_node: int) -> tuple:
    """Nodes of ``ranks_per_node`` consecutive ranks (the last may be smaller)."""
    if ranks_per_node < 1:
        raise ValueError(f"ranks per node must be >= 1, got {ranks_per_node}")
    return tuple(tuple(range(lo, min(lo + ranks_per_node, size)))
                 for lo in range(0, size, ranks_per_node))

