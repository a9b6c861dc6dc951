"""The benchmark and its tools, end to end on a small sweep under mpiexec -n 4."""

import json
import os
import subprocess
import sys

import pytest

from test_harness import MPIEXEC, ROOT


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "r.json"
    proc = subprocess.run([MPIEXEC, "-n", "4", sys.executable, "-m", "mpicoll", "bench", "-b", "64",
                           "-e", "16K", "-f", "16", "-n", "3", "-w", "1", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stdout


def test_bench_json_and_table(results):
    res, table = results
    for key in ("nranks", "nodes", "ranks_per_node", "hosts", "mpi_library", "versions",
                "slurm_job_id", "slurm_nodelist", "command"):
        assert key in res, key
    assert res["nranks"] == 4 and res["versions"]["mpi4py"]
    algorithms = {r["algorithm"] for r in res["records"]}
    assert algorithms == {"ring", "recursive_halving", "recursive_doubling", "binomial",
                          "hierarchical", "double_binary_tree", "naive", "shm", "auto",
                          "mpi"}
    for r in res["records"]:
        assert r["wrong"] == 0, r
        for key in ("collective", "size", "count", "dtype", "op", "inplace", "time_us",
                    "time_us_min", "time_us_max", "algbw", "busbw", "vs_mpi", "bytes_sent",
                    "predicted_us"):
            assert key in r, key
        assert r["time_us_min"] <= r["time_us"] <= r["time_us_max"]
        assert r["busbw"] == pytest.approx(r["algbw"] * 1.5)
        if r["algorithm"] == "ring" and r["count"] % 4 == 0:
            assert r["bytes_sent"] == [1.5 * r["size"]] * 4
        if r["algorithm"] == "shm":                 # shared memory: nothing over the network
            assert r["bytes_sent"] == [0] * 4
        if r["algorithm"] == "auto":
            assert r["auto_choice"] in algorithms
    assert "all results correct" in table and "auto:" in table


def test_tools_read_the_json(results, tmp_path):
    res, _ = results
    path = tmp_path / "r.json"
    path.write_text(json.dumps(res))

    def run(*args):
        proc = subprocess.run([sys.executable, "-m", "mpicoll", *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout

    run("plot", str(path), "-o", str(tmp_path / "r.png"))
    assert (tmp_path / "r.png").stat().st_size > 10_000
    run("tune", str(path), str(path), "-o", str(tmp_path / "t.json"))
    table = json.loads((tmp_path / "t.json").read_text())["allreduce"]["4"]
    assert table[-1]["max_bytes"] == max(r["size"] for r in res["records"])   # then: the model
    assert all(t["algorithm"] != "mpi" for t in table)
    assert "| size (B) |" in run("report", str(path))
    out = run("model", "-N", "16", "-e", "1M")
    assert "crossover" in out or "best" in out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter_block", "allgather", "bcast"])
def test_bench_persistent(tmp_path, collective):
    """--persistent: mpicoll's algorithms through handles, checked; mpi stays the plain call."""
    out = tmp_path / "p.json"
    proc = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "-m", "mpicoll", "bench",
                           "--collective", collective, "--persistent", "--inplace",
                           "--outofplace", "-b", "8", "-e", "4K", "-f", "512", "-n", "3", "-w",
                           "1", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["persistent"] is True and "# --persistent" in proc.stdout
    for r in res["records"]:
        assert r["wrong"] == 0, r
        assert r["persistent"] == (r["algorithm"] != "mpi"), r


@pytest.mark.timeout(600)
@pytest.mark.parametrize("dtype, op", [("bfloat16", "sum"), ("int8", "band"), ("bool", "lxor"),
                                       ("complex64", "prod")])
def test_bench_runs_every_dtype_and_op(tmp_path, dtype, op):
    """Issue 21: `mpicoll bench -d T --op O` exits 0 for what MPI allows, every algorithm
    (shm included: mpicoll.shm reduces every pair) runs it, never a traceback (an algorithm
    that refused a pair would be left out with one line: tests/unit/test_cli.py)."""
    out = tmp_path / "r.json"
    proc = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "-m", "mpicoll", "bench", "-d",
                           dtype, "--op", op, "-b", "64", "-e", "64", "-n", "2", "-w", "0",
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=500, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    not_run = [line for line in proc.stdout.splitlines() if line.startswith("# not run")]
    assert not_run == (["# not run: mpi (the MPI library has no datatype for bfloat16: no vs_mpi "
                        "column)"] if dtype == "bfloat16" else []), not_run
    assert "all results correct" in proc.stdout
    ran = {r["algorithm"] for r in json.loads(out.read_text())["records"]}
    assert {"shm", "ring", "auto"} <= ran
    assert ("mpi" in ran) == (dtype != "bfloat16")      # no MPI datatype for bfloat16
