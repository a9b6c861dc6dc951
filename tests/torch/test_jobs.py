"""Serial tests of the torch backend that launch small mpiexec jobs of their own (the torch
environment: tests/run-torch.sh)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mpicoll.testing import MPIEXEC

HERE = Path(__file__).resolve().parent


@pytest.mark.timeout(240)
@pytest.mark.parametrize("ranks", [2, 4])
def test_dead_rank_is_named_through_work_wait(tmp_path, ranks):
    assert MPIEXEC, "mpiexec not found next to python or on PATH (pip install .[mpich])"
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    proc = subprocess.run([MPIEXEC, "-disable-auto-cleanup", "-n", str(ranks), sys.executable,
                           "-m", "mpicoll", "survive", sys.executable,
                           str(HERE / "dead_rank.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=200, env=env)
    rows = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank*.json"))]
    assert len(rows) == ranks - 1, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    dead = ranks - 1
    for row in rows:
        wait, future = row["wait"], row["future"]
        # the failure detector names it within seconds, long before the group's 10 s
        assert wait["type"] == "RuntimeError" and wait["cause"] == "ProcessFailed", row
        assert f"rank {dead} (host" in wait["message"], row
        assert future["type"] == "RuntimeError" and future["message"] == wait["message"], row
        assert row["next"]["type"] == "RuntimeError", row      # the group is broken now
        assert row["elapsed"] < 3.0, row
        ddp = row["ddp"]            # a DDP step of the survivors (a fresh group, same death)
        assert ddp["type"] == "RuntimeError" and ddp["cause"] == "ProcessFailed", row
        assert f"rank {dead} (host" in ddp["message"], row


SINGLE = """
import torch, torch.distributed as dist
import mpicoll.torch
dist.init_process_group("mpicoll")
x = torch.ones(3)
dist.all_reduce(x)
print("size", dist.get_world_size(), "sum", x.tolist(), flush=True)
dist.destroy_process_group()
"""


@pytest.mark.timeout(200)
def test_one_process_without_master_addr(tmp_path):
    """``python script.py``: no launcher, no MASTER_ADDR -- a job of one rank."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MASTER_", "PMI_", "OMPI_", "PMIX_", "HYDRA_"))}
    proc = subprocess.run([sys.executable, "-c", SINGLE], capture_output=True, text=True,
                          timeout=180, env=env)
    assert "size 1 sum [1.0, 1.0, 1.0]" in proc.stdout, proc.stderr[-2000:]


@pytest.mark.timeout(200)
def test_torchrun_is_refused_with_the_launch_to_use(tmp_path):
    """torchrun starts each process as an MPI job of its own: init_process_group says so."""
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("no torchrun next to python")
    script = tmp_path / "single.py"
    script.write_text(SINGLE)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MASTER_", "PMI_", "OMPI_", "PMIX_", "HYDRA_"))}
    import socket
    with socket.socket() as sock:           # a free port for torchrun's store (loopback)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.run([str(torchrun), "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                           "--master-port", str(port), str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode != 0
    assert "the processes are not one MPI job" in proc.stderr, proc.stderr[-3000:]
    assert "mpiexec -n 2" in proc.stderr


SERIALIZED = """
import mpi4py
mpi4py.rc.thread_level = "serialized"          # no progress thread: every call blocking
import torch, torch.distributed as dist
import mpicoll.torch
from mpicoll.testing import ddp_train
dist.init_process_group("mpicoll")
assert dist.group.WORLD.threaded is False
x = torch.ones(5)
work = dist.all_reduce(x, async_op=True)
assert work.is_completed() and float(x[0]) == dist.get_world_size()
weights, _ = ddp_train(steps=5)
from mpi4py import MPI
sums = MPI.COMM_WORLD.gather(float(weights.sum()), root=0)
if dist.get_rank() == 0:
    print("serialized ok", len(sums), len(set(sums)), flush=True)     # ranks, distinct sums
dist.destroy_process_group()
"""


@pytest.mark.timeout(240)
def test_without_thread_multiple_every_call_is_blocking_and_ddp_runs(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    proc = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "-c", SERIALIZED],
                          capture_output=True, text=True, timeout=200, env=env)
    assert "serialized ok 2 1" in proc.stdout, (proc.stdout[-1000:], proc.stderr[-2000:])


def elastic_ddp(out: Path, ranks: int, *args) -> dict:
    """Run tests/torch/elastic_ddp.py; the survivors' rows, the weights and the recovery
    times (from the victim's last act to each survivor's first step after it)."""
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    proc = subprocess.run([MPIEXEC, "-disable-auto-cleanup", "-n", str(ranks), sys.executable,
                           "-m", "mpicoll", "survive", sys.executable,
                           str(HERE / "elastic_ddp.py"), str(out), *args],
                          capture_output=True, text=True, timeout=280, env=env)
    rows = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    assert rows and (out / "weights.pt").exists(), (proc.stdout[-2000:], proc.stderr[-3000:])
    killed = [json.loads(p.read_text())["killed_at"] for p in out.glob("killed.rank*.json")]
    recovery = [at - max(killed) for r in rows for at in r["recovered_at"]]
    import torch
    return {"rows": rows, "weights": torch.load(out / "weights.pt"), "recovery": recovery}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("reproducible", [False, True])
def test_ddp_survives_a_death_with_the_same_weights(tmp_path, reproducible):
    """mpicoll.torch.elastic: the seeded MLP, DDP at N = 4, 50 steps. Rank 2 dies at step 37;
    the survivors go on at 3 ranks, or a hot spare takes its place: the weights equal the
    uninterrupted run's within 1e-6 (fp32 averages), or bit for bit with the micro-batch sum
    and Options(reproducible=True) -- as a run at N = 3 from the start."""
    flag = ["--reproducible"] if reproducible else []
    base = elastic_ddp(tmp_path / "n4", 4, *flag)
    runs = {"killed": elastic_ddp(tmp_path / "killed", 4, "--kill", "2@37", *flag),
            "spare": elastic_ddp(tmp_path / "spare", 5, "--spares", "1", "--kill", "2@37",
                                 *flag)}
    if reproducible:
        runs["n3"] = elastic_ddp(tmp_path / "n3", 3, *flag)
    want = {r["sha256"] for r in base["rows"]}
    assert len(want) == 1 and len(base["rows"]) == 4, base["rows"]
    ends = {"killed": 3, "spare": 4, "n3": 3}
    for name, run in runs.items():
        assert {r["ranks_end"] for r in run["rows"]} == {ends[name]}, (name, run["rows"])
        if name != "n3":
            assert len(run["recovery"]) >= 3 and max(run["recovery"]) < 10.0, (name, run)
        shas = {r["sha256"] for r in run["rows"]}
        assert len(shas) == 1, (name, run["rows"])           # every survivor: the same bits
        relative = float((run["weights"] - base["weights"]).abs().max()
                         / base["weights"].abs().max())
        if reproducible:
            assert shas == want, (name, relative)
        else:
            assert relative <= 1e-6, (name, relative)
    print({name: [round(t, 3) for t in run["recovery"]] for name, run in runs.items()})
