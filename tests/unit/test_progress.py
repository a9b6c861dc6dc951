"""The progress executor's thread level: below MPI_THREAD_MULTIPLE the caller drives progress."""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)


def test_below_thread_multiple_the_caller_drives_progress():
    """With MPI initialised at MPI_THREAD_SERIALIZED, auto picks caller-driven progress and
    MPICOLL_PROGRESS=thread raises naming the level (a fresh process: the level is fixed at
    MPI_Init)."""
    code = """if True:
        import mpi4py
        mpi4py.rc.thread_level = "serialized"
        import numpy as np
        from mpi4py import MPI
        import mpicoll
        from mpicoll.executors import progress
        from mpicoll.testing import environment
        assert MPI.Query_thread() < MPI.THREAD_MULTIPLE
        assert progress.mode() == "caller"
        with environment(MPICOLL_PROGRESS="thread"):
            try:
                progress.mode()
                raise SystemExit("no error")
            except RuntimeError as exc:
                assert "MPI_THREAD_SERIALIZED" in str(exc), exc
        x = np.arange(5.0)
        assert np.array_equal(mpicoll.iallreduce(x, comm=MPI.COMM_SELF).wait(), x)
        print("ok")
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "MPICOLL_PROGRESS"))}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr
