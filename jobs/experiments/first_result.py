"""The cold-start table of docs/performance.md: how soon a fresh clone gives a first result.

    python jobs/experiments/first_result.py --runs 3                # the warm-up and an unwarmed first call
    python jobs/experiments/first_result.py --runs 1 --all          # ... and `tools.warm --all` too
    python jobs/experiments/first_result.py --bench --runs 3        # `bash run.sh bench` in a fresh clone
    python jobs/experiments/first_result.py --families              # CPU s per kernel family and dtype

Without ``--bench``, each run starts from an empty ``NUMBA_CACHE_DIR`` and times, as whole
processes (wall, and the CPU of the process tree from ``os.wait4``): ``python -m
mpicoll.tools.warm`` (what ``run.sh bench`` compiles: the float32 sum), with ``--all`` also
``python -m mpicoll.tools.warm --all`` (what ``run.sh test`` compiles), and, on a copy of the
cache the first one filled, a job at N = 2
whose first all-reduce is float32 (warmed) and whose second is int16 ``prod`` (not warmed:
numba compiles its kernel and the compiled executor's int16 loop): the second call's seconds,
slowest rank, are the first-use cost.

``--bench``: each run clones this checkout's HEAD into a fresh folder (so no numba cache) and
times ``bash run.sh bench`` there, from its start to the table's header, to its first row and
to its end: wall, and CPU of the process tree so far (``tree_cpu``, from /proc). The clone reuses this Python environment (``MPICOLL_VENV``; its setup.cfg dated
back, so run.sh installs nothing): what is timed is numba's compiling and the bench, not pip.
``--families``: one process on an empty ``NUMBA_CACHE_DIR`` compiles, family after family,
every dtype x op's kernel, the compiled executor's loop for every storage dtype, and shm's
``window_copy`` and ``single_copy`` for every dtype, and prints the CPU seconds of each
family and each of its dtypes (``time.process_time``).
Timings move with the machine's load: the load average is printed with them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIRST_USE = """
import time
import numpy as np
import mpicoll
from mpi4py import MPI
mpicoll.allreduce(np.ones(1000, np.float32), algorithm="auto")
MPI.COMM_WORLD.Barrier()
t = time.perf_counter()
mpicoll.allreduce(np.ones(1000, np.int16), op="prod", algorithm="auto")
t = np.array(time.perf_counter() - t)
MPI.COMM_WORLD.Reduce(MPI.IN_PLACE if MPI.COMM_WORLD.rank == 0 else t, t, op=MPI.MAX, root=0)
if MPI.COMM_WORLD.rank == 0:
    print(f"{float(t):.3f}")
