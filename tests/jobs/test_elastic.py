"""Training that survives dead ranks (jobs/experiments/train_dp.py under ``mpicoll.elastic.run``):
with ``--reproducible`` a run at N = 4 whose rank 2 dies at step 37 (``os._exit``) ends with the
same weights, bit for bit (their SHA-256), as the uninterrupted run at N = 4 and a run at N = 3
from the start; two deaths (4 -> 2) too, rank 0's death too, and with a hot spare (N = 4 + 1:
the spare takes the dead rank's place; a second death shrinks to 3). Without it (``Buckets``, fp32
averages) the killed run agrees within 1e-6 relative. Every rank runs under ``mpicoll survive``
(docs/reliability.md) and every survivor writes its own JSON.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mpicoll.testing import MPIEXEC

pytestmark = [pytest.mark.xdist_group("deadlines"), pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "jobs" / "experiments" / "train_dp.py"
SMALL = ["--steps", "50", "--width", "32"]   # 24 micro-batches of 16 samples per step
RECOVERY = 3.0      # seconds from a death to the first step completed by the survivors (issue 42)


def train(out: Path, ranks: int, *options) -> dict:
    """One launch; returns {world rank: the survivor's JSON}. Every survivor must write."""
    proc = subprocess.run(
        [MPIEXEC, "-disable-auto-cleanup", "-n", str(ranks), sys.executable, "-m", "mpicoll",
         "survive", sys.executable, str(SCRIPT), *SMALL, "--outdir", str(out), *options],
        env=dict(os.environ, PYTHONPATH=str(ROOT), MPIEXEC_TIMEOUT="150"), cwd=ROOT,
        capture_output=True, text=True, timeout=180)
    killed = {int(k.split("@")[0]) for k in options if "@" in k}
    rows = {}
    for r in set(range(ranks)) - killed:
        path = out / f"train_dp_elastic.rank{r}.json"
        assert path.exists(), (r, proc.returncode, (proc.stdout + proc.stderr)[-3000:])
        row = json.loads(path.read_text())
        if not row.get("spare"):                                # a spare never needed
            rows[r] = row
    digests = {row["weights_sha256"] for row in rows.values()}
    assert len(digests) == 1, rows                              # every survivor, the same bits
    assert f"weights sha256 {digests.pop()}" in proc.stdout, proc.stdout[-2000:]
    for r in killed:
        assert (out / f"killed.rank{r}.json").exists(), r
    return rows


def one(rows: dict) -> dict:
    return next(iter(rows.values()))


def test_reproducible_weights_survive_deaths(tmp_path):
    plain = one(train(tmp_path / "n4", 4, "--reproducible"))
    assert plain["ranks_end"] == 4 and plain["recovery_seconds"] == []
    three = one(train(tmp_path / "n3", 3, "--reproducible"))
    killed = train(tmp_path / "k", 4, "--reproducible", "--kill", "2@37")
    twice = train(tmp_path / "k2", 4, "--reproducible", "--kill", "2@37", "--kill", "1@43")
    first = train(tmp_path / "k0", 4, "--reproducible", "--kill", "0@20")
    assert set(killed) == {0, 1, 3} and set(twice) == {0, 3} and set(first) == {1, 2, 3}
    for rows, deaths in ((killed, 1), (twice, 2), (first, 1)):
        row = one(rows)
        assert row["ranks_end"] == 4 - deaths, row
        assert row["weights_sha256"] == plain["weights_sha256"] == three["weights_sha256"], row
        assert len(row["recovery_seconds"]) == deaths, row
        assert all(0 < s < RECOVERY for s in row["recovery_seconds"]), row


def test_fp32_buckets_survive_a_death_within_1e6(tmp_path):
    """Without --reproducible the sums' order depends on N: not the same bits, but close."""
    train(tmp_path / "n4", 4, "--elastic")
    rows = train(tmp_path / "k", 4, "--elastic", "--kill", "3@10")
    assert one(rows)["ranks_end"] == 3
    a, b = (np.load(tmp_path / d / "weights.npz") for d in ("n4", "k"))
    for name in a.files:
        x, y = a[name], b[name]
        assert np.linalg.norm(x - y) <= 1e-6 * np.linalg.norm(x), name


def test_a_hot_spare_takes_the_dead_ranks_place(tmp_path):
    plain = one(train(tmp_path / "n3", 3, "--reproducible"))
    spare = train(tmp_path / "s", 5, "--reproducible", "--spares", "1", "--kill", "2@37")
    assert set(spare) == {0, 1, 3, 4}                  # rank 4, the spare, trained to the end
    both = train(tmp_path / "s2", 5, "--reproducible", "--spares", "1", "--kill", "2@37",
                 "--kill", "1@43")
    idle = train(tmp_path / "i", 5, "--reproducible", "--spares", "1")
    assert set(idle) == {0, 1, 2, 3}                   # the spare was not needed
    spare_row = json.loads((tmp_path / "i" / "train_dp_elastic.rank4.json").read_text())
    assert spare_row["spare"] and spare_row["spare_cpu_seconds"] < 0.5, spare_row
    for rows, end, deaths in ((spare, 4, 1), (both, 3, 2), (idle, 4, 0)):
        row = one(rows)
        assert row["ranks_end"] == end and row["weights_sha256"] == plain["weights_sha256"], row
        assert len(row["recovery_seconds"]) == deaths, row
        assert all(0 < s < RECOVERY for s in row["recovery_seconds"]), row


def test_checkpoint_at_four_resumes_at_two_and_three(tmp_path):
    """State.save at N = 4 (step 25, asynchronous), State.load at N = 2 and 3: the 50-step
    weights of the uninterrupted run, bit for bit."""
    plain = one(train(tmp_path / "n4", 4, "--reproducible"))
    saved = tmp_path / "checkpoint"
    train(tmp_path / "s", 4, "--reproducible", "--checkpoint", str(saved), "--steps", "25")
    assert (saved / "manifest.json").exists()
    for ranks in (2, 3):
        row = one(train(tmp_path / f"r{ranks}", ranks, "--reproducible", "--resume", str(saved)))
        assert row["weights_sha256"] == plain["weights_sha256"], (ranks, row)


@pytest.mark.timeout(400)
def test_sharded_momentum_is_resharded_at_two_and_three(tmp_path):
    """--momentum 0.9: the SGD momentum buffer is sharded over the ranks (elastic.Shard, one
    file per rank). Saved at N = 4 (step 25, asynchronous), loaded at N = 2 and 3 -- each rank
    takes its new block from the saved blocks it overlaps -- the 50-step weights of the
    uninterrupted N = 4 run, bit for bit."""
    options = ("--reproducible", "--momentum", "0.9")
    plain = one(train(tmp_path / "n4", 4, *options))
    saved = tmp_path / "checkpoint"
    train(tmp_path / "s", 4, *options, "--checkpoint", str(saved), "--steps", "25")
    manifest = json.loads((saved / "manifest.json").read_text())
    parts = manifest["shards"]["velocity"]["parts"]
    assert [p[0] for p in parts] == [f"velocity.rank{r}.npy" for r in range(4)], parts
    assert [p[1] for p in parts] + [parts[-1][2]] == \
        [0, *(p[2] for p in parts)][:4] + [manifest["shards"]["velocity"]["total"]], parts
    for ranks in (2, 3):
        row = one(train(tmp_path / f"r{ranks}", ranks, *options, "--resume", str(saved)))
        assert row["weights_sha256"] == plain["weights_sha256"], (ranks, row)
    damaged = saved / "velocity.rank2.npy"                  # a damaged block is named
    damaged.write_bytes(damaged.read_bytes()[:-4] + b"\0\0\0\1")
    proc = subprocess.run([MPIEXEC, "-n", "3", sys.executable, str(SCRIPT), *SMALL, *options,
                           "--outdir", str(tmp_path / "bad"), "--resume", str(saved)],
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode != 0 and "velocity.rank2.npy does not match its checksum" in \
        proc.stderr, proc.stderr[-2000:]


@pytest.mark.timeout(1200)
def test_fault_matrix_elastic_section_has_no_fail(tmp_path):
    """fault_matrix.py --elastic: every kind of death (one, rank 0, two in turn, two at once,
    a spare joining, then a shrink, a death during asynchronous checkpoints, fp32 Buckets):
    every row ok."""
    out = tmp_path / "matrix.json"
    proc = subprocess.run([sys.executable, str(ROOT / "jobs/experiments/fault_matrix.py"),
                           "--elastic", "--json", str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=1100, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 8 and all(r["verdict"] == "ok" for r in rows), proc.stdout[-3000:]
    assert proc.returncode == 0 and "# 8 rows, 0 FAIL" in proc.stdout, proc.stdout[-2000:]
