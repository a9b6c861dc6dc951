"""mpi4py's own collective suites through ``mpicoll.Comm`` (issue 21, item 4).

Run with ``mpiexec -n N python -m mpi4py -m pytest tests/dropin --with-mpi`` (tests/run.sh: the
"drop-in" leg, N = 2 and 3). Options:

* ``--mpi4py-sdist PATH``: the mpi4py source release whose ``test/`` directory is run (default:
  ``pip download`` of the installed mpi4py's version, into a temporary directory; pip's cache
  makes that quick after the first time). If pip can't get it the suites are skipped, with the
  reason -- except under ``CI=true``, where that is a failure;
* ``--dropin-algorithm NAME`` (default ``auto``): the wrapper's ``algorithm``, for every call.

Ranks other than 0 report tersely, as in tests/mpi.
"""

import os

from mpi4py import MPI

import mpi4py_suites


def pytest_addoption(parser):
    parser.addoption("--mpi4py-sdist", default=None,
                     help="an mpi4py sdist (.tar.gz) whose test/ to run (default: pip download)")
    parser.addoption("--dropin-algorithm", default="auto",
                     help="mpicoll.Comm's algorithm for every call (default auto)")


def pytest_configure(config):
    mpi4py_suites.OPTIONS.update(sdist=config.getoption("--mpi4py-sdist"),
                                 algorithm=config.getoption("--dropin-algorithm"))
    if MPI.COMM_WORLD.Get_rank() != 0 and not os.environ.get("MPICOLL_TEST_VERBOSE"):
        config.option.verbose = -2
        config.option.tbstyle = "line"


def pytest_sessionstart(session):
    """pytest-mpi prints an "MPI Information" section; keep only rank 0's."""
    if MPI.COMM_WORLD.Get_rank() != 0:
        for plugin in session.config.pluginmanager.get_plugins():
            if type(plugin).__name__ == "MPIPlugin":
                plugin._is_testing_mpi = False


def pytest_terminal_summary(terminalreporter):
    if MPI.COMM_WORLD.Get_rank() != 0 or not mpi4py_suites.COUNTS:
        return
    ran = ", ".join(f"{c} {n}" for c, n in sorted(mpi4py_suites.COUNTS.items()))
    fell = ", ".join(f"{m} {n}" for m, n in sorted(mpi4py_suites.FALLBACKS.items())) or "none"
    terminalreporter.write_line(f"mpicoll ran (calls, per collective, rank 0): {ran}")
    terminalreporter.write_line(f"handed to MPI by fallback=True (long double, "
                                f"__cuda_array_interface__): {fell}")
