"""``mpicoll.executor``: the MPI executor, ``mpicoll.executors.mpi`` (this name is kept for the code
and docs that use it)."""

from .executors.mpi import *            # noqa: F401,F403
from .executors.mpi import __all__  # noqa: F401
