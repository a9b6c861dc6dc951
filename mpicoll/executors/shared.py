"""The shared-memory runner: an all-reduce in ``mpicoll.shm``'s window, on this rank.

Either ``shm`` itself (every rank on one node), or -- with ``algo`` and ``outer`` -- an
algorithm's node phases with ``inner="shm"`` (hierarchical): the window of this rank's node,
and between the node phases the ``outer`` all-reduce of its shard of each chunk with the same
local rank of every other node, run by ``execute`` (the plan's executor) on the call's tag and
deadline. Every form runs it: a blocking call at once, a persistent handle each time, a
nonblocking request in the progress engine (``progress.Request(deferred=...)``).
"""

from __future__ import annotations

import numpy as np

from .. import kernels, shm
from . import compiled

__all__ = ["SharedMemory"]


class SharedMemory:
    """``run(src, dst, tag, watch, signature, mismatch)``: from ``src`` (flat; may be ``dst``:
    in place) into ``dst``."""

    def __init__(self, st, dtype: np.dtype, op: str, execute=None, algo=None,
                 outer: str | None = None):
        self.st, self.op, self.nodes = st, op, None
        shm.warmup(dtype)
        if outer is None:
            return
        self.nodes = st.nodes()
        rank = st.comm.Get_rank()
        self.node = next(j for j, members in enumerate(self.nodes) if rank in members)
        local = self.nodes[self.node].index(rank)
        self.peers = [members[local] for members in self.nodes]
        self.outer = algo.module.OUTER[outer]
        self.execute = execute
        if not execute.compiled and len(self.nodes) > 1:
            kernels.warmup(op, dtype)
        self._schedules: dict = {}

    def run(self, src: np.ndarray, dst: np.ndarray, tag: int, watch, signature: int,
            mismatch) -> None:
        """``watch``: the call's ``Watch`` (or None), or a function that makes it (a cached
        call's); ``signature``, ``mismatch``: ``shm.window_allreduce``'s."""
        if self.nodes is None:
            shm.window_allreduce(self.st, src, dst, self.op, watch, signature, mismatch, tag=tag)
            return
        st = self.st

        def between(part: np.ndarray) -> None:      # all-reduce my shard across the nodes
            sched = self._schedules.get(part.size)
            if sched is None:
                sched = self._schedules[part.size] = self.outer.schedule(
                    self.node, len(self.nodes), part.size).remap(self.peers)
            scratch = st.scratch(part.dtype, compiled.scratch_elements(self.execute, sched,
                                                                       part.itemsize))
            self.execute(sched, part, st.comm, op=self.op, tag=tag, scratch=scratch,
                         traffic=st.traffic, watch=watch() if callable(watch) else watch)
            st.traffic["internode_bytes"] += sched.totals[0] * part.itemsize  # all off-node
        shm.window_allreduce(st, src, dst, self.op, watch, signature, mismatch, tag=tag,
                      nodes=self.nodes, between=between if len(self.nodes) > 1 else None)
