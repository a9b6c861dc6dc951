"""Speed of the timed executor at datacenter scale: wall time and peak memory of one simulated call.

    python jobs/sim_scale.py                      # the cases of docs/simulator.md
    python jobs/sim_scale.py --case ring:dgx-h100:2048x8:1G

Each case runs in a fresh interpreter (so peak RSS is the case's own), after one warm-up call on
a small fabric that loads the compiled kernels. Not MPI: it runs on one core.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

CASES = ["ring:flat:16384x1:1G", "ring:dgx-h100:2048x8:1G", "hierarchical:dgx-h100:3072x8:1G",
         "ring:dgx-h100:3072x8:1G"]


def one(case: str) -> dict:
    from mpicoll.executors import fabric, timed
    from mpicoll.tools.sizes import parse_size
    algorithm, name, shape, size = case.split(":")
    nodes, per_node = map(int, shape.split("x"))
    timed.simulate("allreduce", algorithm, fabric.preset(name, 4, per_node), 1 << 20)  # warm-up
    t0 = time.perf_counter()
    r = timed.simulate("allreduce", algorithm, fabric.preset(name, nodes, per_node),
                       parse_size(size))
    wall = time.perf_counter() - t0
    return {"case": case, "ranks": nodes * per_node, "wall_s": round(wall, 2),
            "peak_rss_MiB": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "predicted_ms": round(r.time * 1e3, 3), "waves": r.waves,
            "busbw_GBps": round(r.busbw / 1e9, 2), "critical_path": r.critical_path()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", action="append",
                    help="ALGORITHM:FABRIC:NODESxPER_NODE:SIZE (repeatable)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one)))
        return 0
    print(f"| case | ranks | wall (s) | peak RSS (MiB) | predicted (ms) | busbw (GB/s) | "
          f"waves | critical path |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for case in args.case or CASES:
        out = subprocess.run([sys.executable, __file__, "--one", case], capture_output=True,
                             text=True, check=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        print(f"| `{r['case']}` | {r['ranks']} | {r['wall_s']} | {r['peak_rss_MiB']} | "
              f"{r['predicted_ms']} | {r['busbw_GBps']} | {r['waves']} | {r['critical_path']} |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
