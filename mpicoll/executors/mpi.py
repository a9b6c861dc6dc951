"""``mpicoll.executors.mpi``: the Python executor's former name (``executors.python``), kept for
the code and docs that use it."""

from .python import *               # noqa: F401,F403
from .python import __all__         # noqa: F401
