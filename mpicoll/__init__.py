"""mpicoll: collective algorithms written as schedules over mpi4py point-to-point calls.

    import mpicoll
    from mpi4py import MPI
    mpicoll.allreduce(sendbuf, recvbuf=None, op=MPI.SUM, algorithm="auto", comm=None)
    mpicoll.reduce_scatter_block(sendbuf, recvbuf=None, op=MPI.SUM, algorithm="auto", comm=None)
    mpicoll.allgather(sendbuf, recvbuf=None, algorithm="auto", comm=None)
    mpicoll.bcast(buf, root=0, algorithm="auto", comm=None)
    mpicoll.ALGORITHMS   # the all-reduce algorithms, "mpi" (the MPI library's own) included
"""

from .api import ALGORITHMS, allgather, allreduce, bcast, reduce_scatter_block
from .errors import ArgumentMismatch, CollectiveTimeout, CommunicatorBroken

__version__ = "0.1.0"
__all__ = ["allreduce", "reduce_scatter_block", "allgather", "bcast", "ALGORITHMS",
           "CollectiveTimeout", "ArgumentMismatch", "CommunicatorBroken", "__version__"]
