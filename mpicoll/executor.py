"""``mpicoll.executor``: the Python executor, ``mpicoll.executors.python`` (this name is kept for
the code and docs that use it)."""

from .executors.python import *            # noqa: F401,F403
from .executors.python import __all__      # noqa: F401
