"""Cases that must END a run cleanly, not stall it: run only by tests/jobs/test_harness.py.

(Not named test_*.py, so the normal MPI run never collects them.)
"""

import os


def test_bare_assert_on_one_rank(comm):
    """Rank 1 fails a plain assert while the others wait for it in a barrier."""
    if os.environ.get("MPICOLL_HARNESS_CASE") != "assert":
        return
    if comm.rank == 1:
        assert False, "deliberate failure on rank 1"
    comm.Barrier()


def test_rank_stuck_in_receive(comm):
    """Rank 0 waits for a message nobody sends: the per-test timeout must end the job."""
    if os.environ.get("MPICOLL_HARNESS_CASE") != "hang":
        return
    if comm.rank == 0:
        comm.recv(source=1, tag=99)
    comm.Barrier()
