"""jobs/experiments/stream.py (the memory-bandwidth probe) and docs/generators/roofline.py
(busbw against it)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "generators"))   # what writes the docs' tables

import roofline  # noqa: E402


def run(*args, timeout=120):
    proc = subprocess.run([sys.executable, *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.mark.timeout(120)
def test_stream_probe_and_roofline_plot(tmp_path):
    """A tiny probe (in the cache: it says so) and a plot from a two-rank bench record set."""
    proc = run(ROOT / "jobs/experiments/stream.py", "--elements", "2^14", "--repeat", "2",
               "--threads", "1", "--json", tmp_path / "s.json")
    assert "memory-bandwidth ceiling:" in proc.stdout and "measures the cache" in proc.stderr
    s = json.loads((tmp_path / "s.json").read_text())
    rates = [r["GBps"] for impl in s["results"].values() for r in impl.values()]
    assert s["ceiling_GBps"] == max(rates) > 0
    assert set(s["results"]["numba, 1 thread"]) == {"copy", "scale", "add", "triad"}
    bench = {"nranks": 2, "nodes": 1, "collective": "allreduce", "dtype": "float32",
             "records": [{"collective": "allreduce", "algorithm": a, "size": size,
                          "inplace": False, "time_us": t}
                         for a, size, t in [("ring", 1 << 20, 500.0), ("mpi", 1 << 20, 250.0),
                                            ("ring", 1 << 10, 10.0), ("mpi", 1 << 10, 20.0)]]}
    (tmp_path / "b.json").write_text(json.dumps(bench))
    out = run(ROOT / "docs/generators/roofline.py", tmp_path / "b.json", tmp_path / "s.json", "-o",
              tmp_path / "r.png").stdout
    assert (tmp_path / "r.png").stat().st_size > 0 and "ring" in out


def test_roofline_busbw_uses_the_bus_factor():
    stream_json = {"ceiling_GBps": 10.0}
    bench = {"nranks": 4, "records": [
        {"collective": "allreduce", "algorithm": "ring", "size": 1_000_000, "inplace": False,
         "time_us": 100.0},
        {"collective": "allreduce", "algorithm": "mpi", "size": 1_000_000, "inplace": False,
         "time_us": 200.0},
        {"collective": "allreduce", "algorithm": "ring", "size": 1_000_000, "inplace": True,
         "time_us": 1.0}]}                                   # in place: not in the table
    (row,) = roofline.table(bench, stream_json)
    assert row["best"] == "ring"
    assert row["best_GBps"] == pytest.approx(10.0 * 2 * 3 / 4)      # algbw 10 GB/s x 2(N-1)/N
    assert row["mpi_GBps"] == pytest.approx(5.0 * 1.5)
    assert row["best_of_ceiling"] == pytest.approx(1.5)


def test_stream_refuses_a_count_below_one():
    """``--elements`` is a count (``1000``, ``2^14``: the probe above) of at least one."""
    proc = subprocess.run([sys.executable, str(ROOT / "jobs/experiments/stream.py"), "--elements",
                           "0"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 2 and "needs a positive count, got '0'" in proc.stderr, proc.stderr
