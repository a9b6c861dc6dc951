"""When ``shm`` can run, and when it reads in place: the answers ``api`` and ``select`` ask for.

``shm`` runs every op and dtype the schedules run (``mpicoll.kernels``: MPI's table of which op
applies to which type), so what it needs is a place: every rank of the window inside one real
node, one host (``CommState.real_nodes``: the ranks' host and Slurm node names).
``shm_wins`` is ``auto``'s ``shm`` band (``select`` imports it: "before all of them, an
all-reduce whose ranks all share one node ..."), ``single_copy_expected`` the part of it that
depends on the node.
"""

from __future__ import annotations

import os

import numpy as np

from .. import kernels, settings
from .probe import HAVE_READV

__all__ = ["SHM_MIN_BYTES", "SHM_MAX_BYTES", "shm_wins", "OPS", "DTYPES", "supports", "check",
           "usable", "outside_real_nodes", "check_node_phases", "node_phases_by_default",
           "single_copy_expected"]

OPS = kernels.OPS                   # every op and dtype the schedules run (MPI's pairs)
DTYPES = kernels.DTYPES
SHM_MIN_BYTES = 16384       # auto runs shm on one node from this size (docs/performance.md)
SHM_MAX_BYTES = 131072      # ... up to this size copying through its window, a core per rank


def shm_wins(nbytes: int, ranks: int, cores: int | None = None,
             single_copy: bool = False, in_place: bool = False) -> bool:
    """Whether ``shm`` is ``auto``'s all-reduce of ``nbytes`` on ``ranks`` ranks sharing a node of
    ``cores`` cores (None: ``os.cpu_count()``, the machine's, the same on every rank of it): from
    ``SHM_MIN_BYTES``; at every size when it reads the other ranks' memory (``single_copy``:
    ``single_copy_expected``) or the ranks outnumber the cores, else up to ``SHM_MAX_BYTES``
    -- but never for a call whose input is its output (``in_place``: ``sendbuf=MPI.IN_PLACE``)
    when it reads the others' memory: there the ring beat it at every size measured
    (docs/performance.md, "In place at N = 2")."""
    if ranks < 2 or nbytes < SHM_MIN_BYTES or (in_place and single_copy):
        return False
    return single_copy or nbytes <= SHM_MAX_BYTES or ranks > (cores or os.cpu_count() or 1)


def supports(op: str, dtype) -> bool:
    """Whether ``shm`` reduces ``op`` on ``dtype``: every pair MPI allows (``kernels``)."""
    return op in OPS and np.dtype(dtype) in DTYPES and kernels.allowed(op, dtype)


def _refusal(what: str, op: str, dtype) -> str:
    dtype = np.dtype(dtype)
    if dtype not in DTYPES:
        return f"{what} supports dtype {', '.join(map(str, DTYPES))}, not {dtype}"
    return f"{what}: op {op!r} does not apply to dtype {dtype} (ops for it: " \
           f"{', '.join(kernels.ops_for(dtype))})"


def check(st, op: str, dtype) -> None:
    """Raise ``ValueError`` unless ``shm`` can run on ``st``'s communicator with ``op`` and
    ``dtype`` (every rank gets the same answer: the layout is the same everywhere)."""
    nodes = st.real_nodes
    if len(nodes) > 1:
        raise ValueError(f"algorithm='shm' needs every rank on one node (it reduces in a "
                         f"shared-memory window); the ranks span {len(nodes)} nodes: "
                         f"{[list(n) for n in nodes]}")
    if not supports(op, dtype):
        raise ValueError(_refusal("algorithm='shm'", op, dtype))


def usable(st, op: str, dtype) -> bool:
    """Whether ``auto`` may run ``shm`` (``select``): every rank on one node (as the MPI library
    sees it), and an op and dtype it reduces."""
    return len(st.real_nodes) == 1 and supports(op, dtype)


def outside_real_nodes(st) -> list:
    """The nodes of the layout (``st.nodes()``) that do not lie inside one real node: ranks
    that can't share one memory window."""
    real = [set(r) for r in st.real_nodes]
    return [list(n) for n in st.nodes() if not any(set(n) <= r for r in real)]


def check_node_phases(st, op: str, dtype) -> None:
    """Raise ``ValueError`` unless hierarchical's shm node phases can run: every node of the
    layout inside one real node (ranks that share memory), an op and dtype ``shm`` reduces."""
    outside = outside_real_nodes(st)
    if outside:
        raise ValueError(f"hierarchical inner='shm' needs every node inside one real node (it "
                         f"shares a memory window); nodes {outside} span several: "
                         f"{[list(r) for r in st.real_nodes]}")
    if not supports(op, dtype):
        raise ValueError(_refusal("hierarchical inner='shm'", op, dtype))


def node_phases_by_default(st, inner, op: str, dtype, nbytes: int) -> bool:
    """Whether a blocking ``hierarchical`` call whose inner was not chosen (by argument or
    ``MPICOLL_HIER_INNER``) runs its node phases in shared memory: where ``auto`` would run
    ``shm`` on one node of the node's ranks (``shm_wins``: each node's size, and the
    ranks of its real node against its cores), when every node has the same number (> 1) of
    ranks, inside one real node, and ``shm`` reduces the op and dtype."""
    if inner is not None or settings.get("MPICOLL_HIER_INNER") is not None or \
            nbytes < SHM_MIN_BYTES or not supports(op, dtype):
        return False
    nodes = st.nodes()
    cores = max(1, (os.cpu_count() or 1) * len(nodes[0]) // max(len(r) for r in st.real_nodes))
    return (len({len(n) for n in nodes}) == 1 and len(nodes[0]) > 1
            and not outside_real_nodes(st)
            and shm_wins(nbytes, len(nodes[0]), cores,
                         single_copy=single_copy_expected(len(nodes[0]), cores)))


def single_copy_expected(ranks: int, cores: int | None = None) -> bool:
    """Whether ``shm`` on a node of ``ranks`` ranks and ``cores`` cores (None: the machine's)
    reads in place (the window's probe has the last word): ``MPICOLL_SHM_SINGLE_COPY=on``, or
    ``auto`` with a core per rank -- its third wait costs more than the copy saves when ranks
    take turns on a core -- and a libc with ``process_vm_readv``. ``select`` asks it too, for
    ``auto``'s band."""
    mode = settings.get("MPICOLL_SHM_SINGLE_COPY")
    return HAVE_READV and ranks > 1 and (
        mode == "on" or (mode == "auto" and ranks <= (cores or os.cpu_count() or 1)))
