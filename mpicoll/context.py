"""Per-communicator state, cached on the communicator as an MPI attribute.

The first collective on a communicator duplicates it (one ``MPI_Comm_dup``, collective), so
mpicoll's point-to-point messages live in their own context and can never match the user's.
The state also numbers the calls (each call uses its own tag, so a message left over from a
call that failed cannot be taken by the next), keeps grow-only scratch buffers per dtype, and
caches the node layout for ``hierarchical``. When the user frees the communicator, MPI calls
``_delete`` and the duplicate is freed with it.
"""

from __future__ import annotations

import os

import numpy as np
from mpi4py import MPI

__all__ = ["state", "CommState", "node_layout"]

_TAGS = 32000        # tags cycle through 1 .. _TAGS (MPI guarantees at least 32767)


class CommState:
    def __init__(self, comm: MPI.Intracomm):
        self.comm = comm.Dup()
        self.calls = 0
        self.broken: str | None = None
        self._scratch: dict = {}
        self._nodes: dict = {}

    def next_tag(self) -> int:
        self.calls += 1
        return 1 + self.calls % _TAGS

    def scratch(self, dtype: np.dtype, n: int) -> np.ndarray:
        """A scratch array of ``n`` elements, reused across calls (grown when too small)."""
        buf = self._scratch.get(dtype)
        if buf is None or buf.size < n:
            buf = self._scratch[dtype] = np.empty(max(n, 1), dtype)
        return buf[:n]

    def nodes(self) -> tuple:
        """The node layout: a tuple of nodes, each the tuple of its ranks in ``comm``.

        ``MPICOLL_RANKS_PER_NODE=k`` makes virtual nodes of k consecutive ranks; otherwise the
        MPI library's ``COMM_TYPE_SHARED`` split decides (collective on first use).
        """
        k = os.environ.get("MPICOLL_RANKS_PER_NODE", "")
        if k not in self._nodes:
            self._nodes[k] = node_layout(self.comm, int(k) if k else None)
        return self._nodes[k]

    def free(self) -> None:
        if self.comm != MPI.COMM_NULL and not MPI.Is_finalized():
            self.comm.Free()


def node_layout(comm: MPI.Intracomm, ranks_per_node: int | None = None) -> tuple:
    """Ranks of ``comm`` grouped by node, nodes ordered by their first rank."""
    size = comm.Get_size()
    if ranks_per_node:
        if ranks_per_node < 1:
            raise ValueError(f"MPICOLL_RANKS_PER_NODE must be >= 1, got {ranks_per_node}")
        return tuple(tuple(range(lo, min(lo + ranks_per_node, size)))
                     for lo in range(0, size, ranks_per_node))
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        members = tuple(local.allgather(comm.Get_rank()))
    finally:
        local.Free()
    return tuple(sorted(set(comm.allgather(members))))


def _delete(comm, keyval, value) -> None:
    value.free()


_keyval = None


def state(comm: MPI.Intracomm) -> CommState:
    """The mpicoll state of ``comm``, created (collectively) on first use."""
    global _keyval
    if _keyval is None:
        _keyval = MPI.Comm.Create_keyval(delete_fn=_delete)
    st = comm.Get_attr(_keyval)
    if st is None:
        st = CommState(comm)
        comm.Set_attr(_keyval, st)
    return st
