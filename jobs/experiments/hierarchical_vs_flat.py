"""Hierarchical all-reduce against the flat algorithms, across nodes.

    srun -N 2 --ntasks-per-node=4 python -m mpi4py jobs/experiments/hierarchical_vs_flat.py --outdir DIR \\
        [--ranks-per-node K] [mpicoll bench options, e.g. -b 8 -e 16M -f 4]

Runs ``mpicoll bench`` on all-reduce with the flat algorithms (ring, recursive_halving,
recursive_doubling, binomial), ``hierarchical`` and the MPI library's, then compares, at each
size, hierarchical with the fastest flat algorithm: speedup = best flat time / hierarchical
time (above 1: hierarchical wins). The nodes are those the MPI library reports
(``COMM_TYPE_SHARED``); on a single node hierarchical is just its node-local phase, which the
job points out. ``--ranks-per-node K`` makes virtual nodes of K consecutive ranks instead
(``MPICOLL_RANKS_PER_NODE``). Writes DIR/hierarchical_vs_flat.json (the bench results plus
"comparison"), DIR/hierarchical_vs_flat.png (all algorithms, ``mpicoll plot``) and
DIR/hierarchical_speedup.png. slurm/hierarchical.sbatch runs it.
"""

from __future__ import annotations

import json
import os
import sys

from _util import RANK, bench_plot, outdir, parser, save_figure, write_json

from mpicoll.tools import bench

FLAT = ("ring", "recursive_halving", "recursive_doubling", "binomial")


def comparison(records: list[dict]) -> list[dict]:
    """Per size (out-of-place rows): hierarchical, the best flat algorithm, MPI, speedup."""
    rows = {}
    for r in records:
        if not r["inplace"]:
            rows.setdefault(r["size"], {})[r["algorithm"]] = r["time_us"]
    out = []
    for size, t in sorted(rows.items()):
        best = min((a for a in FLAT if a in t), key=t.get)
        out.append({"size": size, "hierarchical_us": t["hierarchical"], "best_flat": best,
                    "best_flat_us": t[best], "mpi_us": t.get("mpi"),
                    "speedup": t[best] / t["hierarchical"]})
    return out


def draw_speedup(res: dict):
    def draw(plt):
        rows = res["comparison"]
        sizes = [r["size"] for r in rows]
        fig, ax = plt.subplots(figsize=(7, 4.5))
        ax.plot(sizes, [r["speedup"] for r in rows], marker="o", label="vs best flat")
        if all(r["mpi_us"] for r in rows):
            ax.plot(sizes, [r["mpi_us"] / r["hierarchical_us"] for r in rows], marker="s",
                    color="black", ls="--", label="vs MPI library")
        ax.axhline(1, color="grey", lw=1)
        for r in rows:
            ax.annotate(r["best_flat"], (r["size"], r["speedup"]), fontsize=6, rotation=45,
                        xytext=(3, 3), textcoords="offset points", color="grey")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("speedup of hierarchical (time ratio)")
        ax.set_title(f"hierarchical all-reduce: {res['nranks']} ranks on {res['nodes']} node(s) "
                     f"({res['ranks_per_node']} per node)", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        return fig
    return draw


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--ranks-per-node", type=int,
                    help="virtual nodes of K consecutive ranks instead of the real ones")
    args, bench_args = ap.parse_known_args(argv)
    if args.ranks_per_node:
        os.environ["MPICOLL_RANKS_PER_NODE"] = str(args.ranks_per_node)
    out = outdir(args.outdir)
    path = out / "hierarchical_vs_flat.json"
    status = bench.main(["--collective", "allreduce", "-a", ",".join(FLAT + ("hierarchical",)),
                         *bench_args, "--json", str(path)])
    if RANK == 0:
        res = json.loads(path.read_text())
        res["flat_algorithms"] = list(FLAT)
        res["comparison"] = comparison(res["records"])
        write_json(path, res)
        if res["nodes"] < 2:
            print(f"# NOTE: {res['nranks']} ranks on ONE node: hierarchical has no inter-node "
                  f"phase here. Run on 2+ nodes, or pass --ranks-per-node K.")
        print(f"\n# hierarchical vs flat, {res['nranks']} ranks on {res['nodes']} node(s) "
              f"({res['ranks_per_node']} per node"
              f"{', virtual' if res.get('virtual_nodes') else ''}); speedup > 1: hierarchical "
              f"is faster")
        print(f"{'size(B)':>10} {'hier(us)':>10} {'best flat':>18} {'flat(us)':>10} "
              f"{'speedup':>8}")
        for r in res["comparison"]:
            print(f"{r['size']:>10} {r['hierarchical_us']:>10.1f} {r['best_flat']:>18} "
                  f"{r['best_flat_us']:>10.1f} {r['speedup']:>8.2f}")
        bench_plot(path, out / "hierarchical_vs_flat.png")
        save_figure(out / "hierarchical_speedup.png", draw_speedup(res))
    return status


if __name__ == "__main__":
    sys.exit(main())
