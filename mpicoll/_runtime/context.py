"""Per-communicator state, cached on the communicator as an MPI attribute.

The first collective on a communicator duplicates it (one ``MPI_Comm_idup``, collective), so
mpicoll's point-to-point messages live in their own context and can never match the user's.
The duplicate is created with the nonblocking ``Idup`` so that a call with a timeout can wait
for it under its deadline (``ready``); the node layout is discovered right after (one
``MPI_Comm_split_type``, while every rank is known to be there), so later calls never block in
it. The state also numbers the calls (each call uses its own tag, so a message left over from a
call that failed cannot be taken by the next), keeps grow-only scratch buffers per dtype, and
caches the node layout for ``hierarchical``. After a call fails mid-way (a timeout), ``broken``
says why and mpicoll refuses further calls on the communicator. When the user frees the
communicator, MPI calls ``_delete`` and the duplicate is freed with it.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .. import settings
from ..errors import CommunicatorBroken
from ..executors.mpi import new_traffic
from ..topology import virtual_nodes

__all__ = ["state", "attach", "CommState", "node_layout"]

_TAGS = 32000        # tags cycle through 1 .. _TAGS (MPI guarantees at least 32767)


class CommState:
    def __init__(self, comm: MPI.Intracomm):
        self.comm, self._dup = comm.Idup()      # usable once ``ready`` has seen _dup complete
        self.calls = 0
        self.broken: str | None = None
        self.abandoned: list = []               # requests of failed calls, kept alive (watch.py)
        self._scratch: dict = {}
        self._nodes: dict = {}
        self.ranks_per_node: int | None = None   # for auto: the largest node, None on one node
        self.traffic = new_traffic()             # what the MPI executor sent on this communicator

    def check(self, what: str = "mpicoll") -> None:
        """Raise ``CommunicatorBroken`` if an earlier call on this communicator failed mid-way."""
        if self.broken:
            raise CommunicatorBroken(
                f"{what}: mpicoll will not use this communicator again: an earlier call failed "
                f"({self.broken}) and its messages may still be in flight; create a new "
                "communicator (comm.Dup() on every rank) to go on")

    def ready(self, watch=None) -> None:
        """Wait for the duplicate (under ``watch``'s deadline, if any), then find the nodes."""
        self.check()
        if self._dup is None:
            return
        if watch is None:
            self._dup.Wait()
        else:
            watch.wait([self._dup], "MPI_Comm_idup (mpicoll's duplicate of the communicator)")
        self._dup = None
        self._nodes[None] = node_layout(self.comm)
        nodes = self.nodes()
        self.ranks_per_node = max(map(len, nodes)) if len(nodes) > 1 else None

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
        k = settings.get("MPICOLL_RANKS_PER_NODE")
        if k not in self._nodes:
            self._nodes[k] = node_layout(self.comm, k)
        return self._nodes[k]

    def free(self) -> None:
        if self._dup is None and self.comm != MPI.COMM_NULL and not MPI.Is_finalized():
            self.comm.Free()


def node_layout(comm: MPI.Intracomm, ranks_per_node: int | None = None) -> tuple:
    """Ranks of ``comm`` grouped by node, nodes ordered by their first rank."""
    size = comm.Get_size()
    if ranks_per_node:
        return virtual_nodes(size, ranks_per_node)
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        members = tuple(local.allgather(comm.Get_rank()))
    finally:
        local.Free()
    return tuple(sorted(set(comm.allgather(members))))


def _delete(comm, keyval, value) -> None:
    value.free()


_keyval = None


def attach(comm: MPI.Intracomm) -> CommState:
    """The mpicoll state of ``comm``; on first use, created and its ``Idup`` started."""
    global _keyval
    if _keyval is None:
        _keyval = MPI.Comm.Create_keyval(delete_fn=_delete)
    st = comm.Get_attr(_keyval)
    if st is None:
        st = CommState(comm)
        comm.Set_attr(_keyval, st)
    return st


def state(comm: MPI.Intracomm) -> CommState:
    """The mpicoll state of ``comm``, ready to use: created (collectively) on first use."""
    st = attach(comm)
    st.ready()
    return st
