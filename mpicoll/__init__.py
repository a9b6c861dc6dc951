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
"""

from .errors import ArgumentMismatch, CollectiveTimeout, CommunicatorBroken

__version__ = "0.1.0"
__all__ = ["allreduce", "reduce_scatter_block", "allgather", "bcast", "ALGORITHMS",
           "allreduce_init", "reduce_scatter_block_init", "allgather_init", "bcast_init",
           "CollectiveTimeout", "ArgumentMismatch", "CommunicatorBroken", "__version__"]
_API = ("allreduce", "reduce_scatter_block", "allgather", "bcast", "ALGORITHMS")
_PERSISTENT = ("allreduce_init", "reduce_scatter_block_init", "allgather_init", "bcast_init")


def __getattr__(name: str):
    """The collectives, loaded from ``mpicoll.api`` on first use: ``import mpicoll`` stays cheap
    and leaves MPI alone (``mpi4py.MPI``, imported by the API, initialises MPI), so commands
    that need no MPI (``mpicoll trace``, ``model`` ...) never start it."""
    if name in _API or name in _PERSISTENT:
        from . import api, persistent      # persistent builds on api (api can't import it back)
        globals()[name] = value = getattr(api if name in _API else persistent, name)
        return value
    raise AttributeError(f"module 'mpicoll' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API) | set(_PERSISTENT))
