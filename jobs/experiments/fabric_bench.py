"""Every all-reduce algorithm, ``auto`` and MPI_Allreduce across the nodes of a shaped fabric.

    srun -N 4 --ntasks-per-node=2 python -m mpi4py jobs/experiments/fabric_bench.py --outdir DIR \\
        [--small 8:64K] [--large 256K:16M] [--huge 64M] [--quick]

Runs ``mpicoll bench`` (its interleaved timing: at each size the variants take turns in a fresh
random order every iteration, each call between barriers, the slowest rank's time, the median)
on the ranks of this job step, with these variants of the all-reduce:

    ring (order=rank), ring@order=node, recursive_halving, recursive_doubling, binomial,
    double_binary_tree, naive, hierarchical@inner=ring, hierarchical@inner=recursive_halving,
    hierarchical@inner=binomial, hierarchical@inner=shm, hierarchical@inner=shm+outer=ring,
    auto, mpi

``NAME@KEY=VALUE[+KEY=VALUE]`` is NAME called with the keywords (``mpicoll.allreduce(...,
order="node")``); hierarchical keeps its default outer algorithm (recursive_doubling) but in
the one variant with ``outer=ring`` (each node's link then carries 1.5 x size, not 2 x). Sizes
come in three bands, each its own bench run with its own iteration count: ``--small`` (factor
8, 20 iterations), ``--large`` (factor 4, 3 iterations, 1 warm-up) and ``--huge`` (3
iterations, 1 warm-up, only ring, ring@order=node, the hierarchical variants, auto and mpi: the
others take seconds per call there at 1 Gbit/s). ``--quick`` is a smoke test (2 sizes).

Writes DIR/fabric-bench-<fabric>-<N>x<K>[-cyclic][-TAG].json (-cyclic: ranks not placed in
blocks; ``--tag TAG``): bench's preamble (+ ``fabric``, ``link``: the node link's tbf rate as
the fabric script set it; ``profile``: the cost model's profile, which ``auto`` decides by when
no decision table serves the layout) and the records of all bands, where ``algorithm`` is the
variant's name. ``--variants A,B,...`` times only those (every band), ``--small ''`` skips the
small band.

    python jobs/experiments/fabric_bench.py --table FILE...     # a markdown table of auto against MPI
    python jobs/experiments/fabric_bench.py --at 32K FILE...    # every variant at one size, a row per file
"""

from __future__ import annotations

import json
import os
import sys

from _util import RANK, outdir, parser, say, write_json
from mpi4py import MPI

import mpicoll
from mpicoll.tools import bench
from mpicoll.tools.sizes import human

VARIANTS = ("ring", "ring@order=node", "recursive_halving", "recursive_doubling", "binomial",
            "double_binary_tree", "naive", "hierarchical@inner=ring",
            "hierarchical@inner=recursive_halving", "hierarchical@inner=binomial",
            "hierarchical@inner=shm", "hierarchical@inner=shm+outer=ring", "auto", "mpi")
HUGE = ("ring", "ring@order=node", "hierarchical@inner=ring",
        "hierarchical@inner=recursive_halving", "hierarchical@inner=shm",
        "hierarchical@inner=shm+outer=ring", "auto", "mpi")


def split(variant: str) -> tuple[str, dict]:
    """``"ring@order=node"`` -> ``("ring", {"order": "node"})``."""
    name, _, rest = variant.partition("@")
    opts = dict(kv.split("=", 1) for kv in rest.replace("+", ",").split(",") if kv)
    return name, opts


def install_variants() -> None:
    """Let ``mpicoll bench`` time ``NAME@KEY=VALUE`` variants: its calls go through
    ``mpicoll.allreduce`` (looked up at call time), its checks through ``lookup``/``predict``."""
    real_allreduce, real_lookup, real_predict = mpicoll.allreduce, bench.lookup, bench.predict

    def allreduce(sendbuf, recvbuf=None, *, algorithm="auto", **kw):
        name, opts = split(algorithm)
        return real_allreduce(sendbuf, recvbuf, algorithm=name, **opts, **kw)

    mpicoll.allreduce = allreduce
    bench.lookup = lambda collective, variant: real_lookup(collective, split(variant)[0])
    bench.predict = lambda variant, *a, **k: real_predict(split(variant)[0], *a, **k)


def link() -> dict:
    """What local-cluster.sh --fabric says about the node's link (the task environment)."""
    out = {"fabric": os.environ.get("MPICOLL_FABRIC"), "ucx_tls": os.environ.get("UCX_TLS")}
    try:
        out["eth0_mtu"] = int(open("/sys/class/net/eth0/mtu").read())
    except OSError:
        out["eth0_mtu"] = None
    return out


def band(comm, sizes: str, factor: str, iters: int, warmup: int, variants) -> list[dict]:
    lo, _, hi = sizes.partition(":")
    args = bench.parse_args(["-b", lo, "-e", hi or lo, "-f", factor, "-n", str(iters),
                             "-w", str(warmup), "-a", "ring", "--timeout", "600"])
    args.algorithms = ",".join(variants)
    t0 = MPI.Wtime()
    _, records, wrong = bench.run(comm, args)
    say(f"# band {sizes}: {MPI.Wtime() - t0:.0f} s")
    if wrong:
        raise SystemExit(f"{wrong} wrong elements")
    return records


