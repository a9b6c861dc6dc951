"""The timed executor's validation tables and the node-scaling figure of docs/simulator.md.

    python jobs/sim_validation.py measured       # 4b: this-machine vs docs/results bench JSON
    python jobs/sim_validation.py nccl           # 4c: dgx-h100 vs NCCL's tuning model
    python jobs/sim_validation.py nodes -o docs/simulator-nodes.png   # hierarchical vs ring

Not MPI: the simulator runs on one core. Prints markdown tables.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from mpicoll.executors import fabric, timed

ROOT = Path(__file__).resolve().parents[1]


def measured(args) -> None:
    """4b: the timed executor on this-machine beside the measured bench medians."""
    for path in args.results:
        bench = json.loads(Path(path).read_text())
        n = bench["nranks"]
        fab = fabric.preset("this-machine", 1, n, profile=args.profile)
        print(f"\n`{Path(path).name}` ({n} ranks, one node; simulated / measured)\n")
        names = [a for a in dict.fromkeys(r["algorithm"] for r in bench["records"])
                 if a not in ("mpi", "auto")]
        print("| size (B) | " + " | ".join(names) + " |")
        print("|---:|" + "---:|" * len(names))
        for size in sorted({r["size"] for r in bench["records"]}):
            cells = []
            for name in names:
                rec = next(r for r in bench["records"] if r["algorithm"] == name
                           and r["size"] == size and not r["inplace"])
                sim = timed.simulate("allreduce", name, fab, size).time * 1e6
                cells.append(f"{sim:.1f} / {rec['time_us']:.1f} = {sim / rec['time_us']:.2f}")
            print(f"| {size} | " + " | ".join(cells) + " |")


def nccl_model(nodes: int, ppn: int, nbytes: float) -> tuple[float, float]:
    """NCCL 2.30's tuning model (src/graph/tuning.cc), Simple protocol, in seconds: (ring, tree).

    Latencies in us: base 8.4; ring per hop NVLink 3.4, network 14; tree NVLink 4.0, network 14.
    Bandwidth: the ring's busbw is the NIC's 50 GB/s across nodes (NCCL's 18 x 20.6 GB/s
    NVLink on one node), algbw = busbw . p / (2(p-1)); the tree's busbw min(0.92 x that, 16
    channels x 38.7 / 41.4 / 36.0 for 1 / 2 / more nodes), algbw = busbw / 2. Multi-node ring latency x 1.4 (the plateau
    factor) with 16 channels. The tree's size-indexed correction table is left out.
    """
    p = nodes * ppn
    nsteps, ninter = 2 * (p - 1), 2 * (nodes - 1)
    lat = 8.4 + (nsteps - ninter) * 3.4 + ninter * 14.0
    if nodes > 1 and nbytes / (16 * p) >= 64:
        lat *= 1.4
    bus = 50.0 if nodes > 1 else 370.8
    ring = lat * 1e-6 + nbytes / (bus * 1e9 * p / nsteps)
    tlat = 8.4 + 2 * ((ppn - 1) * 4.0 + math.floor(math.log2(nodes)) * 14.0)
    per_channel = 38.7 if nodes == 1 else 41.4 if nodes == 2 else 36.0
    tree = tlat * 1e-6 + nbytes / (min(0.92 * bus, 16 * per_channel) * 0.5 * 1e9)
    return ring, tree


def nccl(args) -> None:
    """4c: our ring, double binary tree and hierarchical on dgx-h100 beside NCCL's model."""
    print("| nodes | ranks | size (B) | NCCL ring | our ring | NCCL tree | our double_binary_tree "
          "| our hierarchical |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for nodes in args.nodes:
        fab = fabric.preset("dgx-h100", nodes, 8)
        for nbytes in args.sizes:
            ring_m, tree_m = nccl_model(nodes, 8, nbytes)
            ring = timed.simulate("allreduce", "ring", fab, nbytes).time
            hier = timed.simulate("allreduce", "smp", fab, nbytes).time
            tree = (f"{timed.simulate('allreduce', 'double_binary_tree', fab, nbytes).time * 1e6:.0f}"
                    if nodes <= args.tree_max else "-")
            print(f"| {nodes} | {nodes * 8} | {nbytes:.0e} | {ring_m * 1e6:.0f} | {ring * 1e6:.0f} "
                  f"| {tree_m * 1e6:.0f} | {tree} | {hier * 1e6:.0f} |", flush=True)


def nodes(args) -> None:
    """Hierarchical vs the rank-order ring on dgx-h100, 2 to 3,072 nodes of 8: a figure.

    The sizes divide into equal ring blocks at every node count (multiples of 3 x 2^14
    elements): uneven blocks at 16,384 ranks and more take minutes (docs/simulator.md).
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 3072]
    fig, ax = plt.subplots(figsize=(8, 5))
    rows = []
    for nbytes, color in zip(args.sizes, ("tab:blue", "tab:orange", "tab:green")):
        ring, hier = [], []
        for k in counts:
            fab = fabric.preset("dgx-h100", k, 8)
            ring.append(timed.simulate("allreduce", "ring", fab, nbytes).time * 1e6)
            hier.append(timed.simulate("allreduce", "smp", fab, nbytes).time * 1e6)
            rows.append((nbytes, k, ring[-1], hier[-1]))
            print(f"| {nbytes} | {k} | {k * 8} | {ring[-1]:.0f} | {hier[-1]:.0f} | "
                  f"{ring[-1] / hier[-1]:.1f} |", flush=True)
        label = f"{nbytes / 2**20:g} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:g} KiB"
        ax.plot(counts, ring, "o--", color=color, label=f"ring (rank order), {label}")
        ax.plot(counts, hier, "s-", color=color, label=f"hierarchical, {label}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("nodes (8 H100 each)")
    ax.set_ylabel("simulated all-reduce time (us)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("timed executor, dgx-h100 fabric: hierarchical (ring inside, recursive "
                 "doubling across) vs flat ring", fontsize=9)
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print(f"wrote {args.output}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    m = sub.add_parser("measured")
    m.add_argument("results", nargs="*", default=[str(ROOT / "docs/results/allreduce-np2.json"),
                                                   str(ROOT / "docs/results/allreduce-np4.json")])
    m.add_argument("--profile", default=None, help="default: the shipped profile")
    c = sub.add_parser("nccl")
    c.add_argument("--nodes", type=int, nargs="*", default=[1, 5, 25, 125, 625, 3125])
    c.add_argument("--sizes", type=lambda s: int(float(s)), nargs="*",
                   default=[100_000, 8_000_000, 1_000_000_000])
    c.add_argument("--tree-max", type=int, default=25,
                   help="largest node count for double_binary_tree (no all-ranks form: slow)")
    n = sub.add_parser("nodes")
    n.add_argument("--sizes", type=int, nargs="*", default=[192 << 10, 12 << 20, 768 << 20])
    n.add_argument("-o", "--output", default=str(ROOT / "docs/simulator-nodes.png"))
    args = ap.parse_args()
    {"measured": measured, "nccl": nccl, "nodes": nodes}[args.what](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
