"""mpicoll: collective algorithms written as schedules over mpi4py point-to-point calls.

    import mpicoll
    from mpi4py import MPI
    mpicoll.allreduce(sendbuf, recvbuf=None, op=MPI.SUM, algorithm="auto", comm=None)
    mpicoll.reduce_scatter_block(sendbuf, recvbuf=None, op=MPI.SUM, algorithm="auto", comm=None)
    mpicoll.allgather(sendbuf, recvbuf=None, algorithm="auto", comm=None)
    mpicoll.bcast(buf, root=0, algorithm="auto", comm=None)
    mpicoll.ALGORITHMS   # the all-reduce algorithms, "mpi" (the MPI library's own) included

For training loops (docs/training.md): ``iallreduce``, ``ireduce_scatter_block``,
``iallgather``, ``ibcast`` return a ``Request`` (``test()``, ``wait(timeout=None)``, ``done``;
``waitall(requests)``), run by a progress thread while the caller computes; ``Buckets`` reduce
gradients in DDP-style buckets; ``compress="bf16" | "fp16" | "int8"`` and ``ErrorFeedback``
narrow what crosses the wire.
"""

from .api import ALGORITHMS, allgather, allreduce, bcast, reduce_scatter_block
from .errors import ArgumentMismatch, CollectiveTimeout, CommunicatorBroken
from .api import Request, iallgather, iallreduce, ibcast, ireduce_scatter_block, waitall
from .buckets import Buckets
from .compression import ErrorFeedback

__version__ = "0.1.0"
__all__ = ["allreduce", "reduce_scatter_block", "allgather", "bcast", "ALGORITHMS",
           "CollectiveTimeout", "ArgumentMismatch", "CommunicatorBroken", "__version__",
           "iallreduce", "ireduce_scatter_block", "iallgather", "ibcast", "waitall", "Request",
           "Buckets", "ErrorFeedback"]
