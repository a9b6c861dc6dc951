"""Scaling in N: all-reduce time of every algorithm (and MPI's) on N = 2, 4, ... ranks.

    mpiexec -n 8 python -m mpi4py jobs/experiments/scaling.py --outdir DIR [--nranks 2,4,8] \\
        [--sizes 8,64K,1M] [-n ITERS] [-a ring,binomial,...]

For each N the first N ranks of COMM_WORLD form a communicator (the others wait) and run
``mpicoll bench`` on it (``bench.run``) at each size: validated results, algorithms
interleaved, the median of the slowest rank's time. With ranks placed node
by node (srun and mpiexec both fill a node before the next), small N stay on one node and
larger N cross nodes; each row records its node count. Default N: 2, 3, ... up to the job's
size when that is at most 8, else the powers of two and the size itself. Writes
DIR/scaling.json and DIR/scaling.png (time against N, one panel per size).
slurm/scaling.sbatch runs it.
"""

from __future__ import annotations

import sys

from _util import RANK, outdir, parser, save_figure, say, write_json
from mpi4py import MPI

from mpicoll import kernels
from mpicoll.tools import bench
from mpicoll.tools.sizes import parse_size
from mpicoll.registry import ALLREDUCE
from mpicoll.testing import nodes as node_layout


def draw(res: dict):
    def draw_fn(plt):
        sizes = sorted({r["size"] for r in res["records"]})
        fig, axes = plt.subplots(1, len(sizes), figsize=(4.5 * len(sizes), 4.2), squeeze=False)
        for ax, size in zip(axes[0], sizes):
            for a in res["algorithms"]:
                rows = [r for r in res["records"] if r["size"] == size and r["algorithm"] == a]
                style = dict(color="black", lw=2, ls="--") if a == "mpi" else dict(marker="o")
                ax.plot([r["nranks"] for r in rows], [r["time_us"] for r in rows], label=a,
                        **style)
            ax.set_title(f"{size} B", fontsize=10)
            ax.set_xlabel("N (ranks)")
            ax.set_xticks(res["nranks"])
            ax.set_yscale("log")
            ax.grid(True, which="both", alpha=0.3)
        axes[0][0].set_ylabel("time (µs), median")
        axes[0][-1].legend(fontsize=7)
        fig.suptitle(f"all-reduce scaling in N ({res['nodes']} node(s) in the job)", fontsize=10)
        return fig
    return draw_fn


def main(argv=None) -> int:
    world = MPI.COMM_WORLD
    size = world.Get_size()
    ap = parser(__doc__)
    ap.epilog = None
    ap.add_argument("--nranks", help="comma list of N (default: 2..size up to 8; "
                                     "else powers of two and the size)")
    ap.add_argument("--sizes", default="8,64K,1M", help="comma list (default 8,64K,1M)")
    ap.add_argument("-a", "--algorithms", default=",".join(ALLREDUCE),
                    help="comma list (default: all, with mpi)")
    ap.add_argument("-n", "--iters", type=int, default=20)
    ap.add_argument("-w", "--warmup", type=int, default=3)
    args = ap.parse_args(argv)
    ns = ([int(n) for n in args.nranks.split(",")] if args.nranks else
          list(range(2, size + 1)) if size <= 8 else
          sorted({2 ** k for k in range(1, size.bit_length())} | {size}))
    if max(ns) > size:
        raise SystemExit(f"scaling: N = {max(ns)} > {size} ranks in the job")
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    algorithms = args.algorithms.split(",")
    out = outdir(args.outdir)
    nodes_all = len(node_layout(world))

    records = []
    for n in ns:
        sub = world.Split(0 if world.Get_rank() < n else MPI.UNDEFINED, world.Get_rank())
        if sub != MPI.COMM_NULL:
            nodes = node_layout(sub)
            for nbytes in sizes:
                say(f"# N={n}, {len(nodes)} node(s)")
                bench_args = bench.parse_args(["-b", str(nbytes), "-e", str(nbytes), "-n",
                                               str(args.iters), "-w", str(args.warmup),
                                               "-a", ",".join(algorithms)])
                _, recs, _ = bench.run(sub, bench_args)
                records += [{"nranks": n, "nodes": len(nodes), **r} for r in recs]
            sub.Free()
        world.Barrier()
    total_wrong = sum(r["wrong"] for r in records)
    if RANK == 0:
        res = {"nranks": ns, "nodes": nodes_all, "algorithms": algorithms,
               "mpi_library": MPI.Get_library_version().splitlines()[0].strip(),
               "records": records}
        write_json(out / "scaling.json", res)
        save_figure(out / "scaling.png", draw(res))
        print(f"# {'all results correct' if total_wrong == 0 else f'{total_wrong} WRONG'}")
    return 1 if world.bcast(total_wrong) else 0


if __name__ == "__main__":
    sys.exit(main())
