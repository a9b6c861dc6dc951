"""A rank dies: the survivors' ``Work.wait()`` and ``future.wait()`` raise ``RuntimeError`` from
the ``ProcessFailed`` naming it, and so does a DDP step. Run by test_jobs.py:

    mpiexec -disable-auto-cleanup -n N python -m mpicoll survive python tests/torch/dead_rank.py OUTDIR

Every rank initialises "mpicoll" with ``timeout=10 s`` and makes good all-reduces (the first on
a group with a long timeout: numba's first compile on a loaded machine must not count); then the
last rank exits (``os._exit``: no MPI_Finalize) and the others start an async all-reduce and
wait for it. Each survivor writes OUTDIR/rank<r>.json: what ``Work.wait()``, the future and a
next blocking ``all_reduce`` raised, how long the first took, and what a DDP step on a group
made before the death (``ddp``) raised.
"""

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

import mpicoll.torch  # noqa: F401 -- registers the backend


def caught(fn) -> dict:
    try:
        fn()
    except Exception as exc:            # noqa: BLE001 -- the point is to report it
        cause = exc.__cause__
        return {"type": type(exc).__name__, "message": str(exc),
                "cause": type(cause).__name__ if cause is not None else None,
                "peers": getattr(exc, "peers", None)}
    return {"type": None}


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("mpicoll", timeout=timedelta(seconds=10))
    rank, size = dist.get_rank(), dist.get_world_size()
    patient = dist.new_group(backend="mpicoll", timeout=timedelta(seconds=300))
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 8),
                                                      process_group=patient)
    model(torch.ones(4, 64)).sum().backward()       # a good step first
    x = torch.ones(1000)
    dist.all_reduce(x, group=patient)
    dist.all_reduce(x, async_op=True).wait()
    assert float(x[0]) == size * size
    if rank == size - 1:
        os._exit(0)
    started = time.monotonic()
    work = dist.all_reduce(x, async_op=True)
    row = {"rank": rank, "size": size, "wait": caught(work.wait),
           "elapsed": time.monotonic() - started,
           "future": caught(lambda: work.get_future().wait()),
           "next": caught(lambda: dist.all_reduce(torch.ones(10))),
           "ddp": caught(lambda: model(torch.ones(4, 64)).sum().backward())}
    (out / f"rank{rank}.json").write_text(json.dumps(row))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
