"""Lab 2 of seed 000: the topology-aware ring on a rail-optimized fabric, from the simulator.

    python jobs/labs/lab_rails.py [--size 1G] [--json FILE] [--png FILE]

The seed: two nodes of 8 GPUs, GPU i's NIC on rail i (a top-of-rack switch per GPU index), a
same-rail hop at ~50 GB/s, a cross-rail hop through the spine at ~5 GB/s. The ring in rank order
0-1-...-7-8-...-15-0 leaves each node from GPU 7 or 15 (rail 7) and enters at GPU 8 or 0
(rail 0): 2 cross-rail hops, and the ring runs at ~5 GB/s. NCCL's ring 0-1-...-7-15-14-...-8-0
crosses between nodes at 7->15 and 8->0, both on one rail: 0 cross-rail hops, ~50 GB/s. The same
number of fabric crossings and 10x the bandwidth, which is what "topology-aware ring
construction" means.

Here mpicoll's ring all-reduce runs in both orders (``order="rank"`` and ``order="rail"``,
``mpicoll.topology.ring_order``) on the timed executor's ``seed-lab`` fabric (2 us per hop,
NVLink 450 GB/s inside a node, 50 GB/s per NIC on its rail, 5 GB/s through the spine). The
simulator counts the cross-rail hops, the slowest message rate and the completion time, over a
sweep of sizes: the ratio reaches the bandwidth ratio once the transfer term dominates.
"""

from __future__ import annotations

import math

from lab_common import claim, parser, save_figure, write_json

from mpicoll import topology
from mpicoll.simulators import fabric, timed

NODES, PER_NODE = 2, 8
SIZES = [1 << k for k in range(10, 31, 2)]          # 1 KiB .. 1 GiB


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units \
        else int(text)


def hops(ring: tuple, per_node: int) -> list[tuple[int, int, str]]:
    """Every hop of a ring as (src, dst, kind): intra-node, same-rail or cross-rail."""
    out = []
    for i, src in enumerate(ring):
        dst = ring[(i + 1) % len(ring)]
        if src // per_node == dst // per_node:
            kind = "intra-node"
        else:
            kind = "same-rail" if src % per_node == dst % per_node else "cross-rail"
        out.append((src, dst, kind))
    return out


