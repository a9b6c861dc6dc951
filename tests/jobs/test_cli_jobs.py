"""The command line under ``mpiexec`` (the rest is in tests/unit/test_cli.py): misuse and help
print once, and bench's output claims no more than it checked."""

import json
import os
import subprocess
import sys

import pytest

from test_harness import MPIEXEC, ROOT

pytestmark = pytest.mark.timeout(300)


def mpicoll(*argv, launcher=()):
    """``mpicoll ARGV`` in a subprocess (``launcher``: e.g. ``(mpiexec, "-n", "2")``)."""
    return subprocess.run([*launcher, sys.executable, "-m", "mpicoll", *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))


def test_misuse_and_help_under_mpiexec_print_once():
    proc = mpicoll("bench", "-e", "1X", launcher=(MPIEXEC, "-n", "2"))
    assert proc.returncode == 2
    assert proc.stdout == "" and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "not a size: '1X'" in proc.stderr
    proc = mpicoll("trace", "--help", launcher=(MPIEXEC, "-n", "2"))      # MPI not started: the launcher's rank
    assert proc.returncode == 0 and proc.stdout.count("usage: mpicoll trace") == 1, proc.stdout


def test_bench_no_check_claims_nothing_and_json_lands_in_a_new_folder(tmp_path):
    path = tmp_path / "new/folder/r.json"
    proc = mpicoll("bench", "-b", "64", "-e", "1K", "-f", "16", "-n", "2", "-w", "0", "-a",
                   "ring", "--no-check", "--json", str(path), "--csv",
                   str(tmp_path / "csv/r.csv"), launcher=(MPIEXEC, "-n", "2"))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    table = proc.stdout
    assert "all results correct" not in table and "results not checked (--no-check)" in table
    rows = [line.split() for line in table.splitlines() if line.split()[:1] in (["64"], ["1024"])]
    assert len(rows) == 4 and all(row[row.index("|") + 4] == "-" for row in rows), table
    assert "pred(us) = the cost model's time" in table and "1 GB = 1e9 B" in table
    res = json.loads(path.read_text())
    assert [r["wrong"] for r in res["records"]] == [None] * 4
    assert (tmp_path / "csv/r.csv").read_text().count("\n") == 5
    assert "results not checked" in mpicoll("report", str(path)).stdout
