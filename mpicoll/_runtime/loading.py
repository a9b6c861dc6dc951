"""Kernel loading under the call's deadline.

The first call of a process that needs a numba kernel (or the compiled executor's loop) for a
dtype compiles it, or loads it from numba's disk cache, under a file lock that the processes
sharing the cache directory take in turn (``kernels.file_lock``). That is local work, but it
can take long: ~1.3 s to compile cold, tens of seconds on a loaded machine, or as long as
another process holds the lock. ``load`` runs it in a helper thread while the calling thread
goes on polling the call's ``Watch`` (``Watch.overdue``): the time counts against the call's
deadline, and meanwhile the rank answers another rank's roll call and sees notices, so a
timeout names the loading rank as slow ("every rank answered"), never as absent, and every
rank's message agrees. Past the deadline the call raises ``CollectiveTimeout`` in the step
"loading the numba kernels"; the helper thread finishes the work in the background (the
kernel is then ready for the next call) and releases the lock.
"""

from __future__ import annotations

import threading

__all__ = ["load", "STEP"]

STEP = ("loading the numba kernels (compiling, or waiting for the lock of the cache "
        "directory that another process holds)")


def load(work, watch) -> None:
    """Run ``work()`` (no arguments) under ``watch``'s deadline (None: just run it)."""
    if watch is None:
        work()
        return
    done, failure = threading.Event(), []

    def run():
        try:
            work()
        except BaseException as exc:        # noqa: BLE001 - raised in the caller's thread
            failure.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, name="mpicoll-kernel-load", daemon=True).start()
    pause = 1e-4
    while not done.wait(pause):
        watch.overdue(STEP)
        pause = min(2 * pause, 5e-3)
    if failure:
        raise failure[0]
