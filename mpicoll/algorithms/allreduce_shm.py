"""Shared-memory all-reduce: ranks on one node reduce straight from each other's memory.

The one all-reduce that is not a schedule: every rank of the communicator maps one shared
window (``mpicoll.shm``: the transport -- window, compiled kernels, probe, policy), and no
message is sent. Rank r reduces slice r of all p inputs, in rank order, straight from their
memory, and the others copy it (Phases 1-3 of ``mpicoll.shm``: copy in, reduce, copy out); from
16 KiB, where the node allows it, it reads the other ranks' buffers where they are
(``process_vm_readv``, single copy: publish, reduce, gather, release). Every rank ends with the
bits of the rank-order left fold ``op(...op(op(x_0, x_1), x_2)..., x_(p-1))``, as ``naive``'s
schedule does. Restriction ``shared-memory``. Source: MPICH's POSIX ``release_gather`` and
Open MPI's ``coll/sm`` cut down to one level; Intel MPI's ``I_MPI_ADJUST_ALLREDUCE`` 15
("N-reduce").

Restrictions: every rank on one node (``shared-memory``: the MPI library's ``COMM_TYPE_SHARED``
split decides, not ``MPICOLL_RANKS_PER_NODE``); blocking and persistent calls (no nonblocking
form). Every op and dtype MPI allows (``mpicoll.kernels``). Any p, any count (slices of
``block_displs``; no power-of-two folding).

Cost, n bytes, p ranks on one node -- alpha is the time for a flag store to reach a waiting
core (a cache-line transfer), beta the time to copy a byte through memory, gamma to reduce one;
a phase ends when its slowest rank does, so each wait costs one alpha:
    T = 2.alpha + ((p-1)/p).n.beta + n.beta + ((p-1)/p).n.gamma + ((p-1)/p).n.beta
      = 2.alpha + (3p-2)/p.n.beta + ((p-1)/p).n.gamma
(copy in (p-1)/p of the vector, read n/p from each of p inputs, copy out (p-1)/p). The cost
model (``mpicoll.model``) evaluates it with the intra-node link's alpha and beta, an upper
bound: MPI's intra-node beta includes MPI's own two copies through its shared-memory cells.
With the single copy: T = 3.alpha + ((p-1)/p).n.beta + ((p-1)/p).n.gamma + ((p-1)/p).n.beta
(read (p-1) slices of n/p, reduce, read (p-1)/p of the outputs; the whole vector at 2 ranks:
2.alpha + n.beta + n.gamma); ``cost`` keeps the window's formula, the upper bound.
Bytes each rank sends: 0 (the counters add what it wrote into the window, or read in place,
as ``shared_bytes``).
"""

from __future__ import annotations

from .. import shm

__all__ = ["cost", "bytes_sent"]


def cost(p: int, n: float, alpha: float, beta: float, gamma: float) -> float:
    if p <= 1:
        return 0.0
    return 2 * alpha + (3 * p - 2) / p * n * beta + (p - 1) / p * n * gamma


def bytes_sent(rank: int, p: int, n: float) -> float:
    return 0.0


# The names this module had when it held the transport, for the callers that still use them
# (api, persistent, bench, jobs, tests): new code imports ``mpicoll.shm``. Looked up there on
# first use, so importing the registry leaves shm's kernels and transport unloaded.
_ALIASES = {"OPS": "OPS", "DTYPES": "DTYPES", "CHUNK_BYTES": "CHUNK_BYTES",
            "MIN_BYTES": "MIN_BYTES", "SINGLE_COPY_MIN_BYTES": "SINGLE_COPY_MIN_BYTES",
            "PIECE_BYTES": "PIECE_BYTES", "WHOLE_MAX_BYTES": "WHOLE_MAX_BYTES",
            "check": "check", "supports": "supports",
            "warmup": "warmup", "single_copy_expected": "single_copy_expected",
            "window_rank": "window_rank", "size_class": "size_class"}


def __getattr__(name: str):
    if name in _ALIASES:
        value = getattr(shm, _ALIASES[name])
    elif name == "_slice":
        value = shm.kernels.slice_of
    elif name == "_HAVE_READV":
        value = shm.probe.HAVE_READV
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value
