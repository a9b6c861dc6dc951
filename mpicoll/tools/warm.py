"""Fill numba's disk cache, once per checkout, with everything a default call can compile: the
kernels of every dtype x op, the compiled executor's loop for every storage dtype, shm's two
loops (``window_copy``, ``single_copy``) for its dtypes, and the reproducible sums' kernels
with the default K (``reproducible.warmup``). ``bash run.sh`` runs it before any MPI
job, so no rank's first call compiles (docs/performance.md: minutes on a fresh clone).

    python -m mpicoll.tools.warm            # nothing to do when its stamp is newer than mpicoll

Two processes compile side by side, split by numba function, so that each function's cache
index is written by one process only (numba rewrites a function's whole index when it saves an
overload: two writers could drop each other's entries). This process compiles the kernels
first (which everything else calls, and then only loads), then starts the second process for
shm's ``window_copy``, the executor's loops and the reproducible sums' kernels, and meanwhile
compiles shm's ``single_copy``, the longest of them (on a fresh cache, one process: kernels 22
s, loops 29 s, ``window_copy`` 31 s, the reproducible kernels 29 s, ``single_copy`` 82 s).
The second takes ``kernels.file_lock`` on a lock file of its own (``kernels.use_lock_file``):
on the shared one, the two compilations would take turns.
A stamp file in numba's cache folder, newer than every source file of mpicoll, marks it done.

numba checks a cached function against its own source file only. The executor's loop and shm's
loops compile the kernels into themselves, so after kernels.py changes their cache would still
hold the old kernels: when kernels.py is newer than the stamp, their caches are emptied first.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from .. import kernels, reproducible
from ..algorithms import allreduce_shm
from ..executors import compiled
from ..shm import kernels as shm_kernels

# the cached functions that compile mpicoll.kernels' kernels into themselves
KERNEL_CALLERS = (compiled._loop, shm_kernels.window_copy, shm_kernels.single_copy)


def stamp() -> Path:
    return Path(kernels.lock_path()).with_name("mpicoll-warm.stamp")   # numba's cache folder


def drop_stale_kernel_callers() -> bool:
    """Empty the caches of ``KERNEL_CALLERS`` if kernels.py changed since the last warm-up
    (their own source files did not, so numba would load them with the old kernels inside)."""
    if not stamp().exists() or Path(kernels.__file__).stat().st_mtime <= stamp().stat().st_mtime:
        return False
    for dispatcher in KERNEL_CALLERS:
        dispatcher._cache.flush()
    return True


def fresh() -> bool:
    newest = max(p.stat().st_mtime for p in Path(kernels.__file__).parent.rglob("*.py"))
    return stamp().exists() and stamp().stat().st_mtime >= newest


def second_share() -> None:
    """The second process's share: shm's ``window_copy`` for each of its dtypes, the
    compiled executor's loop for every storage dtype, and the reproducible sums' kernels."""
    kernels.use_lock_file(kernels.lock_path() + ".second")
    for dtype in kernels.DTYPES:
        if dtype in allreduce_shm.DTYPES:
            allreduce_shm.warmup(dtype, functions=("window_copy",))
        if compiled.available() is None:
            compiled.warmup(kernels.storage(dtype))
    reproducible.warmup()


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--second-share"]:
        second_share()
        return 0
    if argv:
        print("usage: python -m mpicoll.tools.warm", file=sys.stderr)
        return 2
    if fresh():
        return 0
    print(f"run.sh: numba compiles mpicoll's kernels into {stamp().parent} (once; minutes on a "
          "fresh clone)", file=sys.stderr, flush=True)
    started = time.monotonic()
    if drop_stale_kernel_callers():
        print("run.sh: kernels.py changed: the executor's and shm's loops compile again",
              file=sys.stderr, flush=True)
    for dtype in kernels.DTYPES:
        for op in kernels.ops_for(dtype):
            kernels.warmup(op, dtype)
    second = subprocess.Popen([sys.executable, "-m", "mpicoll.tools.warm", "--second-share"])
    try:
        for dtype in kernels.DTYPES:
            if dtype in allreduce_shm.DTYPES:
                allreduce_shm.warmup(dtype, functions=("single_copy",))
    except BaseException:
        second.kill()
        raise
    if second.wait():
        print("run.sh: shm's window_copy, the executor's loops or the reproducible kernels "
              f"failed to compile (exit {second.returncode})", file=sys.stderr)
        return 1
    stamp().touch()
    print(f"run.sh: compiled in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
