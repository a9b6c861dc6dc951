"""The data-parallel trainer (jobs/experiments/train_dp.py) as users run it, at N = 2 and 4 ranks
with per-rank batches B/N, gradients averaged through Buckets (several buckets, overlapping the
backward pass, and one bucket after it): after 50 steps the weights are one process's on batch B
(fp32, within 1e-5 relative per parameter array), every rank with the same bits, compressed
wire formats included. The job reports both in its JSON."""

import json
import os
import subprocess
import sys

import pytest

from test_harness import MPIEXEC, ROOT

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("nranks", [2, 4])
def test_dp_matches_one_process(nranks, tmp_path):
    proc = subprocess.run([MPIEXEC, "-n", str(nranks), sys.executable, "-m", "mpi4py",
                           str(ROOT / "jobs/experiments/train_dp.py"), "--steps", "50",
                           "--batch", "64", "--width", "48", "--lr", "0.1", "--bucket-kib", "4",
                           "--outdir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=280, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    res = json.loads((tmp_path / "train_dp.json").read_text())
    assert res["ranks"] == nranks
    assert res["single_moved"] > 1e-2, res["single_moved"]     # the weights did train
    rows = {(r["mode"], r["compress"]): r for r in res["rows"]}
    for mode in ("bucketed", "blocking"):
        row = rows[mode, "fp32"]
        assert row["max_param_difference"] < 1e-5, (f"{nranks} ranks, {mode}: weights differ "
                                                     f"from one process's", row)
    assert all(r["same_bits"] for r in res["rows"]), res["rows"]
