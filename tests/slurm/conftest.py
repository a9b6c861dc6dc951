"""Integration tests on a real Slurm cluster: submit the slurm/*.sbatch scripts with
``sbatch --wait`` and check what the jobs wrote.

Run them with ``bash tests/run-slurm.sh``, which starts the local two-node cluster of
slurm/local-cluster.sh when no cluster answers (and stops it afterwards). Any cluster that
``sbatch`` reaches will do if it has 2 nodes that take 2 tasks each; MPICOLL_SLURM_SBATCH_ARGS
adds sbatch options to every submission (e.g. "-p debug -A myproject"). With no cluster the
tests are skipped, or fail when MPICOLL_REQUIRE_SLURM=1.

Every test names its job with ``@pytest.mark.slurm_job(NAME)`` (a key of ``JOBS``). All the
jobs the selected tests need are submitted at once, when the first of them starts, each by its
own ``sbatch --wait``: they queue together, and the polling of ``sbatch --wait`` (after 2, 10,
42, 74 ... s with the default MinJobAge; every 8 s on the cluster tests/run-slurm.sh starts,
MinJobAge 16) is paid about once instead of once per job.
Jobs are submitted from results/slurm-tests/ (emptied first), so their logs and results stay
there for inspection.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "results" / "slurm-tests"
TIMEOUT = int(os.environ.get("MPICOLL_SLURM_JOB_TIMEOUT", "600"))   # per job, queueing included
EXTRA = shlex.split(os.environ.get("MPICOLL_SLURM_SBATCH_ARGS", ""))

TWO_NODES = ["--nodes=2", "--ntasks-per-node=2", "--time=00:10:00"]
SMALL = "-b 8 -e 4K -f 8 -n 5 -w 1"          # 4 sizes, 5 iterations: seconds, not minutes
VENV = Path(sys.prefix) if sys.prefix != sys.base_prefix else None

# name -> (script, sbatch options, job environment, script arguments)
JOBS = {
    "bench": ("bench.sbatch", TWO_NODES, {"MPICOLL_BENCH_ARGS": SMALL}, []),
    "hierarchical": ("hierarchical.sbatch", TWO_NODES, {"MPICOLL_BENCH_ARGS": SMALL}, []),
    "sweep": ("sweep.sbatch", ["--nodes=1", "--ntasks-per-node=2", "--array=0-2",
                               "--time=00:10:00"],
              {"MPICOLL_SWEEP": "-m 8:32;-m 256:1K;ranks=1 -m 8:8",
               "MPICOLL_BENCH_ARGS": "-n 3 -w 1"}, []),
    # 4 ranks, 2 on each node: every node phase of hierarchical and the node-order ring has
    # work on both nodes (1 and 2 fill one node, and tests/run.sh's mpiexec runs have 1..5 and
    # 8; 3 as well here took the job past its 10 minutes on a loaded machine). The files whose
    # tests see the node layout (every algorithm of every collective, hierarchical's phases,
    # the node-order ring, shm refusing two nodes, every form's plan): tests/run.sh runs the
    # rest of tests/mpi, which a second node does not change, at 4 ranks under mpiexec.
    "tests": ("tests.sbatch", TWO_NODES, {"MPICOLL_TEST_RANKS": "4"},
              ["-k", "test_collectives or test_forms or test_shm"]),
    "crossover": ("crossover.sbatch", TWO_NODES, {"MPICOLL_BENCH_ARGS": "-b 8 -e 64K -f 8 -n 5"},
                  ["--calibrate-args", "-n 20 -e 2M"]),
    "scaling": ("scaling.sbatch", TWO_NODES, {}, ["--sizes", "8,4K", "-n", "5"]),
    "ring_order": ("ring_order.sbatch", TWO_NODES + ["--distribution=cyclic"], {},
                   ["--counts", "1000,100000", "-n", "3"]),
    # Issue #22's fault matrix at N = 4 across the two nodes: every case x algorithm x form once
    # (the shared-memory ones refuse ranks on two nodes, and the job leaves them out).
    "fault_matrix": ("fault_matrix.sbatch", TWO_NODES, {"MPICOLL_FAULT_ARGS": "--reps 1"}, []),
    # Issue 41: the second node's two ranks die mid-loop; the first node's two name them (by
    # heartbeats, as between machines: the emulated nodes share this machine's pids), shrink and
    # compute right.
    "deaths": ("deaths.sbatch", TWO_NODES, {"MPICOLL_HEARTBEAT_ONLY": "1"}, []),
    # Issue 42: train_dp.py --reproducible, uninterrupted and with the second node's ranks killed
    # at step 37 (found by heartbeats, as deaths): the first node finishes with the same bits.
    "elastic": ("elastic.sbatch", TWO_NODES, {"MPICOLL_HEARTBEAT_ONLY": "1"}, []),
    # The documented fallback: the MPI library's mpiexec inside the allocation, the Python
    # named by MPICOLL_VENV (not on PATH), results under MPICOLL_RESULTS.
    "mpiexec": ("bench.sbatch", TWO_NODES,
                {"MPICOLL_LAUNCHER": "mpiexec", "MPICOLL_BENCH_ARGS": SMALL,
                 "MPICOLL_RESULTS": str(BASE / "elsewhere"),
                 **({"MPICOLL_VENV": str(VENV)} if VENV else
                    {"MPICOLL_PYTHON": sys.executable})}, []),
    "bad_python": ("bench.sbatch", ["--nodes=1", "--ntasks-per-node=1", "--time=00:02:00"],
                   {"MPICOLL_PYTHON": "/nonexistent/bin/python"}, []),
    # Only on a shaped fabric (local-cluster.sh up --fabric; test_fabric.py): the bytes on the
    # nodes' links against mpicoll's count of inter-node bytes.
    "fabric_bytes": ("fabric.sbatch", TWO_NODES, {},
                     ["bytes", "--size", "1M", "-n", "2", "--algorithms", "ring,hierarchical,mpi"]),
}

# Settings of the submitting shell that would change what the jobs do.
CLEARED = ("MPICOLL_RANKS_PER_NODE", "MPICOLL_LAUNCHER", "MPICOLL_PMI", "MPICOLL_PYTHON",
           "MPICOLL_VENV", "MPICOLL_RESULTS", "MPICOLL_BENCH_ARGS", "MPICOLL_COLLECTIVES",
           "MPICOLL_SWEEP", "MPICOLL_TEST_RANKS", "MPICOLL_SCALING_ARGS",
           "MPICOLL_LAUNCHER_ARGS", "MPICOLL_ROOT", "MPICOLL_HIER_INNER", "MPICOLL_PROFILE",
           "MPICOLL_FAULT_ARGS")


@dataclass
class Job:
    name: str
    id: str
    rc: int | None          # sbatch --wait's exit status: the job's (None: timed out)
    output: str             # sbatch's stdout and stderr
    seconds: float

    def log(self, index: int | None = None) -> str:
        """The job's stdout file (array task ``index``), by the scripts' --output pattern."""
        stem = f"{self.id}_{index}" if index is not None else self.id
        paths = list(BASE.glob(f"*-{stem}.out"))
        assert len(paths) == 1, f"no single log *-{stem}.out in {BASE}: {paths}"
        return paths[0].read_text()

    def results(self, index: int | None = None) -> Path:
        """The results directory, as the job's log states it."""
        m = re.search(r"^\s*results:\s+(\S+)$", self.log(index), re.M)
        assert m, f"the log of job {self.id} does not say where the results are"
        return Path(m.group(1))

    def explain(self) -> str:
        try:
            # without the transport's shutdown warnings (UCX prints one per unmatched message)
            log = "\n".join(line for line in self.log().splitlines()
                             if "UCX  WARN" not in line)[-3000:]
        except AssertionError as e:
            log = str(e)
        return (f"job {self.name} ({self.id}): exit {self.rc} after {self.seconds:.0f} s\n"
                f"sbatch: {self.output}\n--- log (end) ---\n{log}")


