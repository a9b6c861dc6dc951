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


def test_fabric_stack_refuses_pairs_on_one_node_and_measures_them_when_allowed(tmp_path):
    """jobs/experiments/fabric_stack.py (docs/fabric.md): its pairs must cross nodes; ``--allow-plain``
    measures them anyway (here: shared memory) and the model's numbers follow from the rates."""
    job = [MPIEXEC, "-n", "2", sys.executable, "-m", "mpi4py",
           str(ROOT / "jobs/experiments/fabric_stack.py"), "--outdir", str(tmp_path), "--size", "1M", "-n", "2"]
    run = dict(cwd=ROOT, capture_output=True, text=True, timeout=120,
               env=dict(os.environ, PYTHONPATH=str(ROOT)))
    proc = subprocess.run(job, **run)
    assert proc.returncode == 2 and "on different nodes; got 2 rank(s) on 1 node(s)" in proc.stdout
    assert not (tmp_path / "fabric_stack.json").exists()
    proc = subprocess.run(job + ["--allow-plain", "--nodes-per-host", "2"], **run)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    res = json.loads((tmp_path / "fabric_stack.json").read_text())
    assert (res["shaped"], res["nranks"], res["nodes"], res["size"]) == (False, 2, 1, 1 << 20)
    assert res["one_flow_Bps"] > 0 and res["all_flows_Bps"] > 0
    assert res["stack_per_flow"] == res["one_flow_Bps"]
    assert res["stack"] == 2 * res["all_flows_Bps"]         # both ends of a byte on one host
    assert res["intra_pairs_ranks"] == 2 and res["copy"] > 0   # the two ranks share the node


def test_fabric_bench_times_the_variants_asked_and_tables_auto_against_mpi(tmp_path):
    """jobs/experiments/fabric_bench.py --variants/--tag (docs/fabric.md, *auto without a table*): only
    those variants, in a file named with the tag that records auto's profile; --table prints
    auto's choice and MPI's time over auto's from it, without MPI."""
    run = dict(cwd=ROOT, capture_output=True, text=True, timeout=200,
               env=dict(os.environ, PYTHONPATH=str(ROOT), MPICOLL_RANKS_PER_NODE="1"))
    proc = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "-m", "mpi4py",
                           str(ROOT / "jobs/experiments/fabric_bench.py"), "--outdir",
                           str(tmp_path), "--quick", "--variants", "ring,auto,mpi", "--tag", "probe"], **run)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    [path] = tmp_path.glob("fabric-bench-*-probe.json")
    data = json.loads(path.read_text())
    assert data["variants"] == ["ring", "auto", "mpi"]
    assert {r["algorithm"] for r in data["records"]} == {"ring", "auto", "mpi"}
    assert data["profile"]["path"] and data["profile"]["beta"] > 0
    proc = subprocess.run([sys.executable, str(ROOT / "jobs/experiments/fabric_bench.py"),
                           "--table", str(path)], **run)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| 8 B")]
    auto = next(r for r in data["records"] if r["algorithm"] == "auto" and r["size"] == 8)
    mpi = next(r for r in data["records"] if r["algorithm"] == "mpi" and r["size"] == 8)
    assert len(rows) == 1 and f"| {auto['auto_choice']} |" in rows[0]
    assert rows[0].endswith(f"| {mpi['time_us'] / auto['time_us']:.2f}x |")
    # --at: every variant at one size, the file's row named by its tag
    proc = subprocess.run([sys.executable, str(ROOT / "jobs/experiments/fabric_bench.py"),
                           "--at", "8", str(path)], **run)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert "| ring | auto | mpi |" in lines[2]
    [row] = [line for line in lines if "| probe |" in line]
    cells = [c.strip() for c in row.strip("|").split("|")][2:]
    want = [next(r["time_us"] for r in data["records"] if r["algorithm"] == v
                 and r["size"] == 8 and not r["inplace"]) for v in ("ring", "auto", "mpi")]
    assert cells == [f"{t:.0f}" for t in want]


def test_lab_bytes_counters_under_mpiexec(tmp_path):
    """jobs/labs/lab_bytes.py at N = 2 and 3 (sub-communicators of one ``mpiexec -n 3`` job):
    the MPI executor's counters give the seeds' formulas on every rank, and the same bytes the
    in-process executor counts."""
    proc = subprocess.run([MPIEXEC, "-n", "3", sys.executable, "-m", "mpi4py",
                           str(ROOT / "jobs/labs/lab_bytes.py"), "--max-n", "3", "--json",
                           str(tmp_path / "b.json")], cwd=ROOT, capture_output=True, text=True,
                          timeout=240, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    res = json.loads((tmp_path / "b.json").read_text())
    V = res["V"]
    assert res["mpi_ranks"] == 3 and [r["N"] for r in res["rows"]] == [2, 3]
    for row in res["rows"]:
        n = row["N"]
        want = [{"ring": [2 * (n - 1) * V // n] * 2, "naive": [(n - 1) * V] * 2,
                 "star": [(n - 1) * V] * 2 if rank == 0 else [V, V]} for rank in range(n)]
        assert row["source"] == "MPI" and row["per_rank"] == want, row
        assert row["mpi_equals_inprocess"], f"N={n}: MPI counted other bytes than in-process"
