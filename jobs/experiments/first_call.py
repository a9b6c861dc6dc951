"""The first-call table of docs/performance.md: how long ``import mpicoll`` and a job's first
all-reduce take as whole processes, warm and cold, at N = 1, 2 and 4.

    python jobs/experiments/first_call.py                      # N = 1 2 4, 3 runs each, a markdown table
    python jobs/experiments/first_call.py -N 4 --runs 5 --json docs/results/first-call.json

Each row is the median (min-max) wall time of ``--runs`` whole processes:
- ``import``: ``python -c 'import mpicoll'`` (N = 1 only: no MPI);
- ``first call, warm``: ``mpiexec -n N python -c FIRST`` on a numba cache that one earlier job
  filled (``NUMBA_CACHE_DIR``, a folder of its own);
- ``first call, cold``: the same on an empty ``NUMBA_CACHE_DIR`` every run (numba compiles the
  kernel and the executor's loop: one rank under the file lock, the others then load).
FIRST imports numpy and mpicoll and runs one ``mpicoll.allreduce`` of 1000 float32 (auto).
Also given: the CPU seconds of the whole job (user + sys of every process, from
``os.wait4``), and whether ``import mpicoll.api`` brought in ``ml_dtypes`` (it must not:
tests/unit/test_lazy_imports.py). Timings move with the machine's load: say it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIRST = ("import numpy as np, mpicoll; "
         "mpicoll.allreduce(np.ones(1000, np.float32), algorithm='auto')")


def timed(argv: list, env: dict) -> tuple:
    """(wall seconds, user+sys CPU seconds of the process tree) of one run; raises on failure."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    if proc.returncode:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}):\n{err[-2000:]}")
    # wait4's usage covers the process and its reaped children (mpiexec's ranks)
    return wall, usage.ru_utime + usage.ru_stime


def row(name: str, n: int, runs: list) -> dict:
    walls, cpus = [w for w, _ in runs], [c for _, c in runs]
    return {"case": name, "N": n, "runs": len(runs), "wall_median": statistics.median(walls),
            "wall_min": min(walls), "wall_max": max(walls), "cpu_median": statistics.median(cpus)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-N", type=int, nargs="+", default=[1, 2, 4], help="rank counts")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args(argv)
    mpiexec = shutil.which("mpiexec") or "mpiexec"
    base = dict(os.environ, PYTHONPATH=str(ROOT))
    rows = []
    with tempfile.TemporaryDirectory(prefix="mpicoll-first-call-") as tmp:
        warm = dict(base, NUMBA_CACHE_DIR=str(Path(tmp, "warm")))
        rows.append(row("import mpicoll", 1, [timed([sys.executable, "-c", "import mpicoll"],
                                                    base) for _ in range(args.runs)]))
        probe = subprocess.run([sys.executable, "-c", "import sys, mpicoll.api; "
                                "print('ml_dtypes' in sys.modules)"], env=base,
                               capture_output=True, text=True, check=True).stdout.strip()
        for n in args.N:
            first = [mpiexec, "-n", str(n), sys.executable, "-c", FIRST]
            timed(first, warm)          # fills the warm cache (not counted)
            rows.append(row("first call, warm", n, [timed(first, warm)
                                                    for _ in range(args.runs)]))
            cold = []
            for r in range(args.runs):
                env = dict(base, NUMBA_CACHE_DIR=str(Path(tmp, f"cold-{n}-{r}")))
                cold.append(timed(first, env))
            rows.append(row("first call, cold", n, cold))
    load = os.getloadavg()[0]
    print(f"# median (min-max) of {args.runs} whole processes; load {load:.1f} at the end; "
          f"`import mpicoll.api` imports ml_dtypes: {probe}")
    print("| what | N | wall s, median (min-max) | CPU s, all processes |")
    print("|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['case']} | {r['N']} | {r['wall_median']:.2f} ({r['wall_min']:.2f}-"
              f"{r['wall_max']:.2f}) | {r['cpu_median']:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"load": load, "runs": args.runs,
                                               "first": FIRST, "ml_dtypes_on_api": probe,
                                               "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
