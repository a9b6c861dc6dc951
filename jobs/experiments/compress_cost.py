"""What wire compression costs a CPU node: the compressed all-reduce against the uncompressed one.

    mpiexec -n 2 python -m mpi4py jobs/experiments/compress_cost.py [--mib 8,16,46,64]
        [--rounds 9] [--compress bf16] [--algorithm auto] [--outdir docs/results]

At each size (fp32, MiB) three calls take turns, ``--rounds`` times each, all
``mpicoll.iallreduce(MPI.IN_PLACE, x, ...).wait()`` as DDP's hooks call it: uncompressed,
``compress=`` (``--compress``), and ``compress=`` with ``error_feedback=`` (what
``mpicoll.torch.compress_hook`` runs). Before each call every rank refills ``x`` with the same
seeded gradients (not timed) and the ranks meet in a barrier. Per call: its wall time and the
process's CPU time (every thread's: the progress thread does the work), and its minor page
faults (fresh memory first touched: a buffer the call allocates and writes). ratio = compressed /
uncompressed of the medians (< 1: compression pays). Writes DIR/compress_cost-np<N>.json;
``python jobs/experiments/compress_cost.py --table A.json [B.json ...]`` prints docs/training.md's
table: per size, the median over the files (runs) of each run's medians (no MPI).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import sys
import time

from mpi4py import MPI

import numpy as np

import mpicoll
from _util import RANK, outdir, parser, say, write_json

KINDS = ("none", "codec", "codec+ef")


def one(kind: str, x: np.ndarray, grad: np.ndarray, ef, compress: str, algorithm: str,
        comm) -> tuple[float, float, int]:
    np.copyto(x, grad)
    comm.Barrier()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    wall, cpu = time.perf_counter(), time.process_time()
    kw = {} if kind == "none" else {"compress": compress}
    if kind == "codec+ef":
        kw["error_feedback"] = ef
    mpicoll.iallreduce(MPI.IN_PLACE, x, algorithm=algorithm, comm=comm, **kw).wait()
    return (time.perf_counter() - wall, time.process_time() - cpu,
            resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults)


def table(paths) -> str:
    """Per size: wall and CPU ms of each kind, and compressed + EF / uncompressed."""
    runs = [json.loads(open(p).read()) for p in paths]
    out = ["| MiB | uncompressed ms (CPU) | bf16 ms (CPU) | bf16 + EF ms (CPU) | "
           "bf16 + EF / uncompressed, wall (CPU) |", "|---:|---:|---:|---:|---:|"]
    for k, row in enumerate(runs[0]["rows"]):
        med = {kind: {m: statistics.median(r["rows"][k]["median"][kind][m] for r in runs)
                      for m in ("wall_ms", "cpu_ms")} for kind in KINDS}
        cells = [f"{med[kind]['wall_ms']:.1f} ({med[kind]['cpu_ms']:.1f})" for kind in KINDS]
        ratio = [med["codec+ef"][m] / med["none"][m] for m in ("wall_ms", "cpu_ms")]
        out.append(f"| {row['mib']:g} | " + " | ".join(cells) +
                   f" | {ratio[0]:.2f} ({ratio[1]:.2f}) |")
    return "\n".join(out)


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--mib", default="8,16,46,64")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--compress", default="bf16")
    ap.add_argument("--algorithm", default="auto")
    args = ap.parse_args()
    comm = MPI.COMM_WORLD.Dup()
    rows = []
    for mib in (float(m) for m in args.mib.split(",")):
        n = int(mib * 2**20) // 4
        grad = np.random.default_rng(RANK).standard_normal(n, dtype=np.float32)
        x, ef = np.empty_like(grad), mpicoll.ErrorFeedback(n)
        times: dict = {k: [] for k in KINDS}
        for k in KINDS:                                     # warm-up: kernels, first touch
            one(k, x, grad, ef, args.compress, args.algorithm, comm)
        for _ in range(args.rounds):
            for k in KINDS:
                times[k].append(one(k, x, grad, ef, args.compress, args.algorithm, comm))
        med = {k: {"wall_ms": 1e3 * statistics.median(t[0] for t in v),
                   "cpu_ms": 1e3 * statistics.median(t[1] for t in v),
                   "page_faults": statistics.median(t[2] for t in v)}
               for k, v in times.items()}
        rows.append({"mib": mib, "median": med})
        say(f"{mib:5g} MiB  none {med['none']['wall_ms']:6.1f} ms ({med['none']['cpu_ms']:6.1f} "
            f"CPU)  {args.compress} {med['codec']['wall_ms']:6.1f} ({med['codec']['cpu_ms']:6.1f})"
            f"  +ef {med['codec+ef']['wall_ms']:6.1f} ({med['codec+ef']['cpu_ms']:6.1f})  "
            f"ratio wall {med['codec+ef']['wall_ms'] / med['none']['wall_ms']:.2f} "
            f"cpu {med['codec+ef']['cpu_ms'] / med['none']['cpu_ms']:.2f}; page faults "
            + " ".join(f"{med[k]['page_faults']:g}" for k in KINDS))
    if RANK == 0:
        path = outdir(args.outdir) / f"compress_cost-np{comm.Get_size()}.json"
        write_json(path, {"size": comm.Get_size(), "compress": args.compress,
                          "algorithm": args.algorithm, "rounds": args.rounds,
                          "load": os.getloadavg(), "rows": rows})
    comm.Free()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--table"]:            # a table of recorded runs; no MPI
        print(table(sys.argv[2:]))
    else:
        main()
