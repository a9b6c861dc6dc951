"""What the compiled executor adds to a job's first call: cold (empty numba cache) and warm.

    python jobs/experiments/cold_start.py                # mpiexec -n 2, float64 and float32
    python jobs/experiments/cold_start.py -n 4 --runs 3
    python jobs/experiments/cold_start.py -n 4 --runs 3 --algorithm auto --executors compiled --dtypes float32

It starts ``mpiexec -n N python -c <first call>`` with a fresh, empty ``NUMBA_CACHE_DIR``
(cold: the kernels and, for the compiled executor, its loop are compiled, one process under the
file lock while the others wait, then load) and then again on that cache (warm: loaded), for
``MPICOLL_EXECUTOR=python`` and ``compiled``. Each job reports the slowest rank's time from
before ``import mpicoll`` to the end of its first ``allreduce`` of each dtype. It prints the
median over ``--runs`` jobs of each kind, the compiled executor's extra time (when both
executors run), and the whole ``mpiexec`` job's wall time (start-up and exit included).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

FIRST_CALL = """
import time
t0 = time.perf_counter()
import numpy as np
import mpicoll
from mpi4py import MPI
comm = MPI.COMM_WORLD
marks = []
for dtype in {dtypes}:
    mpicoll.allreduce(np.ones(1000, dtype), algorithm="{algorithm}")
    marks.append(time.perf_counter() - t0)
worst = np.array(marks)
comm.Reduce(MPI.IN_PLACE if comm.rank == 0 else worst, worst, op=MPI.MAX, root=0)
if comm.rank == 0:
    print(" ".join(f"{{t:.3f}}" for t in worst))
"""


def job(n: int, executor: str, cache: Path, dtypes: list, algorithm: str = "ring") -> list:
    """Seconds to the end of each dtype's first call (slowest rank), then the job's wall time."""
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, MPICOLL_EXECUTOR=executor, NUMBA_CACHE_DIR=str(cache),
               PYTHONPATH=str(root))
    mpiexec = shutil.which("mpiexec") or "mpiexec"
    started = time.perf_counter()
    out = subprocess.run([mpiexec, "-n", str(n), sys.executable, "-c",
                          FIRST_CALL.format(dtypes=dtypes, algorithm=algorithm)], env=env,
                         capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - started
    if out.returncode:
        raise SystemExit(f"{executor} job failed:\n{out.stderr[-2000:]}")
    out = out.stdout
    return [float(t) for t in out.split()] + [wall]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=2, help="ranks")
    ap.add_argument("--runs", type=int, default=3, help="jobs of each kind")
    ap.add_argument("--dtypes", default="float64,float32")
    ap.add_argument("--algorithm", default="ring", help="the first calls' algorithm")
    ap.add_argument("--executors", default="python,compiled")
    args = ap.parse_args(argv)
    dtypes, executors = args.dtypes.split(","), args.executors.split(",")
    results = {}
    for run in range(args.runs):
        for executor in executors:
            with tempfile.TemporaryDirectory(prefix="mpicoll-cold-") as cache:
                for kind in ("cold", "warm"):
                    results.setdefault((executor, kind), []).append(
                        job(args.n, executor, Path(cache), dtypes, args.algorithm))
    print(f"# N={args.n}, algorithm={args.algorithm}; seconds from before `import mpicoll` to "
          f"the end of the first allreduce of {' then '.join(dtypes)} (slowest rank), and the "
          f"whole mpiexec job's wall time; median of {args.runs} jobs; load "
          f"{os.getloadavg()[0]:.1f} at the end")
    print(f"{'cache':<6} {'executor':<9} " + " ".join(f"{d:>9}" for d in dtypes + ["job"]))
    for cache in ("cold", "warm"):
        med = {e: np.median(np.array(results[(e, cache)]), axis=0) for e in executors}
        for e in executors:
            print(f"{cache:<6} {e:<9} " + " ".join(f"{t:>9.2f}" for t in med[e]))
        if set(executors) == {"python", "compiled"}:
            print(f"{cache:<6} {'extra':<9} " + " ".join(
                f"{c - p:>+9.2f}" for c, p in zip(med["compiled"], med["python"])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