def profile() -> dict:
    """The cost model's profile ``auto`` decides by (``MPICOLL_PROFILE``): its path and links."""
    from mpicoll import model, settings
    pr = model.default_profile()
    return {"path": str(settings.get("MPICOLL_PROFILE")), "alpha": pr.alpha, "beta": pr.beta,
            "alpha_inter": pr.alpha_inter, "beta_inter": pr.beta_inter}


def table(paths) -> str:
    """Per file and size: each variant's median in ms, what ``auto`` ran, and auto / MPI
    (MPI_Allreduce's time over auto's: > 1 is auto faster)."""
    lines = []
    for path in paths:
        data = json.loads(open(path).read())
        times, chose = {}, {}
        for r in data["records"]:
            times.setdefault(r["size"], {})[r["algorithm"]] = r["time_us"] / 1e3
            if r["algorithm"] == "auto":
                chose[r["size"]] = r.get("auto_choice") or "?"
        variants = [v for v in data["variants"] if v not in ("auto", "mpi")]
        pr = data.get("profile")
        inter = ("not recorded" if pr is None else
                 "no inter-node link (one node's)" if pr.get("beta_inter") is None else
                 f"alpha_inter {pr['alpha_inter'] * 1e6:.0f} us, "
                 f"1/beta_inter {1 / pr['beta_inter'] / 1e6:.0f} MB/s")
        lines += [f"{data['nodes']} x {data['ranks_per_node']}, {data.get('fabric')}, "
                  f"profile: {inter}", "",
                  "| size | " + " | ".join(variants) + " | auto | auto ran | MPI | MPI / auto |",
                  "|---:|" + "---:|" * len(variants) + "---:|---|---:|---:|"]
        for size in sorted(times):
            row = times[size]
            lines.append(f"| {human(size)} | " + " | ".join(
                f"{row[v]:.2f}" if v in row else "-" for v in variants)
                + f" | {row['auto']:.2f} | {chose[size]} | {row['mpi']:.2f} | "
                f"{row['mpi'] / row['auto']:.2f}x |")
        lines.append("")
    return "\n".join(lines).rstrip("\n")


def at_size(size: str, paths) -> str:
    """One size, a row per file (its layout and tag): every variant's median in us."""
    from mpicoll.tools.sizes import parse_size
    nbytes = parse_size(size)
    rows, variants = [], []
    for path in paths:
        data = json.loads(open(path).read())
        row = {r["algorithm"]: r["time_us"] for r in data["records"]
               if r["size"] == nbytes and not r["inplace"]}
        variants += [v for v in data["variants"] if v in row and v not in variants]
        layout = f"{data['nodes']} x {data['ranks_per_node']}"
        tag = os.path.basename(path).rsplit(".", 1)[0].split(
            f"-{data['nodes']}x{data['ranks_per_node']}", 1)[-1].lstrip("-")
        rows.append((f"{layout}, {data.get('fabric')}", tag or "-", row))
    lines = [f"{human(nbytes)}, us (median of the slowest rank)", "",
             "| layout | run | " + " | ".join(variants) + " |",
             "|---|---|" + "---:|" * len(variants)]
    for layout, tag, row in rows:
        lines.append(f"| {layout} | {tag} | " + " | ".join(
            f"{row[v]:.0f}" if v in row else "-" for v in variants) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--small", default="8:32K", help="MIN:MAX of the small band (factor 8)")
    ap.add_argument("--large", default="256K:16M", help="MIN:MAX of the large band (factor 4)")
    ap.add_argument("--huge", default="64M", help="the huge band ('' for none)")
    ap.add_argument("--quick", action="store_true", help="smoke test: 8 B and 64 KiB only")
    ap.add_argument("--variants", help="comma-separated variants to time (default: all)")
    ap.add_argument("--tag", help="suffix of the JSON file's name")
    ap.add_argument("--table", nargs="+", metavar="FILE",
                    help="print a markdown table of auto against MPI from these files (no MPI)")
    ap.add_argument("--at", nargs="+", metavar=("SIZE", "FILE"),
                    help="print every variant's time at SIZE, a row per FILE (no MPI)")
    args = ap.parse_args(argv)
    if args.at:
        print(at_size(args.at[0], args.at[1:]))
        return 0
    if args.table:
        print(table(args.table))
        return 0
    variants = tuple(args.variants.split(",")) if args.variants else VARIANTS
    huge = variants if args.variants else HUGE
    out = outdir(args.outdir)
    install_variants()
    comm = MPI.COMM_WORLD.Dup()
    info = link()
    from mpicoll.testing import nodes as node_layout
    nodes = node_layout(comm)
    rpn = len(nodes[0])
    say(f"# fabric bench: {comm.Get_size()} ranks, {len(nodes)} nodes x {rpn}; {info}")
    records = []
    if args.quick:
        records += band(comm, "8:64K", "8192", 3, 1, variants)
    else:
        if args.small:
            records += band(comm, args.small, "8", 20, 2, variants)
        records += band(comm, args.large, "4", 3, 1, variants)
        if args.huge:
            records += band(comm, args.huge, "4", 3, 1, huge)
    pre = bench.preamble(comm, bench.parse_args(["-a", "ring"]), nodes)    # collective
    if RANK == 0:
        cyclic = any(list(n) != list(range(n[0], n[0] + len(n))) for n in nodes)
        name = (f"fabric-bench-{info['fabric'] or 'plain'}-{len(nodes)}x{rpn}"
                f"{'-cyclic' if cyclic else ''}{'-' + args.tag if args.tag else ''}.json")
        write_json(out / name, {**pre, **info, "profile": profile(), "variants": list(variants),
                                "records": records})
    comm.Free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
