"""The latency/bandwidth crossover of all-reduce: where ring overtakes the tree-like algorithms.

    mpiexec -n 4 python -m mpi4py jobs/experiments/crossover.py --outdir DIR [--profile P.json] \\
        [--calibrate-args "-n 100"] [mpicoll bench options; default -b 8 -e 4M -f 2]

Ring sends 2(N-1) messages of n/N bytes: bandwidth-optimal, but its latency term grows with N.
The tree-like algorithms (recursive_doubling, binomial) send lg N whole vectors: few messages,
more bytes. So ring wins above some size, of the order of the balance point N.alpha/beta.
This job
  1. measures alpha and beta (``mpicoll calibrate``, written to DIR/profile.json) unless
     --profile gives a profile;
  2. times ring, recursive_halving, recursive_doubling, binomial and MPI's all-reduce over the
     sizes (``mpicoll bench``, DIR/crossover-bench.json);
  3. reports the measured crossover -- the smallest size from which ring beats both tree-like
     algorithms at every larger measured size -- next to the cost model's crossover
     (``mpicoll.model.predict`` with that profile) and the estimate N.alpha/beta, using the
     inter-node alpha/beta when the ranks span several nodes.
Writes DIR/crossover.json and DIR/crossover.png. slurm/crossover.sbatch runs it.
"""

from __future__ import annotations

import json
import shlex
import sys

from _util import RANK, outdir, parser, save_figure, say, write_json
from mpi4py import MPI

from mpicoll.tools import bench, calibrate
from mpicoll.model import Profile, predict
from mpicoll.tools.plot import crossover

TREES = ("recursive_doubling", "binomial")
ALGORITHMS = ("ring", "recursive_halving") + TREES
DEFAULT_SIZES = ["-b", "8", "-e", "4M", "-f", "2"]


def draw(res: dict):
    def draw_fn(plt):
        fig, ax = plt.subplots(figsize=(8, 5))
        sizes = res["sizes"]
        for i, a in enumerate(ALGORITHMS):
            color = f"C{i}"
            ax.plot(sizes, res["measured_us"][a], marker="o", ms=3, color=color, label=a)
            if res["predicted_us"]:
                ax.plot(sizes, res["predicted_us"][a], ls="--", lw=1, color=color,
                        label=f"{a} (model)")
        if "mpi" in res["measured_us"]:
            ax.plot(sizes, res["measured_us"]["mpi"], color="black", lw=2, ls=":",
                    label="mpi (MPI library)")
        marks = (("measured_crossover", "black", "-", "measured crossover"),
                 ("model_crossover", "grey", "--", "model crossover"),
                 ("n_alpha_over_beta", "red", "-.", "N·α/β"))
        for key, color, ls, label in marks:
            if res.get(key):
                ax.axvline(res[key], color=color, ls=ls, lw=1.2,
                           label=f"{label} = {res[key]:.0f} B")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("time (µs), median")
        ax.set_title(f"all-reduce latency/bandwidth crossover: {res['nranks']} ranks on "
                     f"{res['nodes']} node(s)", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
        return fig
    return draw_fn


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--profile", help="a profile JSON instead of calibrating")
    ap.add_argument("--calibrate-args", default="-n 100",
                    help='options for mpicoll calibrate (default "-n 100")')
    args, bench_args = ap.parse_known_args(argv)
    out = outdir(args.outdir)
    nranks = MPI.COMM_WORLD.Get_size()

    profile_path = args.profile
    if not profile_path and nranks > 1:
        profile_path = str(out / "profile.json")
        say("## calibrate: alpha, beta, gamma")
        calibrate.main(["-o", profile_path, *shlex.split(args.calibrate_args)])
    say("\n## bench: ring against the tree-like algorithms")
    path = out / "crossover-bench.json"
    status = bench.main(["--collective", "allreduce", "-a", ",".join(ALGORITHMS),
                         *(bench_args or DEFAULT_SIZES), "--json", str(path)])
    if RANK != 0:
        return status

    res = json.loads(path.read_text())
    rows = [r for r in res["records"] if not r["inplace"]]
    sizes = sorted({r["size"] for r in rows})
    measured = {a: [next(r["time_us"] for r in rows if r["size"] == s and r["algorithm"] == a)
                    for s in sizes] for a in ALGORITHMS + ("mpi",)}
    summary = {"nranks": res["nranks"], "nodes": res["nodes"],
               "ranks_per_node": res["ranks_per_node"], "sizes": sizes,
               "measured_us": measured, "bench": path.name, "predicted_us": None,
               "measured_crossover": crossover(sizes, measured["ring"],
                                               [measured[t] for t in TREES]),
               "model_crossover": None, "n_alpha_over_beta": None, "profile": None}
    if profile_path:
        profile = Profile.from_json(profile_path)
        multi = res["nodes"] > 1
        rpn = max(res["ranks_per_node"]) if isinstance(res["ranks_per_node"], list) \
            else res["ranks_per_node"]
        predicted = {a: [predict(a, nranks, s, profile, ranks_per_node=rpn if multi else None)
                         * 1e6 for s in sizes] for a in ALGORITHMS}
        alpha, beta = profile.link(multi)
        summary.update(predicted_us=predicted, link="inter-node" if multi else "intra-node",
                       alpha_us=alpha * 1e6, beta_ns_per_byte=beta * 1e9,
                       profile={k: v for k, v in vars(profile).items() if k != "meta"},
                       model_crossover=crossover(sizes, predicted["ring"],
                                                 [predicted[t] for t in TREES]),
                       n_alpha_over_beta=nranks * alpha / beta)
    write_json(out / "crossover.json", summary)

    def fmt(v):
        return f"{v:.0f} B" if v else f"not reached up to {sizes[-1]} B"
    print(f"\n# ring vs tree-like all-reduce, {nranks} ranks on {res['nodes']} node(s)")
    print(f"#   measured crossover:  {fmt(summary['measured_crossover'])}")
    if profile_path:
        print(f"#   model crossover:     {fmt(summary['model_crossover'])}")
        print(f"#   N.alpha/beta:        {summary['n_alpha_over_beta']:.0f} B  ({summary['link']}"
              f" alpha = {summary['alpha_us']:.2f} us, beta = "
              f"{summary['beta_ns_per_byte']:.4f} ns/B)")
    save_figure(out / "crossover.png", draw(summary))
    return status


if __name__ == "__main__":
    sys.exit(main())
