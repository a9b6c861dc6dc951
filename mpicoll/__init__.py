"""mpicoll: collective algorithms written as schedules over mpi4py point-to-point calls.

    import mpicoll
    from mpi4py import MPI
    mpicoll.allreduce(sendbuf, recvbuf=None, op=MPI.SUM, algorithm="auto", comm=None)
    mpicoll.reduce_scatter_block(sendbuf, recvbuf=None, op=MPI.SUM, algorithm="auto", comm=None)
    mpicoll.allgather(sendbuf, recvbuf=None, algorithm="auto", comm=None)
    mpicoll.bcast(buf, root=0, algorithm="auto", comm=None)
    mpicoll.ALGORITHMS   # the all-reduce algorithms, "mpi" (the MPI library's own) included
    h = mpicoll.allreduce_init(sendbuf, recvbuf, op=MPI.SUM, algorithm="auto", comm=None)
    h()                  # persistent: decided and allocated once (also reduce_scatter_block_init,
                         # allgather_init, bcast_init; mpicoll.persistent)

For training loops (docs/training.md): ``iallreduce``, ``ireduce_scatter_block``,
``iallgather``, ``ibcast`` return a ``Request`` (``test()``, ``wait(timeout=None)``, ``done``;
``waitall(requests)``), run by a progress thread while the caller computes; ``Buckets`` reduce
gradients in DDP-style buckets; ``compress="bf16" | "fp16" | "int8"`` and ``ErrorFeedback``
narrow what crosses the wire.

Buffers: any C-contiguous numpy array, or an object with the buffer protocol
(``array.array``, ``memoryview``, ``bytearray``), ``__array_interface__`` or ``__dlpack__`` (CPU
tensors), used in place without a copy. ``mpicoll.Comm(comm)`` (``mpicoll.wrap``) is a drop-in
for mpi4py code: ``Allreduce``, ``Reduce_scatter_block``, ``Allgather``, ``Bcast`` and their
``I*`` and ``*_init`` forms, with mpi4py's buffer specs, run mpicoll's algorithms
(``mpicoll.comm``).

When a rank dies, every survivor's call raises ``ProcessFailed`` naming it within seconds, and
``mpicoll.shrink(comm)`` gives the survivors' communicator; ``mpicoll.stats(comm)`` names the
straggler (``mpicoll.recovery``, docs/reliability.md). ``mpicoll.elastic.run(train, state)``
trains on through such deaths, from a state committed in memory (docs/elastic.md).
"""

import importlib

from .errors import (ArgumentMismatch, CollectiveTimeout, CommunicatorBroken, ConcurrentCall,
                     PeerError, ProcessFailed)

__version__ = "0.1.0"
# name -> the module that defines it, loaded on first use: ``import mpicoll`` stays cheap and
# leaves MPI alone (``mpi4py.MPI``, imported by the API, initialises MPI), so commands that need
# no MPI (``mpicoll trace``, ``model`` ...) never start it.
_LAZY = {**dict.fromkeys(("allreduce", "reduce_scatter_block", "allgather", "bcast", "ALGORITHMS",
                          "iallreduce", "ireduce_scatter_block", "iallgather", "ibcast",
                          "waitall", "Request"), "api"),
         **dict.fromkeys(("allreduce_init", "reduce_scatter_block_init", "allgather_init",
                          "bcast_init"), "persistent"),
         "Buckets": "buckets", "ErrorFeedback": "compression", "Comm": "comm", "wrap": "comm",
         "shrink": "recovery", "stats": "recovery"}
__all__ = list(_LAZY) + ["CollectiveTimeout", "ArgumentMismatch", "CommunicatorBroken",
                         "ProcessFailed", "PeerError", "ConcurrentCall",
                         "__version__"]


def __getattr__(name: str):
    if name in ("reproducible", "elastic"):    # submodules: mpicoll.reproducible.sum(...),
        return importlib.import_module(f".{name}", __name__)
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'mpicoll' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
