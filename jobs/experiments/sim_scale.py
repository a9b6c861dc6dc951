"""Speed of the timed executor at datacenter scale: wall time and peak memory of one simulated call.

    python jobs/experiments/sim_scale.py                      # the cases of docs/simulator.md
    python jobs/experiments/sim_scale.py --case ring:dgx-h100-textbook:2048x8:1G
    python jobs/experiments/sim_scale.py --case hierarchical+outer=ring:dgx-h100-textbook:3072x8:1G --timeout 60

A case is ALGORITHM[+OPTION=VALUE...]:FABRIC:NODESxPER_NODE:SIZE. Each runs in a fresh
interpreter (so peak RSS is the case's own), after one warm-up call on a small fabric that loads
the compiled kernels, and is stopped after --timeout seconds (reported as such), so the job
always finishes. Not MPI: it runs on one core.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

# Issue 24's scale targets (<= 20 s, <= 1 GB each): uneven ring blocks at 16,384 ranks
# (1e9 B = 2.5e8 floats on 16,384 ranks) and the hierarchical all-reduce with an outer ring at
# 3,072 x 8; then equal blocks, and the rank-order ring at 24,576 ranks (uneven blocks).
CASES = ["ring:flat:16384x1:1000000000", "hierarchical+outer=ring:dgx-h100-textbook:3072x8:1G",
         "ring:flat:16384x1:1G", "ring:dgx-h100-textbook:2048x8:1G", "hierarchical:dgx-h100-textbook:3072x8:1G",
         "ring:dgx-h100-textbook:3072x8:1G"]


def one(case: str) -> dict:
    from mpicoll.simulators import fabric, timed
    from mpicoll.tools.sizes import parse_size
    algorithm, name, shape, size = case.split(":")
    algorithm, *opts = algorithm.split("+")
    options = dict(o.split("=", 1) for o in opts)
    nodes, per_node = map(int, shape.split("x"))
    timed.simulate("allreduce", algorithm, fabric.preset(name, 4, per_node), 1 << 20,
                   **options)                                                   # warm-up
    t0, c0 = time.perf_counter(), time.process_time()
    r = timed.simulate("allreduce", algorithm, fabric.preset(name, nodes, per_node),
                       parse_size(size), **options)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"case": case, "ranks": nodes * per_node, "wall_s": round(wall, 2),
            "cpu_s": round(cpu, 2),
            "peak_rss_MiB": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "predicted_ms": round(r.time * 1e3, 3), "waves": r.waves,
            "busbw_GBps": round(r.busbw / 1e9, 2), "critical_path": r.critical_path()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", action="append",
                    help="ALGORITHM:FABRIC:NODESxPER_NODE:SIZE (repeatable)")
    ap.add_argument("--timeout", type=float, default=120,
                    help="seconds per case before it is stopped (default 120)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one)))
        return 0
    print(f"| case | ranks | wall (s) | CPU (s) | peak RSS (MiB) | predicted (ms) | "
          f"busbw (GB/s) | waves | critical path |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for case in args.case or CASES:
        try:
            out = subprocess.run([sys.executable, __file__, "--one", case], capture_output=True,
                                 text=True, check=True, timeout=args.timeout).stdout
        except subprocess.TimeoutExpired:
            print(f"| `{case}` | | > {args.timeout:g} (stopped) | | | | | | |", flush=True)
            continue
        r = json.loads(out.strip().splitlines()[-1])
        print(f"| `{r['case']}` | {r['ranks']} | {r['wall_s']} | {r['cpu_s']} | "
              f"{r['peak_rss_MiB']} | "
              f"{r['predicted_ms']} | {r['busbw_GBps']} | {r['waves']} | {r['critical_path']} |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
