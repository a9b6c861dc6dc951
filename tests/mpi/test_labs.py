"""lab_bytes under MPI: the MPI executor's counters give the seeds' formulas, and the same bytes
the in-process executor counts."""

import sys
from pathlib import Path

import pytest

from mpicoll.testing import agree

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "jobs" / "labs"))
import lab_bytes  # noqa: E402

pytestmark = pytest.mark.mpi


def test_lab_bytes_counters(comm):
    n, count = comm.size, 1000 * comm.size
    V = 8 * count
    got = lab_bytes.measure_mpi(comm, count)     # checks the sums itself (assert on this rank)
    want = {"ring": (2 * (n - 1) * V // n,) * 2, "naive": ((n - 1) * V,) * 2,
            "star": ((n - 1) * V,) * 2 if comm.rank == 0 else (V, V)}
    agree(comm, got == want, f"bytes (sent, received) {got}, expected {want}")
    counted = lab_bytes.count_inprocess(n, count)[comm.rank]
    agree(comm, got == counted, f"MPI counted {got}, the in-process executor {counted}")
