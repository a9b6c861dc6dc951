"""``mpicoll.simulate``: the in-process executor, ``mpicoll.executors.inprocess`` (this name is kept
for the code and docs that use it)."""

from .executors.inprocess import *            # noqa: F401,F403
from .executors.inprocess import __all__, __doc__  # noqa: F401
