"""Serial tests of the torch backend that launch small mpiexec jobs of their own (the torch
environment: tests/run-torch.sh)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
MPIEXEC = shutil.which("mpiexec", path=os.pathsep.join(
    [str(Path(sys.executable).parent), os.environ.get("PATH", "")]))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("ranks", [2, 4])
def test_dead_rank_is_named_through_work_wait(tmp_path, ranks):
    assert MPIEXEC, "mpiexec not found next to python or on PATH (pip install .[mpich])"
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    proc = subprocess.run([MPIEXEC, "-disable-auto-cleanup", "-n", str(ranks), sys.executable,
                           str(HERE / "dead_rank.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=200, env=env)
    rows = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank*.json"))]
    assert len(rows) == ranks - 1, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    dead = ranks - 1
    for row in rows:
        wait, future = row["wait"], row["future"]
        assert wait["type"] == "RuntimeError" and wait["cause"] == "CollectiveTimeout", row
        assert f"rank(s) [{dead}]" in wait["message"] and dead in wait["peers"], row
        assert future["type"] == "RuntimeError" and future["message"] == wait["message"], row
        assert row["next"]["type"] == "RuntimeError", row      # the group is broken now
        assert 9.5 < row["elapsed"] < 100, row     # init_process_group's 10 s, not mpicoll's 600