def job_env(extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in CLEARED and not (k.startswith("SLURM_") and k != "SLURM_CONF")}
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p]
    if "MPICOLL_VENV" in extra or "MPICOLL_PYTHON" in extra:
        # The job must find its Python through the variable alone.
        path = [p for p in path if not (VENV and Path(p).resolve() == (VENV / "bin").resolve())]
    else:
        path.insert(0, os.path.dirname(sys.executable))   # `python` = this test's Python
    env["PATH"] = os.pathsep.join(path)
    env.update(extra)
    return env


def submit(name: str) -> Job:
    script, options, extra, args = JOBS[name]
    cmd = ["sbatch", "--wait", "--parsable", *EXTRA, *options, str(ROOT / "slurm" / script),
           *args]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=BASE, env=job_env(extra), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    first = proc.stdout.readline()        # --parsable: the job id, printed at submission
    job_id = first.strip().split(";")[0]
    if not job_id.isdigit():                  # not submitted: sbatch's error is in the output
        job_id = "(none)"
    try:
        rest, _ = proc.communicate(timeout=TIMEOUT)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        if job_id.isdigit():
            subprocess.run(["scancel", job_id], timeout=30)   # do not leave it queued
        proc.kill()
        rest, _ = proc.communicate()
        rc = None
    return Job(name, job_id, rc, first + rest, time.monotonic() - start)


def cluster_problem() -> str | None:
    if not shutil.which("sbatch"):
        return "sbatch is not installed"
    try:
        r = subprocess.run(["sinfo", "-h", "-o", "%P %D %T"], capture_output=True, text=True,
                           timeout=30)
    except subprocess.TimeoutExpired:
        return "sinfo timed out"
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        return f"no Slurm cluster answers (sinfo: {last[:200]})"
    return None


def pytest_configure(config):
    config.addinivalue_line("markers", "slurm_job(name): the test checks job JOBS[name]")


@pytest.fixture(scope="session")
def cluster():
    problem = cluster_problem()
    if problem:
        if os.environ.get("MPICOLL_REQUIRE_SLURM") == "1":
            pytest.fail(f"{problem} (and MPICOLL_REQUIRE_SLURM=1)")
        pytest.skip(f"{problem}; run `bash tests/run-slurm.sh` to start a local cluster")


@pytest.fixture(scope="session")
def submitted(cluster, request):
    names = sorted({m.args[0] for item in request.session.items
                    for m in item.iter_markers("slurm_job")})
    shutil.rmtree(BASE, ignore_errors=True)
    BASE.mkdir(parents=True)
    with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
        yield {name: pool.submit(submit, name) for name in names}


@pytest.fixture
def job(submitted, request) -> Job:
    name = request.node.get_closest_marker("slurm_job").args[0]
    done = submitted[name].result()
    print(f"job {name} ({done.id}): exit {done.rc}, {done.seconds:.0f} s")
    return done
