"""Fill numba's disk cache before the first job: by default with what a first float32 job runs,
with ``--all`` with everything a default call can compile.

    python -m mpicoll.tools.warm            # float32: the sum kernel, the executor's loop, shm's
    python -m mpicoll.tools.warm --all      # every dtype x op, every loop, the reproducible sums

Both do nothing when their stamp is newer than every source file of mpicoll. ``bash run.sh
bench`` runs the first (about 6 s of CPU on a fresh clone: the first table comes out within a
minute; any other dtype or op compiles at its first use, about a second, and says so in one
line), ``run.sh test`` and ``shell`` the second, so that no test's deadline covers a
compilation (docs/performance.md, "Cold start").

``--all``: the kernels of every dtype x op, the compiled executor's loop for every storage dtype,
shm's two loops (``window_copy``, ``single_copy``) for every dtype, and the reproducible sums'
kernels with the default K (``reproducible.warmup``). Two processes compile side by side, split
by numba function, so that each function's cache index is written by one process only (numba
rewrites a function's whole index when it saves an overload: two writers could drop each
other's entries). This process compiles the kernels first (which the loops load, for their
addresses), then starts the second process for shm's ``window_copy``, the executor's loops
and the reproducible sums' kernels, and meanwhile compiles shm's ``single_copy``. The second
takes ``kernels.file_lock`` on a lock file of its own (``kernels.use_lock_file``): on the
shared one, the two compilations would take turns.

numba checks a cached function against its own source file only. The executor's loop and shm's
loops call the kernels through their addresses, but compile ``kernels.reduce_at`` and
``combine_at`` into themselves: when kernels.py is newer than the last warm-up, their caches are
emptied first.
"""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from .. import kernels, reproducible
from ..algorithms import allreduce_shm
from ..executors import compiled
from ..shm import kernels as shm_kernels

# the cached functions that compile mpicoll.kernels' functions into themselves
KERNEL_CALLERS = (compiled._loop, shm_kernels.window_copy, shm_kernels.single_copy)
FIRST_DTYPE, FIRST_OP = np.dtype(np.float32), "sum"     # what `mpicoll bench` runs by default


def stamp() -> Path:
    """The stamp of ``--all``, in numba's cache folder."""
    return Path(kernels.lock_path()).with_name("mpicoll-warm.stamp")


def first_stamp() -> Path:
    """The stamp of the default (a first float32 job's functions)."""
    return stamp().with_name("mpicoll-warm-first.stamp")


def drop_stale_kernel_callers() -> bool:
    """Empty the caches of ``KERNEL_CALLERS`` if kernels.py changed since the last warm-up
    (their own source files did not, so numba would load them with the old code inside)."""
    marks = [m.stat().st_mtime for m in (stamp(), first_stamp()) if m.exists()]
    if not marks or Path(kernels.__file__).stat().st_mtime <= max(marks):
        return False
    for dispatcher in KERNEL_CALLERS:
        dispatcher._cache.flush()
    return True


def fresh(mark: Path) -> bool:
    newest = max(p.stat().st_mtime for p in Path(kernels.__file__).parent.rglob("*.py"))
    return mark.exists() and mark.stat().st_mtime >= newest


def first_share() -> None:
    """What a first float32 ``sum`` job runs: the kernel, the executor's loop, shm's loops."""
    kernels.warmup(FIRST_OP, FIRST_DTYPE)
    if compiled.available() is None:
        compiled.warmup(kernels.storage(FIRST_DTYPE))
    allreduce_shm.warmup(FIRST_DTYPE)


def second_share() -> None:
    """``--all``'s second process: shm's ``window_copy`` for each dtype, the compiled
    executor's loop for every storage dtype, and the reproducible sums' kernels."""
    kernels.use_lock_file(kernels.lock_path() + ".second")
    for dtype in kernels.DTYPES:
        allreduce_shm.warmup(dtype, functions=("window_copy",))
        if compiled.available() is None:
            compiled.warmup(kernels.storage(dtype))
    reproducible.warmup()


def everything() -> int:
    """``--all``: every dtype x op, in two processes (the module's doc)."""
    for dtype in kernels.DTYPES:
        for op in kernels.ops_for(dtype):
            kernels.warmup(op, dtype)
    second = subprocess.Popen([sys.executable, "-m", "mpicoll.tools.warm", "--second-share"])
    try:
        for dtype in kernels.DTYPES:
            allreduce_shm.warmup(dtype, functions=("single_copy",))
    except BaseException:
        second.kill()
        raise
    if second.wait():
        print("run.sh: shm's window_copy, the executor's loops or the reproducible kernels "
              f"failed to compile (exit {second.returncode})", file=sys.stderr)
        return 1
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--second-share"]:
        kernels.notices = False
        second_share()
        return 0
    if argv not in ([], ["--all"]):
        print("usage: python -m mpicoll.tools.warm [--all]", file=sys.stderr)
        return 2
    every = argv == ["--all"]
    mark = stamp() if every else first_stamp()
    if fresh(mark) or fresh(stamp()):
        return 0
    what, then = (("every dtype x op", "a minute or two on a fresh clone") if every else
                  ("the float32 sum", "other dtypes and ops compile at their first use"))
    print(f"run.sh: numba compiles {what} into {mark.parent} (once; {then})", file=sys.stderr,
          flush=True)
    started, cpu = time.monotonic(), time.process_time()
    if drop_stale_kernel_callers():
        print("run.sh: kernels.py changed: the executor's and shm's loops compile again",
              file=sys.stderr, flush=True)
    if every:
        kernels.notices = False         # (one line per kernel would be 103 lines)
        if everything():
            return 1
    else:
        first_share()
    mark.touch()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = time.process_time() - cpu + children.ru_utime + children.ru_stime
    print(f"run.sh: compiled in {time.monotonic() - started:.0f} s ({cpu:.0f} s of CPU)",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
