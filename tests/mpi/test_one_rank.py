"""One rank differs from the others (issue 9, defect 1), and bad settings (defect 4).

* a recvbuf of another shape but the same element count on one rank is simply a valid call;
* a rank whose call fails *after* its argument checks -- a setting only it has, a node layout
  only it sees -- leaves no rank waiting: with ``validate=True`` the others raise
  ``ArgumentMismatch`` naming it, without it ``PeerError`` naming it and its message, within
  2 s, from the notice it posts (issue 22; before: ``CollectiveTimeout`` at the deadline);
* a bad ``MPICOLL_*`` value raises on every rank, naming the variable, before any communication.

Each case runs on a fresh communicator (``comm`` fixture) under the suite's per-test timeout.
"""

import numpy as np
import pytest
from mpi4py import MPI

import mpicoll
from mpicoll._runtime import context
from mpicoll.registry import ALLREDUCE
from mpicoll.testing import agree, environment, raises_everywhere

pytestmark = pytest.mark.mpi
ODD = 1                 # the rank that differs
TIMEOUT = 2.0           # seconds: how long the others wait for it without validate


def needs_three(comm):
    if comm.size < 3:
        pytest.skip("needs three ranks")


@pytest.mark.parametrize("validate", [False, True])
@pytest.mark.parametrize("algorithm", list(ALLREDUCE) + ["auto"])
def test_allreduce_recvbuf_of_another_shape_on_one_rank(comm, algorithm, validate):
    """Rank 1 passes recvbuf of shape (2, 2), the others (4,): same count, a valid call."""
    needs_three(comm)
    recv = np.empty((2, 2)) if comm.rank == ODD else np.empty(4)
    send = np.arange(4.0) + comm.rank
    out = mpicoll.allreduce(send, recv, algorithm=algorithm, comm=comm, validate=validate)
    want = (np.arange(4.0) * comm.size + sum(range(comm.size))).reshape(recv.shape)
    agree(comm, out is recv and np.array_equal(out, want), f"{out!r}")


@pytest.mark.parametrize("validate", [False, True])
def test_other_collectives_recvbuf_of_another_shape_on_one_rank(comm, validate):
    needs_three(comm)
    size, odd = comm.size, comm.rank == ODD
    gathered = mpicoll.allgather(np.full(4, comm.rank), np.empty((size * 2, 2) if odd else
                                                                  (size, 4), np.int64),
                                 comm=comm, validate=validate)
    ok = np.array_equal(gathered.reshape(size, 4), np.repeat(np.arange(size), 4).reshape(size, 4))
    block = mpicoll.reduce_scatter_block(np.arange(4.0 * size), np.empty((2, 2) if odd else 4),
                                         comm=comm, validate=validate)
    want = size * np.arange(4.0 * size)[comm.rank * 4:][:4]
    agree(comm, ok and np.array_equal(block.reshape(-1), want), f"{gathered!r} {block!r}")


def _kernels(comm, **options):
    with environment(MPICOLL_KERNELS="foo" if comm.rank == ODD else None):
        return mpicoll.allreduce(np.ones(8), algorithm="ring", comm=comm, **options)


def _tuning(comm, **options):
    with environment(MPICOLL_TUNING="/nonexistent.json" if comm.rank == ODD else None):
        return mpicoll.allreduce(np.ones(8), comm=comm, **options)


def _uneven_nodes(comm, **options):
    # only rank 1 sees nodes of 2 ranks, so at N = 3 nodes of 2 and 1: inner='ring' is refused
    # there -- after the node layout was found (communication), before the agreement step
    with environment(MPICOLL_RANKS_PER_NODE="2" if comm.rank == ODD else None):
        return mpicoll.allreduce(np.ones(8), algorithm="hierarchical", inner="ring", comm=comm,
                                 **options)


# name -> (the call, what rank 1 raises, its message)
LATE = {
    "MPICOLL_KERNELS on one rank": (_kernels, ValueError, "MPICOLL_KERNELS must be 'numba' or "
                                                          "'numpy', got 'foo'"),
    "MPICOLL_TUNING on one rank": (_tuning, ValueError,
                                   "MPICOLL_TUNING=/nonexistent.json: no such file"),
    "uneven nodes on one rank": (_uneven_nodes, ValueError,
                                 "hierarchical inner='ring' needs the same number of ranks on "
                                 "every node"),
}


def skip_uneven_nodes_unless_one_node(comm, name):
    """The uneven-nodes case needs every rank but one to see a single node (nodes of 2 ranks
    are even at an even N; on several real nodes the others see uneven nodes too)."""
    if name != "uneven nodes on one rank":
        return
    if comm.size % 2 == 0:
        pytest.skip("nodes of 2 ranks are even at an even N")
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    spans = comm.allreduce(local.Get_size() != comm.Get_size(), op=MPI.LOR)
    local.Free()
    if spans:
        pytest.skip("the ranks span several nodes: every rank sees uneven nodes")


@pytest.mark.parametrize("warm", [False, True], ids=["first call", "warm"])
@pytest.mark.parametrize("name", list(LATE))
def test_one_rank_fails_after_its_argument_checks_with_validate(comm, name, warm):
    """Rank 1 raises its own error; the others ArgumentMismatch naming it; nobody waits."""
    needs_three(comm)
    skip_uneven_nodes_unless_one_node(comm, name)
    if warm:
        mpicoll.allreduce(np.ones(2), comm=comm)
    call, exc, match = LATE[name]
    try:
        call(comm, validate=True, timeout=60.0)
        got = None
    except Exception as error:      # noqa: BLE001 - checked below, on every rank
        got = error
    if comm.rank == ODD:
        ok = isinstance(got, exc) and match in str(got)
    else:
        ok = (isinstance(got, mpicoll.ArgumentMismatch) and got.ranks == [ODD]
              and f"rank(s) [{ODD}] rejected their own arguments ({exc.__name__})" in str(got))
    agree(comm, ok, f"{type(got).__name__}: {got}")
    out = mpicoll.allreduce(np.ones(3), comm=comm, validate=True)
    agree(comm, np.array_equal(out, np.full(3, comm.size)), "the communicator still works")


