"""The job scripts without a scheduler: syntax, #SBATCH headers, and one run outside Slurm."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "slurm").glob("*.sbatch"))
JOBS = [ROOT / "jobs" / "experiments" / f"{name}.py"
        for name in ("bench_sweep", "crossover", "scaling", "hierarchical_vs_flat", "ring_order",
                     "fabric_bytes", "fabric_bench")]


def test_the_promised_scripts_exist():
    names = {p.stem for p in SCRIPTS}
    assert {"bench", "hierarchical", "sweep", "tests"} <= names


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_sbatch_header(script):
    lines = script.read_text().splitlines()
    subprocess.run(["bash", "-n", str(script)], check=True)
    # sbatch reads #SBATCH lines only up to the first command
    first_command = next(i for i, line in enumerate(lines)
                         if line.strip() and not line.startswith("#"))
    options = [line.split()[1] for line in lines[first_command:] if line.startswith("#SBATCH")]
    assert options == [], f"#SBATCH after the first command is ignored: {options}"
    header = {line.split()[1].split("=")[0] for line in lines[:first_command]
              if line.startswith("#SBATCH")}
    assert {"--job-name", "--nodes", "--ntasks-per-node", "--time", "--output"} <= header
    # nothing site-specific: partition and account come from the command line or the site
    assert not header & {"--partition", "-p", "--account", "-A", "--mem", "--qos"}
    assert 'source "$root/slurm/common.sh"' in lines


def test_shellcheck():
    if not shutil.which("shellcheck"):
        pytest.skip("shellcheck is not installed")
    subprocess.run(["shellcheck", "-x", *map(str, SCRIPTS), str(ROOT / "slurm/common.sh"),
                    str(ROOT / "tests/run-slurm.sh")], check=True)


@pytest.mark.parametrize("job", JOBS, ids=lambda p: p.name)
def test_job_help(job):
    r = subprocess.run([sys.executable, str(job), "--help"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "--outdir" in r.stdout


def test_bench_script_runs_without_slurm(tmp_path):
    """`bash slurm/bench.sbatch` outside any job: mpiexec on MPICOLL_NP ranks."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(MPICOLL_NP="2", MPICOLL_RESULTS=str(tmp_path),
               MPICOLL_BENCH_ARGS="-b 8 -e 64 -f 8 -n 2 -w 1",
               PATH=os.path.dirname(sys.executable) + os.pathsep + env["PATH"])
    env.pop("MPICOLL_RANKS_PER_NODE", None)
    r = subprocess.run(["bash", str(ROOT / "slurm/bench.sbatch")], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    out = Path(re.search(r"results:\s+(\S+)", r.stdout).group(1))
    assert out.parent == tmp_path and out.name.startswith("mpicoll-bench-local-")
    res = json.loads((out / "bench-allreduce.json").read_text())
    assert res["nranks"] == 2 and all(rec["wrong"] == 0 for rec in res["records"])