def main(argv=None) -> int:
    ap = parser(__doc__, png="both rings, cross-rail hops marked")
    ap.add_argument("--size", default="1G", help="message size for the headline (default 1G)")
    args = ap.parse_args(argv)
    nbytes = parse_size(args.size)
    fab = fabric.preset("seed-lab", NODES, PER_NODE)
    print(f"# fabric: {fab.describe()}")
    rings, runs = {}, {}
    for order in ("rank", "rail"):
        ring = topology.ring_order(fab.node_layout(), order)
        rings[order] = ring
        r = timed.simulate("allreduce", "ring", fab, nbytes, order=order)
        runs[order] = r
        crossing = [f"{s}->{d}" for s, d, k in hops(ring, PER_NODE) if k == "cross-rail"]
        print(f"order={order}: ring {'-'.join(map(str, ring))}-{ring[0]}")
        print(f"   inter-node hops {r.internode_hops}, cross-rail hops {r.cross_rail_hops} "
              f"({', '.join(crossing) or 'none'}); slowest message {r.bottleneck_bw / 1e9:.1f} GB/s;"
              f" {nbytes} B all-reduce in {r.time * 1e3:.3f} ms (busbw {r.busbw / 1e9:.1f} GB/s;"
              f" critical path {r.critical_path()})")
    ratio = runs["rank"].time / runs["rail"].time
    bw_ratio = runs["rail"].bottleneck_bw / runs["rank"].bottleneck_bw
    print(f"rail-aligned vs rank order: {ratio:.1f}x faster, bottleneck {bw_ratio:.0f}x "
          "[seed: 2 vs 0 cross-rail hops, ~5 vs ~50 GB/s, 10x]")

    sweep = []
    print("#      bytes   rank order (us)   rail order (us)   ratio")
    for size in SIZES:
        a = timed.simulate("allreduce", "ring", fab, size, order="rank").time
        b = timed.simulate("allreduce", "ring", fab, size, order="rail").time
        sweep.append({"bytes": size, "rank_s": a, "rail_s": b, "ratio": a / b})
        print(f"# {size:>10} {a * 1e6:>17.1f} {b * 1e6:>17.1f} {a / b:>7.2f}")

    write_json(args.json, {
        "fabric": fab.describe(), "nbytes": nbytes,
        "orders": {o: {"ring": list(rings[o]), "internode_hops": runs[o].internode_hops,
                       "cross_rail_hops": runs[o].cross_rail_hops,
                       "bottleneck_GBps": runs[o].bottleneck_bw / 1e9,
                       "time_s": runs[o].time, "busbw_GBps": runs[o].busbw / 1e9}
                   for o in runs},
        "ratio": ratio, "sweep": sweep})

    def draw(plt):
        fig, axes = plt.subplots(1, 3, figsize=(13, 4.3),
                                 gridspec_kw={"width_ratios": [1, 1, 1.2]})
        n = NODES * PER_NODE
        pos = {r: (math.cos(2 * math.pi * (r if r < PER_NODE else 3 * PER_NODE - 1 - r) / n),
                   math.sin(2 * math.pi * (r if r < PER_NODE else 3 * PER_NODE - 1 - r) / n))
               for r in range(n)}      # node 0 on the upper half, node 1 below, rail i facing i
        colour = {"intra-node": "0.6", "same-rail": "tab:green", "cross-rail": "tab:red"}
        for ax, order in zip(axes, ("rank", "rail")):
            r = runs[order]
            for s, d, kind in hops(rings[order], PER_NODE):
                (x0, y0), (x1, y1) = pos[s], pos[d]
                ax.annotate("", (x1, y1), (x0, y0), arrowprops=dict(
                    arrowstyle="-|>", color=colour[kind], lw=2.5 if kind != "intra-node" else 1,
                    ls="--" if kind == "cross-rail" else "-", shrinkA=9, shrinkB=9))
                if kind == "cross-rail":
                    ax.text(0.7 * x0 + 0.3 * x1, 0.7 * y0 + 0.3 * y1 + 0.08,
                            f"{s}->{d} cross-rail", color="tab:red", ha="center", fontsize=8)
            for rank, (x, y) in pos.items():
                ax.scatter([x], [y], s=260, color="C0" if rank < PER_NODE else "C1", zorder=3)
                ax.text(x, y, str(rank), ha="center", va="center", color="white", fontsize=8,
                        zorder=4)
            ax.set_title(f"order={order}: {r.cross_rail_hops} cross-rail hops, "
                         f"{r.time * 1e3:.1f} ms", fontsize=9)
            ax.set_aspect("equal")
            ax.axis("off")
        fig.suptitle("2 nodes x 8 GPUs (blue: node 0, GPU i on rail i; orange: node 1, GPU 8+i "
                     "on rail i); green: same-rail hop, red dashed: through the spine",
                     fontsize=9)
        ax = axes[2]
        ax.plot([s["bytes"] for s in sweep], [s["ratio"] for s in sweep], "o-")
        ax.axhline(10, color="gray", ls=":", lw=1)
        ax.set_xscale("log")
        ax.set_xlabel("all-reduce size (bytes)")
        ax.set_ylabel("time rank order / rail order")
        ax.set_title("the gain appears once bandwidth dominates", fontsize=9)
        return fig
    save_figure(args.png, draw)

    claim("lab_rails", "2 vs 0 cross-rail hops, ~5 vs ~50 GB/s, 10x",
          f"{runs['rank'].cross_rail_hops} vs {runs['rail'].cross_rail_hops} cross-rail hops, "
          f"{runs['rank'].bottleneck_bw / 1e9:.0f} vs {runs['rail'].bottleneck_bw / 1e9:.0f} GB/s, "
          f"{ratio:.1f}x at {nbytes} B (simulated, seed-lab fabric)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
