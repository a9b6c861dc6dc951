"""The node layout: which ranks share a node, as a tuple of nodes, each the tuple of its ranks.

Under MPI the layout comes from the library's ``COMM_TYPE_SHARED`` split, or from
``MPICOLL_RANKS_PER_NODE`` (``mpicoll._runtime.context``); the in-process executor, the trace
and the model make virtual nodes here.
"""

from __future__ import annotations

__all__ = ["virtual_nodes", "ring_order", "ORDERS"]


def virtual_nodes(size: int, ranks_per_node: int) -> tuple:
    """Nodes of ``ranks_per_node`` consecutive ranks (the last may be smaller)."""
    if ranks_per_node < 1:
        raise ValueError(f"ranks per node must be >= 1, got {ranks_per_node}")
    return tuple(tuple(range(lo, min(lo + ranks_per_node, size)))
                 for lo in range(0, size, ranks_per_node))



ORDERS = ("rank", "node", "rail")


def ring_order(nodes, order: str) -> tuple:
    """The ranks in the order a ring visits them (position i sends to position i + 1).

    * ``"rank"``: 0, 1, ..., p-1 -- the textbook ring;
    * ``"node"``: node by node, each node's ranks in rank order, so only one hop per node
      boundary leaves a node, wherever the ranks were placed (under ``srun
      --distribution=cyclic`` the rank-order ring leaves its node at every hop);
    * ``"rail"``: node by node too, but every hop between nodes joins the same local index (the
      same rail: GPU i's NIC on switch i), as NCCL builds its rings: on 2 nodes of 8 the ring is
      0..7, 15..8. Node j enters on rail ``r[j]`` and leaves on ``r[j+1]``, with ``r`` = 0, L-1,
      0, L-1, ... (L: ranks of the smallest node); an odd number of nodes ends on rail 1, the
      third colour an odd cycle needs. Where no such path exists (L = 1 or 2 with an odd
      number of nodes, L = 1 with uneven nodes) some hops cross rails.
    """
    if order not in ORDERS:
        raise ValueError(f"unknown ring order {order!r}; expected one of {list(ORDERS)}")
    members = [tuple(sorted(node)) for node in nodes]
    flat = sorted(r for node in members for r in node)
    if flat != list(range(len(flat))):
        raise ValueError(f"nodes {nodes} do not hold each rank 0..{len(flat) - 1} once")
    if order == "rank":
        return tuple(flat)
    if order == "node" or len(members) == 1:
        return tuple(r for node in members for r in node)
    M, L = len(members), min(map(len, members))
    rails = [0 if j % 2 == 0 else L - 1 for j in range(M)]
    if M % 2 and L >= 3:
        rails[-1] = 1
    ring = []
    for j, node in enumerate(members):
        enter, leave = rails[j], rails[(j + 1) % M]
        middle = [i for i in range(len(node)) if i not in (enter, leave)]
        if enter > leave:                       # run the node backwards: 15, 14, ..., 8
            middle.reverse()
        ring += [node[i] for i in [enter] + middle + ([leave] if leave != enter else [])]
    return tuple(ring)
