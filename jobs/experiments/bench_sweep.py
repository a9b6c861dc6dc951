"""The benchmark sweep: every algorithm of each collective against the MPI library's own.

    mpiexec -n 4 python -m mpi4py jobs/experiments/bench_sweep.py --outdir DIR [--collectives all] \\
        [mpicoll bench options, e.g. -b 8 -e 4M -f 4 -n 20]

For each collective (default allreduce; a comma list, or "all" for the four) this runs
``mpicoll bench`` with the options given (sizes, iterations, dtype ...; ``mpicoll bench -h``),
which prints its table, and writes DIR/bench-<collective>.json and DIR/bench-<collective>.png
(``mpicoll plot``). The exit status is 1 if any element of any result was wrong.
slurm/bench.sbatch and slurm/sweep.sbatch run it.
"""

from __future__ import annotations

import json
import sys

from _util import RANK, bench_plot, outdir, parser, say

from mpicoll.tools import bench


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--collectives", default="allreduce",
                    help=f"comma list of {', '.join(bench.COLLECTIVE_NAMES)}, or all")
    args, bench_args = ap.parse_known_args(argv)
    names = (bench.COLLECTIVE_NAMES if args.collectives == "all"
             else args.collectives.split(","))
    out = outdir(args.outdir)
    status, summary = 0, []
    for name in names:
        path = out / f"bench-{name}.json"
        say(f"\n## {name}")
        status |= bench.main(["--collective", name, *bench_args, "--json", str(path)])
        if RANK == 0:
            res = json.loads(path.read_text())
            checked = [r["wrong"] for r in res["records"] if r["wrong"] is not None]
            wrong = f"{sum(checked)} wrong elements" if checked else "not checked (--no-check)"
            summary.append(f"#   {name}: {res['nranks']} ranks on {res['nodes']} node(s), "
                           f"{len(res['records'])} measurements, {wrong}")
            bench_plot(path, path.with_suffix(".png"))
    say("\n# bench sweep summary\n" + "\n".join(summary))
    return status


if __name__ == "__main__":
    sys.exit(main())
