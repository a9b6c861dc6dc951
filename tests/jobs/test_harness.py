"""The MPI test harness turns a failure on one rank into a clear, fast end of the run."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mpicoll.testing import MPIEXEC

# tests/run.sh runs tests/jobs on two pytest-xdist workers (--dist loadgroup): the tests whose
# subject is a deadline run one after another, on one worker.
pytestmark = pytest.mark.xdist_group("deadlines")

ROOT = Path(__file__).resolve().parents[2]


def run_case(case: str, ranks: int = 3, timeout: int = 120):
    assert MPIEXEC, "mpiexec not found next to python or on PATH (pip install .[mpich])"
    env = dict(os.environ, MPICOLL_HARNESS_CASE=case, PYTHONPATH=str(ROOT))
    start = time.monotonic()
    proc = subprocess.run(
        [MPIEXEC, "-n", str(ranks), sys.executable, "-m", "mpi4py", "-m", "pytest", "--with-mpi",
         "-x", "-q", "-p", "no:cacheprovider", "--timeout=10", "--timeout-method=thread",
         str(ROOT / "tests/mpi/deliberately_failing.py")],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    return proc, time.monotonic() - start


def test_assert_on_one_rank_ends_the_run():
    proc, elapsed = run_case("assert")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "deliberate failure on rank 1" in out, out[-2000:]
    assert elapsed < 60, f"took {elapsed:.1f} s"


def test_stuck_rank_is_ended_by_the_timeout():
    proc, elapsed = run_case("hang")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "Timeout" in out and "test_rank_stuck_in_receive" in out, out[-2000:]
    assert elapsed < 60, f"took {elapsed:.1f} s"


@pytest.mark.parametrize("case", ["none"])
def test_cases_pass_when_not_triggered(case):
    proc, _ = run_case(case, ranks=2)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-2000:]
