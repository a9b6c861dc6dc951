"""MPI test harness: run with ``mpiexec -n N python -m mpi4py -m pytest --with-mpi tests/mpi``.

* ``python -m mpi4py``: a rank that exits with an error calls MPI_Abort, so the job dies instead
  of leaving the other ranks waiting;
* ``--timeout N --timeout-method=thread`` (pytest-timeout): a test stuck in a blocking MPI call
  dumps every stack and exits the process, which brings the job down the same way;
* ``-x``: the first failure ends the run on every rank (assertions go through
  ``mpicoll.testing.agree``, so all ranks fail the same test together);
* the ``comm`` fixture hands each test a fresh duplicate of COMM_WORLD, so nothing left over
  from one test can be matched by the next.
Rank counts: every test runs at N = 1..4 (one rank, powers of two, an odd count that folds).
A test whose subject is not the rank count carries a mark that skips it elsewhere, saying so:
``@pytest.mark.rank_counts(1, 2, 4)`` where nothing it calls depends on N (buffer kinds, dtypes,
the drop-in's argument forms, the cache of plans; every algorithm at N = 3 is in
test_collectives and test_forms), ``max_ranks(4)`` for allocations (an odd count takes other
steps), ``max_ranks(5)`` for the forms or executors agreeing. At 5 and 8 ranks (oversubscribed:
each call ~10x slower) the run keeps the tests about the rank count itself: every algorithm
against MPI, the plan shared by every form, segments, shm, fail-fast and the soak.
Tests of a shared-memory algorithm (``shm``) are skipped when the ranks span several nodes
(the Slurm runs); its refusal there is tested in ``test_shm.py``.
Ranks other than 0 report tersely (``-qq --tb=line``) unless ``MPICOLL_TEST_VERBOSE=1``.
"""

import os

import pytest
from mpi4py import MPI


def pytest_configure(config):
    world = MPI.COMM_WORLD
    if world.Get_rank() != 0 and not os.environ.get("MPICOLL_TEST_VERBOSE"):
        config.option.verbose = -2
        config.option.tbstyle = "line"


def one_node() -> bool:
    """Whether every rank of COMM_WORLD shares one node (collective: call it on every rank)."""
    local = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return MPI.COMM_WORLD.allreduce(local.Get_size() == MPI.COMM_WORLD.Get_size(), MPI.LAND)
    finally:
        local.Free()


def pytest_collection_modifyitems(config, items):
    """Skip the tests marked for fewer ranks than COMM_WORLD has, and the parametrized cases of
    a shared-memory algorithm across nodes."""
    size = MPI.COMM_WORLD.Get_size()
    for item in items:
        marker = item.get_closest_marker("max_ranks")
        if marker is not None and size > marker.args[0]:
            item.add_marker(pytest.mark.skip(
                reason=f"the rank count is not its subject: runs at N <= {marker.args[0]}"))
        marker = item.get_closest_marker("rank_counts")
        if marker is not None and size not in marker.args:
            item.add_marker(pytest.mark.skip(
                reason=f"the rank count is not its subject: runs at N in {marker.args}"))
    if one_node():
        return
    from mpicoll.registry import ALLREDUCE
    skip = pytest.mark.skip(reason="shm runs on one node only (its refusal: test_shm.py)")
    for item in items:
        algorithm = getattr(item, "callspec", None) and item.callspec.params.get("algorithm")
        if isinstance(algorithm, str) and algorithm in ALLREDUCE \
                and ALLREDUCE[algorithm].has("shared-memory"):
            item.add_marker(skip)


def pytest_sessionstart(session):
    """pytest-mpi prints an "MPI Information" section; keep only rank 0's."""
    if MPI.COMM_WORLD.Get_rank() != 0:
        for plugin in session.config.pluginmanager.get_plugins():
            if type(plugin).__name__ == "MPIPlugin":
                plugin._is_testing_mpi = False


def pytest_report_header(config):
    return (f"MPI: {MPI.COMM_WORLD.Get_size()} ranks, "
            f"{MPI.Get_library_version().splitlines()[0].strip()}")


@pytest.fixture
def comm():
    dup = MPI.COMM_WORLD.Dup()
    yield dup
    dup.Free()


@pytest.fixture
def background_start(comm):
    """``MPICOLL_BACKGROUND_START=1`` for the test (the default, set again whatever the
    environment says), skipped where the background start cannot run: one rank, no progress
    thread, an MPI library it is off under."""
    from mpicoll.executors import background, progress
    from mpicoll.testing import environment
    if comm.size < 2:
        pytest.skip("needs two ranks")
    if progress.mode() != "thread":
        pytest.skip("the background start needs the progress thread (MPI_THREAD_MULTIPLE)")
    if not background._library_allows():
        pytest.skip("the background start is off under this MPI library (docs/reliability.md)")
    with environment(MPICOLL_BACKGROUND_START="1"):
        yield