"""


def tree_cpu(root: int) -> float:
    """CPU seconds so far of process ``root`` and its descendants (from /proc: each live
    process's user + sys time and that of the children it has waited for)."""
    parent, used = {}, {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue                    # (ended meanwhile)
        pid = int(stat.parent.name)
        parent[pid] = int(fields[1])
        used[pid] = sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    total, tree = 0.0, {root}
    grew = True                         # (a child's pid may be lower than its parent's)
    while grew:
        grew = False
        for pid, ppid in parent.items():
            if ppid in tree and pid not in tree:
                tree.add(pid)
                grew = True
    for pid in tree:
        total += used.get(pid, 0.0)
    return total


def timed(argv: list, env: dict, cwd=None, marks: tuple = ()) -> tuple:
    """(wall s, CPU s of the process tree, stdout, {mark: (seconds, CPU s of the tree so far)
    at the first line starting with it}) of one run; raises on failure."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    seen, lines = {}, []
    for line in proc.stdout:
        lines.append(line)
        for mark in marks:
            if mark not in seen and line.lstrip().startswith(mark):
                seen[mark] = (time.perf_counter() - started, tree_cpu(proc.pid))
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    err = proc.stderr.read()
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{' '.join(argv)} failed:\n{err[-3000:]}")
    return wall, usage.ru_utime + usage.ru_stime, "".join(lines), seen


def cell(values: list) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def first_use(runs: int, env: dict, every: bool) -> list:
    rows = {"`tools.warm` (the float32 sum)": [], "`tools.warm --all`": [],
            "the first int16 prod call at N = 2 (its seconds; CPU: the whole job's)": []}
    names = list(rows)
    mpiexec = shutil.which("mpiexec") or "mpiexec"
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="mpicoll-first-result-") as tmp:
            for name, extra in (("first", []), ("all", ["--all"]))[:2 if every else 1]:
                cache = dict(env, NUMBA_CACHE_DIR=str(Path(tmp, name)))
                wall, cpu, _, _ = timed([sys.executable, "-m", "mpicoll.tools.warm", *extra],
                                        cache)
                rows[names[1] if extra else names[0]].append((wall, cpu))
            shutil.copytree(Path(tmp, "first"), Path(tmp, "use"))
            cache = dict(env, NUMBA_CACHE_DIR=str(Path(tmp, "use")))
            wall, cpu, out, _ = timed([mpiexec, "-n", "2", sys.executable, "-c", FIRST_USE],
                                      cache)
            rows[names[2]].append((float(out.split()[-1]), cpu))
    return [(name, [w for w, _ in r], [c for _, c in r]) for name, r in rows.items() if r]


def bench(runs: int, env: dict) -> list:
    header, row = "size(B)", tuple(str(8 * 4 ** k) + " " for k in range(12))
    walls, cpus, to_header, to_row, cpu_header, cpu_row = [], [], [], [], [], []
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="mpicoll-first-table-") as tmp:
            clone = Path(tmp, "mpicoll")
            subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
            os.utime(clone / "setup.cfg", (0, 0))      # run.sh: nothing to install
            run_env = dict(env, MPICOLL_VENV=sys.prefix, PYTHONPATH=str(clone))
            run_env.pop("NUMBA_CACHE_DIR", None)
            wall, cpu, _, seen = timed(["bash", "run.sh", "bench"], run_env, cwd=clone,
                                       marks=(header, *row))
            walls.append(wall)
            cpus.append(cpu)
            first_row = min(t for m, t in seen.items() if m != header)
            to_header.append(seen[header][0])
            cpu_header.append(seen[header][1])
            to_row.append(first_row[0])
            cpu_row.append(first_row[1])
    return [("`bash run.sh bench`: the table's header", to_header, cpu_header),
            ("`bash run.sh bench`: its first row", to_row, cpu_row),
            ("`bash run.sh bench`: the whole command", walls, cpus)]


def families() -> None:
    """``--families``, in this process (run on an empty ``NUMBA_CACHE_DIR``)."""
    import numpy as np

    from mpicoll import kernels
    from mpicoll.algorithms import allreduce_shm
    from mpicoll.executors import compiled
    kernels.notices = False
    storages = list(dict.fromkeys(kernels.storage(d) for d in kernels.DTYPES))
    work = {"kernels (every op)": (kernels.DTYPES, lambda d: [kernels.warmup(op, d)
                                                             for op in kernels.ops_for(d)]),
            "executor loop": (storages, compiled.warmup),
            "shm window_copy": (storages, lambda d: allreduce_shm.warmup(
                d, functions=("window_copy",))),
            "shm single_copy": (storages, lambda d: allreduce_shm.warmup(
                d, functions=("single_copy",)))}
    print(f"# CPU s, one process, empty NUMBA_CACHE_DIR; load {os.getloadavg()[0]:.1f}")
    for family, (dtypes, compile_one) in work.items():
        each = []
        for dtype in dtypes:
            started = time.process_time()
            compile_one(dtype)
            each.append((str(np.dtype(dtype)), time.process_time() - started))
        print(f"{family}: {sum(t for _, t in each):.1f} s; " +
              ", ".join(f"{d} {t:.2f}" for d, t in each), flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--bench", action="store_true", help="time `bash run.sh bench` instead")
    ap.add_argument("--all", action="store_true", help="also time `tools.warm --all`")
    ap.add_argument("--families", action="store_true", help="CPU s per family and dtype")
    ap.add_argument("--families-here", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if args.families_here:
        families()
        return 0
    if args.families:
        with tempfile.TemporaryDirectory(prefix="mpicoll-families-") as tmp:
            return subprocess.run([sys.executable, __file__, "--families-here"],
                                  env=dict(env, NUMBA_CACHE_DIR=tmp)).returncode
    before = os.getloadavg()[0]
    rows = bench(args.runs, env) if args.bench else first_use(args.runs, env, args.all)
    print(f"# median (min-max) of {args.runs} runs; load average {before:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after")
    print("| what | wall s | CPU s, all processes |")
    print("|---|---:|---:|")
    for name, walls, cpus in rows:
        print(f"| {name} | {cell(walls)} | {cell(cpus) if cpus else ''} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