@pytest.mark.parametrize("warm", [False, True], ids=["first call", "warm"])
@pytest.mark.parametrize("name", list(LATE))
def test_one_rank_fails_after_its_argument_checks_without_validate(comm, name, warm):
    """Without validate rank 1 posts a notice (``_runtime/notice.py``): the others raise
    PeerError naming it and its error within 2 s, long before the deadline. Rank 1 raises its
    own error at once."""
    needs_three(comm)
    skip_uneven_nodes_unless_one_node(comm, name)
    if warm:
        mpicoll.allreduce(np.ones(2), comm=comm)
    call, exc, match = LATE[name]
    start = MPI.Wtime()
    try:
        call(comm, validate=False, timeout=TIMEOUT)
        got = None
    except Exception as error:      # noqa: BLE001 - checked below, on every rank
        got = error
    elapsed = MPI.Wtime() - start
    if comm.rank == ODD:
        ok = isinstance(got, exc) and match in str(got) and elapsed < TIMEOUT
    else:
        ok = (isinstance(got, mpicoll.PeerError) and got.ranks == [ODD]
              and match in str(got) and elapsed < 2.0)
    agree(comm, ok, f"{type(got).__name__}: {got} after {elapsed:.2f} s")


def test_one_rank_with_another_node_layout_is_named_by_validate(comm):
    """MPICOLL_RANKS_PER_NODE on one rank only: every rank's own checks pass, but the layouts
    differ (so would the schedules); validate=True says so on every rank."""
    needs_three(comm)
    k = "1" if comm.rank == ODD else str(comm.size)
    with environment(MPICOLL_RANKS_PER_NODE=k):
        exc = raises_everywhere(comm, mpicoll.ArgumentMismatch, mpicoll.allreduce, np.ones(8),
                                algorithm="hierarchical", inner="binomial", comm=comm,
                                validate=True, match=r"node layout \(MPICOLL_RANKS_PER_NODE\): "
                                r"layout #\w+ on rank\(s\) \[0")
    agree(comm, exc.ranks == [ODD], repr(exc.fields))


# variable, value, a call that needs it, the message
SETTINGS = [
    ("MPICOLL_TUNING", "/nonexistent.json", "auto", "MPICOLL_TUNING=/nonexistent.json: no such "
                                                    "file"),
    ("MPICOLL_PROFILE", "/nonexistent.json", "auto", "MPICOLL_PROFILE=/nonexistent.json: no "
                                                     "such file"),
    ("MPICOLL_SHORT_MSG", "8Q", "auto", "MPICOLL_SHORT_MSG must be a number of bytes"),
    ("MPICOLL_KERNELS", "foo", "ring", "MPICOLL_KERNELS must be 'numba' or 'numpy', got 'foo'"),
    ("MPICOLL_RANKS_PER_NODE", "0", "auto", "MPICOLL_RANKS_PER_NODE must be a positive integer, "
                                            "got '0'"),
    ("MPICOLL_RANKS_PER_NODE", "abc", "hierarchical", "MPICOLL_RANKS_PER_NODE must be a positive "
                                                      "integer, got 'abc'"),
    ("MPICOLL_HIER_INNER", "foo", "hierarchical",
     r"unknown inner \(or MPICOLL_HIER_INNER\) 'foo'"),
    ("MPICOLL_TIMEOUT", "soon", "ring",
     "MPICOLL_TIMEOUT must be a number of seconds > 0, or 0 or inf"),
]


@pytest.mark.parametrize("variable, value, algorithm, match", SETTINGS)
def test_bad_setting_raises_everywhere_before_communicating(comm, variable, value, algorithm,
                                                            match):
    """Every rank raises ValueError naming the variable, and mpicoll never touched the
    communicator (no presence check, no duplicate made)."""
    with environment(**{variable: value}):
        raises_everywhere(comm, ValueError, mpicoll.allreduce, np.ones(8), algorithm=algorithm,
                          comm=comm, match=match)
    st = context.attach(comm)
    untouched = not st.made and st._dup is None
    agree(comm, untouched, "mpicoll communicated first")
    out = mpicoll.allreduce(np.ones(3), algorithm=algorithm, comm=comm)
    agree(comm, np.array_equal(out, np.full(3, comm.size)), "fine once the variable is unset")


@pytest.mark.parametrize("bad", [{"timeout": -1.0}, {"on_timeout": "retry"}],
                         ids=["timeout=-1", "on_timeout='retry'"])
def test_bad_option_on_one_rank_with_validate(comm, bad):
    """A bad reliability option is checked when the call starts (``Call``); with validate the
    rank still takes part in the agreement step, flagged, so the others name it (before, it
    raised without taking part and the others waited for it)."""
    needs_three(comm)
    options = dict({"timeout": 60.0}, **(bad if comm.rank == ODD else {}))
    try:
        mpicoll.allreduce(np.ones(4), comm=comm, validate=True, **options)
        got = None
    except Exception as error:      # noqa: BLE001 - checked below, on every rank
        got = error
    if comm.rank == ODD:
        ok = isinstance(got, ValueError) and not isinstance(got, mpicoll.ArgumentMismatch)
    else:
        ok = isinstance(got, mpicoll.ArgumentMismatch) and got.ranks == [ODD]
    agree(comm, ok, f"{type(got).__name__}: {got}")
