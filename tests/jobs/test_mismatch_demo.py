"""The mismatch demo (jobs/experiments/mismatch_demo.py) as a test: rank 0 passes 10 elements, rank 1 passes
20, no ``validate``, a 1 s deadline; for every algorithm of every collective (and iallreduce,
allreduce_init) every rank raises ``ArgumentMismatch`` naming both counts within 2 s -- except
the documented bcast-root limit -- and nobody hangs (one job, bounded)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mpicoll.api import ALGORITHMS
from mpicoll.registry import COLLECTIVES
from mpicoll.testing import MPIEXEC

# tests/run.sh runs tests/jobs on two pytest-xdist workers (--dist loadgroup): the tests whose
# subject is a deadline run one after another, on one worker.
pytestmark = pytest.mark.xdist_group("deadlines")

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 240             # seconds for the whole job (~30 cases of ~1-1.5 s, plus start-up)


def test_mismatch_demo(tmp_path):
    assert MPIEXEC, "mpiexec not found next to python or on PATH (pip install .[mpich])"
    out = tmp_path / "demo.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT), MPICOLL_TIMEOUT="1", MPIEXEC_TIMEOUT=str(LIMIT))
    env.pop("MPICOLL_VALIDATE", None)
    proc = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "jobs/experiments/mismatch_demo.py",
                           "--within", "2", "--json", str(out)],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=LIMIT + 30)
    log = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0, log
    result = json.loads(out.read_text())
    cases = {c["case"]: c for c in result["cases"]}
    expected = ({f"allreduce {a}" for a in ALGORITHMS + ("auto",)}
                | {f"{c} {a}" for c in ("reduce_scatter_block", "allgather", "bcast")
                   for a in tuple(COLLECTIVES[c]) + ("auto",)}
                | {f"{c} {a}" for c in ("iallreduce", "allreduce_init")
                   for a in ("ring", "recursive_doubling", "mpi", "auto")})
    assert set(cases) == expected, log
    for name, case in cases.items():
        ranks = case["ranks"]
        assert len(ranks) == 2
        if case["root_returned"]:       # the documented limit: a bcast root whose sends completed
            assert name.startswith("bcast"), log
            assert ranks[0]["raised"] == "returned" and "unchanged" in ranks[0]["message"]
            assert ranks[1]["raised"] == "ArgumentMismatch" and "count=20" in ranks[1]["message"]
            assert "rank(s) [0] sent" in ranks[1]["message"] and ranks[1]["seconds"] <= 2
            continue
        assert case["ok"], f"{name}: {ranks}"
        for rank in ranks:
            assert rank["raised"] == "ArgumentMismatch", f"{name}: {rank}"
            assert "count: 10 on rank(s) [0], 20 on rank(s) [1]" in rank["message"], rank
            assert rank["seconds"] <= 2, f"{name}: {rank}"
    # every allreduce algorithm: both ranks raise (no root to return)
    assert all(cases[f"allreduce {a}"]["ok"] for a in ALGORITHMS + ("auto",))
