"""The numba compile lock (issue 21): one per cache folder, never one per user machine-wide;
processes that find a warm cache load side by side instead of queueing; a miss compiles once."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(240)

HOLD = """
import sys, time
import mpicoll.kernels as kernels
with kernels.file_lock():
    print(kernels.lock_path(), flush=True)
    time.sleep(float(sys.argv[1]))
"""

WARM = """
import time
import numpy as np
import mpicoll.kernels as kernels
started = time.monotonic()
kernels.warmup("sum", np.dtype(np.int16))
print(f"{time.monotonic() - started:.3f}", dict(kernels.sum_into.stats.cache_misses) != {})
"""


def python(code, *args, cache, **kw):
    env = dict(os.environ, PYTHONPATH=str(ROOT), NUMBA_CACHE_DIR=str(cache))
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, text=True, **kw)


def test_lock_lives_in_the_cache_folder(tmp_path):
    proc = python(HOLD, 0, cache=tmp_path)
    path = Path(proc.communicate(timeout=120)[0].strip())
    assert path.name == "mpicoll-numba.lock"
    assert tmp_path in path.parents                      # not /tmp/mpicoll-numba-<uid>.lock


def test_warm_cache_is_loaded_while_another_process_holds_the_lock(tmp_path):
    """A holder of the lock that compiles nothing (a reader) does not make a process with a warm
    cache wait: with one exclusive lock the loader would wait out the holder's 60 s."""
    first = python(WARM, cache=tmp_path)
    _, compiled = first.communicate(timeout=200)[0].split()
    assert compiled == "True"                             # the cold process compiled
    holder = python(HOLD, 60, cache=tmp_path)
    try:
        assert holder.stdout.readline()                   # it holds the lock now
        started = time.monotonic()
        loader = python(WARM, cache=tmp_path)
        out, _ = loader.communicate(timeout=120)
        waited = time.monotonic() - started
        assert out.split()[1] == "False"                  # loaded, not compiled
        assert waited < 45, f"the warm load waited {waited:.0f} s behind the holder"
    finally:
        holder.kill()
        holder.wait()


def test_concurrent_cold_processes_compile_once(tmp_path):
    procs = [python(WARM, cache=tmp_path) for _ in range(3)]
    compiled = [p.communicate(timeout=200)[0].split()[1] for p in procs]
    assert sorted(compiled) == ["False", "False", "True"], compiled


def test_nested_in_a_thread_and_one_thread_at_a_time():
    """Nested blocks are one lock; a second thread waits for the first (a thread turning the
    lock exclusive holds numba's compiler lock, which another thread's load would need)."""
    import threading
    from mpicoll import kernels
    order = []

    def other():
        with kernels.file_lock():
            order.append("other")

    with kernels.file_lock():
        with kernels.file_lock():
            pass
        thread = threading.Thread(target=other)
        thread.start()
        thread.join(0.5)
        order.append("main")
    thread.join(30)
    assert order == ["main", "other"]


def test_warm_empties_the_kernel_callers_caches_when_kernels_changed(tmp_path, monkeypatch):
    """numba checks a cached function against its own file only: after kernels.py changes, the
    warm-up empties the caches of the loops that compile its ``reduce_at`` and ``combine_at``
    into themselves, and leaves them alone otherwise (and on a first warm-up, with no stamp
    yet)."""
    from mpicoll import kernels
    from mpicoll.tools import warm

    class Cache:
        flushed = 0

        def flush(self):
            Cache.flushed += 1

    class Caller:
        _cache = Cache()

    stamp = tmp_path / "mpicoll-warm.stamp"
    monkeypatch.setattr(warm, "stamp", lambda: stamp)
    monkeypatch.setattr(warm, "KERNEL_CALLERS", (Caller(), Caller()))
    source = Path(kernels.__file__)
    assert not warm.drop_stale_kernel_callers() and Cache.flushed == 0       # no stamp yet
    stamp.touch()
    os.utime(stamp, (source.stat().st_mtime + 10,) * 2)                   # warmed after it
    assert not warm.drop_stale_kernel_callers() and Cache.flushed == 0
    os.utime(stamp, (source.stat().st_mtime - 10,) * 2)                   # kernels.py newer
    assert warm.drop_stale_kernel_callers() and Cache.flushed == 2


FIRST_USE = """
import numpy as np
import mpicoll.kernels as kernels
kernels.entry_points("bxor", np.dtype(np.int8))
"""


def test_a_compilation_at_first_use_says_so_in_one_line_and_a_load_says_nothing(tmp_path):
    """Issue 44: what numba compiles at a call's first use is named on stderr, in one line that
    ends with the seconds it took; the next process, which loads it from the cache, is silent."""
    lines = []
    for _ in range(2):
        proc = python(FIRST_USE, cache=tmp_path, stderr=subprocess.PIPE)
        out, err = proc.communicate(timeout=200)
        assert proc.returncode == 0, err
        lines.append(err.splitlines())
    compiled, loaded = lines
    assert len(compiled) == 1, compiled
    assert compiled[0].startswith("mpicoll: first use: numba compiles the bxor kernel for int8 "
                                  "(then cached) ") and compiled[0].endswith(" s"), compiled
    assert loaded == []
