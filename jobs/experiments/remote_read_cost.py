"""What reading another rank's memory costs, and what it costs the owner afterwards (2 ranks).

    mpiexec -n 2 python jobs/experiments/remote_read_cost.py                  # 64 KiB, 512 KiB, 2 MiB
    mpiexec -n 2 python jobs/experiments/remote_read_cost.py --sizes 1048576 --calls 500

The two measurements behind ``shm``'s single copy (``mpicoll/algorithms/allreduce_shm.py``,
docs/performance.md):

* **read**: rank 0 copies rank 1's buffer into its own with ``process_vm_readv`` (Linux's
  cross-memory attach, what the single copy and MPI's single-copy transports do), the buffer
  either untouched since the last read ("clean") or just rewritten by rank 1 ("dirty", its lines
  modified in rank 1's cache); beside it, the same bytes as an MPI message (``Send``/``Recv``).
* **write after a remote read**: rank 0 rewrites a buffer of its own (``np.copyto``) when
  nobody else has read it, right after rank 1 read it with ``process_vm_readv``, and after rank
  1 read it and then streamed 8 MiB of its own (pushing those lines out of its caches).

Each timed operation follows a barrier; rank 0 prints medians in microseconds.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import time

import numpy as np
from mpi4py import MPI

SIZES = (64 << 10, 512 << 10, 2 << 20)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="comma list of bytes")
    ap.add_argument("--calls", type=int, default=200, help="timed operations per cell")
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    if comm.Get_size() != 2:
        raise SystemExit("run it with 2 ranks: "
                         "mpiexec -n 2 python jobs/experiments/remote_read_cost.py")
    readv = getattr(ctypes.CDLL(None), "process_vm_readv", None)
    if readv is None:
        raise SystemExit("this libc has no process_vm_readv (Linux only)")
    rank = comm.Get_rank()
    if rank == 0:
        print(f"# 2 ranks, median us of {args.calls} (GB/s = bytes / time)")
        print(f"{'size(B)':>10} {'read clean':>15} {'read dirty':>15} {'MPI msg':>15} | "
              f"{'write':>7} {'after read':>11} {'after read+evict':>17}")
    for nbytes in map(int, args.sizes.split(",")):
        mine = np.ones(nbytes // 4, np.float32)
        into = np.empty_like(mine)
        other = np.full_like(mine, 2.0)
        pids = comm.allgather((os.getpid(), mine.ctypes.data))
        peer = 1 - rank
        iov = np.array([into.ctypes.data, nbytes, pids[peer][1], nbytes], np.int64)

        def read_peer():
            moved = readv(pids[peer][0], ctypes.c_void_p(iov.ctypes.data), 1,
                          ctypes.c_void_p(iov.ctypes.data + 16), 1, 0)
            if moved != nbytes:
                raise OSError(ctypes.get_errno(), "process_vm_readv failed (ptrace policy?)")

        med = {}
        for case in ("read clean", "read dirty", "MPI msg", "write", "after read",
                     "after read+evict"):
            times = []
            for _ in range(args.calls):
                if case == "read dirty" and rank == 1:
                    mine += 1.0                 # rank 0 reads lines modified in rank 1's cache
                if case.startswith("after read") and rank == 1:
                    read_peer()                 # rank 1 now holds rank 0's lines
                    if case.endswith("evict"):
                        np.ones(8 << 20, np.uint8).sum()
                comm.Barrier()
                start = time.perf_counter()
                if case == "MPI msg":
                    if rank == 1:
                        comm.Send(mine, 0)
                    else:
                        comm.Recv(into, 1)
                elif rank == 0:
                    if case.startswith("read"):
                        read_peer()
                    else:
                        np.copyto(mine, other)
                times.append(time.perf_counter() - start)
                comm.Barrier()
            med[case] = np.median(times) * 1e6
        if rank == 0:
            def cell(name, width):
                return f"{med[name]:.1f} ({nbytes / med[name] / 1e3:.1f})".rjust(width)
            print(f"{nbytes:>10} {cell('read clean', 15)} {cell('read dirty', 15)} "
                  f"{cell('MPI msg', 15)} | {med['write']:7.1f} {med['after read']:11.1f} "
                  f"{med['after read+evict']:17.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
