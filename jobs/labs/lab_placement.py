"""Lab 02 of seed 001 (the topology simulator): where each kind of parallelism may live.

    python jobs/labs/lab_placement.py [--max-nodes 3072] [--json FILE] [--png FILE]

The seed (001, chapters 1, 4, 6, 8 and "Lab 02"; 000 and 003 for the numbers): inside a node
GPUs talk over NVLink/NVSwitch at ~900 GB/s, between nodes over InfiniBand at ~50 GB/s per NIC.
Tensor parallelism all-reduces a layer's activations inside every layer, on the critical path,
so it must stay inside the NVLink island: spread over nodes each TP all-reduce gets slower by
the NVLink/IB bandwidth ratio (~18-20x in the seed's words). A hierarchical all-reduce (reduce
inside the node, all-reduce across nodes, broadcast back) matches that hierarchy and beats the
flat ring across nodes; a flat ring over 25,000 GPUs pays 50,000 serial hops. A pipeline of p
stages and m micro-batches idles (p-1)/(m+p-1) of the time (the 4-stage, 8-micro-batch
timeline: 3/11). And placement sets a failure's blast radius: one dead rank stalls its whole TP
group, and good placement keeps the stalled group small.

Here, in four parts:

1. TP all-reduce of one activation: 2048 tokens x 2048 hidden x 4 B = 16 MiB (seed 003's
   residual-stream activation), mpicoll's ring all-reduce over 8 GPUs on the timed executor's
   ``dgx-h100-textbook`` fabric (NVLink 450 GB/s per direction, one 50 GB/s NDR NIC per GPU): one node of
   8, against 2 x 4, 4 x 2 and 8 x 1; the time ratio beside the link bandwidth ratio, and a
   sweep over sizes.
2. mpicoll's hierarchical all-reduce (ring inside nodes, recursive doubling across) against the
   flat rank-order ring, 1 to 3,072 nodes of 8, on the same fabric (the simulator's all-ranks
   form: about a second per call at 24,576 ranks); the win, the steps on the critical path, and
   where the ring turns latency-bound.
3. The pipeline bubble: the formula over a table of p and m, and a schedule count: a tiny
   event simulation of the 1F1B (and GPipe) schedule with backward = 2 x forward.
4. Blast radius: a job of 3,072 nodes x 8 = TP 8 x PP 4 x DP 768, under two rank-to-group
   mappings (TP inside a node, TP across 8 nodes); for one dead GPU and one dead node, the TP
   groups and DP replicas it takes out, counted on the mapping, and the GPU-seconds lost under
   a stated recovery model.
"""

from __future__ import annotations

import numpy as np
from lab_common import claim, parser, save_figure, write_json

from mpicoll.simulators import fabric, timed

FABRIC = "dgx-h100-textbook"
PER_NODE = 8
ACTIVATION = 2048 * 2048 * 4           # seed 003: a 2048 x 2048 fp32 residual-stream activation
TP_PLACEMENTS = [(1, 8), (2, 4), (4, 2), (8, 1)]          # (nodes, GPUs per node) of a TP group
TP_SIZES = [1 << k for k in range(12, 31, 2)]             # 4 KiB .. 1 GiB
NODE_COUNTS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 3072]
# All-reduce sizes that split into equal ring blocks at every node count (multiples of
# 3 x 2^14 float32): unequal blocks at 24,576 ranks take minutes (docs/simulator.md, Speed).
HIER_SIZES = [196_608, 12 << 20, 768 << 20]
HIERARCHICAL = "hierarchical"

# Part 4's job and recovery model (see blast_radius)
JOB = {"nodes": 3072, "tp": 8, "pp": 4}
DETECT_S = 60.0        # the collective timeout that turns the hang into an error
REFORM_S = 30.0        # the surviving replicas re-form their DP communicator
RESTORE_S = 900.0      # a replaced node restarts and reloads state (the seed's R)
CHECKPOINT_S = 29.0 * 60   # the checkpoint interval (lab_checkpoint's T*): T/2 lost on average


# ----------------------------------------------------------------------------- part 1: TP

def tp_time(nodes: int, per_node: int, nbytes: int) -> timed.Timing:
    return timed.simulate("allreduce", "ring", fabric.preset(FABRIC, nodes, per_node), nbytes)


def tp_part() -> dict:
    f = fabric.preset(FABRIC, 1, PER_NODE)
    bw_ratio = f.intra.bandwidth / f.nic.bandwidth
    print(f"# part 1: TP all-reduce, ring over 8 GPUs; fabric {f.describe()}")
    print(f"# activation {ACTIVATION} B = 2048 tokens x 2048 hidden x 4 B (seed 003's residual "
          "stream)")
    rows = []
    for nodes, per in TP_PLACEMENTS:
        r = tp_time(nodes, per, ACTIVATION)
        rows.append({"nodes": nodes, "per_node": per, "time_s": r.time,
                     "busbw_GBps": r.busbw / 1e9, "critical": r.critical,
                     "internode_hops": r.internode_hops})
        c = r.critical
        print(f"  TP over {nodes} node(s) x {per}: {r.time * 1e6:8.1f} us  busbw "
              f"{r.busbw / 1e9:6.1f} GB/s  (latency {c['latency'] * 1e6:.1f} us, transfer "
              f"{c['transfer'] * 1e6:.1f} us, reduction {c['reduction'] * 1e6:.1f} us; "
              f"{r.internode_hops} inter-node hops)")
    inside, spread = rows[0], rows[-1]
    ratio = spread["time_s"] / inside["time_s"]
    transfer_ratio = spread["critical"]["transfer"] / inside["critical"]["transfer"]
    two = rows[1]["time_s"] / inside["time_s"]
    print(f"spread over 8 nodes / inside one node: {ratio:.1f}x the time, {transfer_ratio:.1f}x "
          f"the transfer term; NVLink/IB bandwidth ratio {f.intra.bandwidth / 1e9:.0f}/"
          f"{f.nic.bandwidth / 1e9:.0f} = {bw_ratio:.0f}x per direction "
          f"[seed: ~900 vs ~50 GB/s, '~20x slower']")
    print(f"spread over just 2 nodes (4 + 4): {two:.1f}x: a ring is as slow as its slowest hop")
    sweep = []
    print("#       bytes   1 node x 8 (us)   8 nodes x 1 (us)   ratio   transfer-term ratio")
    for size in TP_SIZES:
        a, b = tp_time(1, PER_NODE, size), tp_time(PER_NODE, 1, size)
        xfer = b.critical["transfer"] / a.critical["transfer"]
        sweep.append({"bytes": size, "inside_s": a.time, "spread_s": b.time,
                      "ratio": b.time / a.time, "transfer_ratio": xfer})
        print(f"# {size:>11} {a.time * 1e6:>17.1f} {b.time * 1e6:>18.1f} "
              f"{b.time / a.time:>7.2f} {xfer:>21.2f}")
    print(f"# small sizes: the ratio of the alphas, {f.nic.alpha * 1e6:g} us / "
          f"{f.intra.alpha * 1e6:g} us; large: the transfer terms' {bw_ratio:.0f}x, diluted by "
          f"the reduction (gamma x bytes, the same on both)")
    return {"activation_bytes": ACTIVATION, "placements": rows, "ratio": ratio,
            "transfer_ratio": transfer_ratio, "two_nodes_ratio": two, "bw_ratio": bw_ratio,
            "nvlink_GBps": f.intra.bandwidth / 1e9, "nic_GBps": f.nic.bandwidth / 1e9,
            "sweep": sweep}


# ----------------------------------------------------------------------------- part 2: hierarchical

def hierarchical_part(max_nodes: int) -> dict:
    counts = [k for k in NODE_COUNTS if k <= max_nodes]
    f = fabric.preset(FABRIC, 1, PER_NODE)
    alpha, bw = f.spine.alpha, f.nic.bandwidth
    print(f"# part 2: {HIERARCHICAL} (ring inside, recursive doubling across) vs the flat "
          f"rank-order ring, {counts[0]} .. {counts[-1]} nodes x {PER_NODE}, {FABRIC}")
    print("#       bytes  nodes   ranks   ring (us)  steps   hier. (us)  steps   ring/hier.")
    rows = []
    for nbytes in HIER_SIZES:
        for k in counts:
            fab = fabric.preset(FABRIC, k, PER_NODE)
            ring = timed.simulate("allreduce", "ring", fab, nbytes)
            hier = timed.simulate("allreduce", HIERARCHICAL, fab, nbytes)
            rows.append({"bytes": nbytes, "nodes": k, "ranks": k * PER_NODE,
                         "ring_s": ring.time, "hier_s": hier.time,
                         "ring_steps": int(ring.critical["messages"]),
                         "hier_steps": int(hier.critical["messages"]),
                         "ring_latency_s": ring.critical["latency"],
                         "ring_transfer_s": ring.critical["transfer"],
                         "win": ring.time / hier.time})
            r = rows[-1]
            print(f"# {nbytes:>11} {k:>6} {k * PER_NODE:>7} {ring.time * 1e6:>11.0f} "
                  f"{r['ring_steps']:>6} {hier.time * 1e6:>12.0f} {r['hier_steps']:>6} "
                  f"{r['win']:>10.1f}x", flush=True)
    summary = []
    for nbytes in HIER_SIZES:
        mine = [r for r in rows if r["bytes"] == nbytes]
        multi = [r for r in mine if r["nodes"] > 1]
        wins_from = next((r["nodes"] for r in mine if r["win"] > 1.0 + 1e-9), None)
        latency_bound = next((r["nodes"] for r in mine
                              if r["ring_latency_s"] > r["ring_transfer_s"]), None)
        low = min(multi, key=lambda r: r["win"]) if multi else None
        summary.append({"bytes": nbytes, "wins_from_nodes": wins_from,
                        "ring_latency_bound_from_nodes": latency_bound,
                        "model_ranks": nbytes / (alpha * bw),
                        "min_win": low and low["win"], "min_win_nodes": low and low["nodes"],
                        "top": mine[-1]})
        top = mine[-1]
        if low is None:
            print(f"{nbytes} B: one node only")
            continue
        bound = (f"latency-bound (latency term > transfer term) from {latency_bound} node(s)"
                 if latency_bound else f"bandwidth-bound up to {top['nodes']} nodes")
        print(f"{nbytes} B: equal at 1 node, {HIERARCHICAL} wins from {wins_from} nodes; least "
              f"win {low['win']:.1f}x at {low['nodes']} nodes; at {top['nodes']} nodes "
              f"{top['win']:.1f}x ({top['ring_steps']} vs {top['hier_steps']} steps on the "
              f"critical path); the ring is {bound}, its terms meeting near "
              f"N = D/(alpha.B) = {nbytes / (alpha * bw):,.0f} ranks")
    return {"rows": rows, "summary": summary, "node_counts": counts}


# ----------------------------------------------------------------------------- part 3: bubble

def bubble(p: int, m: int) -> float:
    """The seed's idle fraction of a p-stage pipeline with m micro-batches."""
    return (p - 1) / (m + p - 1)


def stage_order(schedule: str, p: int, m: int, s: int) -> list[tuple[str, int]]:
    """The (F|B, micro-batch) operations of stage s, in the order it runs them."""
    if schedule == "gpipe":
        return [("F", j) for j in range(m)] + [("B", j) for j in range(m)]
    warm = min(p - 1 - s, m)                 # 1F1B: warm up, one forward one backward, drain
    ops = [("F", j) for j in range(warm)]
    for j in range(m - warm):
        ops += [("F", warm + j), ("B", j)]
    return ops + [("B", j) for j in range(m - warm, m)]


def pipeline(schedule: str, p: int, m: int, tf: float = 1.0, tb: float = 2.0) -> dict:
    """Run a pipeline schedule: each stage runs its operations in order, an operation starts
    when its stage is free and its input has arrived (F(s, j) after F(s-1, j); B(s, j) after
    B(s+1, j), or after F(p-1, j) on the last stage). Returns the span and each operation's
    (start, end) per stage."""
    orders = [stage_order(schedule, p, m, s) for s in range(p)]
    done: dict = {}
    timeline = [[] for _ in range(p)]
    nxt, free = [0] * p, [0.0] * p
    while any(nxt[s] < len(orders[s]) for s in range(p)):
        moved = False
        for s in range(p):
            while nxt[s] < len(orders[s]):
                kind, j = orders[s][nxt[s]]
                dep = (("F", s - 1, j) if s > 0 else None) if kind == "F" else \
                    ("B", s + 1, j) if s < p - 1 else ("F", s, j)
                if dep is not None and dep not in done:
                    break
                start = max(free[s], done[dep] if dep is not None else 0.0)
                free[s] = done[(kind, s, j)] = start + (tf if kind == "F" else tb)
                timeline[s].append((kind, j, start, free[s]))
                nxt[s] += 1
                moved = True
        if not moved:
            raise RuntimeError(f"{schedule} schedule deadlocks at p={p}, m={m}")
    span = max(free)
    busy = m * (tf + tb)
    return {"span": span, "bubble": 1 - busy / span, "timeline": timeline}


def bubble_part() -> dict:
    ps, ms = [2, 4, 8, 16], [1, 4, 8, 16, 32, 64]
    print("# part 3: pipeline bubble (p-1)/(m+p-1); schedule count: 1F1B and GPipe, "
          "backward = 2 x forward")
    print("#   p \\ m " + "".join(f"{m:>15}" for m in ms))
    table, worst = [], 0.0
    for p in ps:
        cells = []
        for m in ms:
            f = bubble(p, m)
            one = pipeline("1f1b", p, m)["bubble"]
            gp = pipeline("gpipe", p, m)["bubble"]
            worst = max(worst, abs(one - f), abs(gp - f))
            table.append({"p": p, "m": m, "formula": f, "one_f_one_b": one, "gpipe": gp})
            cells.append(f"{f:6.1%} ({one:5.1%})")
        print(f"# {p:>5}   " + "".join(f"{c:>15}" for c in cells))
    print("#   (formula; in brackets the 1F1B schedule count; GPipe counts the same)")
    seed = pipeline("1f1b", 4, 8)
    print(f"4 stages x 8 micro-batches: formula 3/11 = {bubble(4, 8):.1%}; the 1F1B schedule "
          f"spans {seed['span']:.0f} units for 8 x 3 units of work per stage = "
          f"{seed['bubble']:.1%} idle [seed: (N_stages-1)/(M_micro+N_stages-1)]; largest "
          f"formula/count difference over the table {worst:.1e}")
    return {"table": table, "max_abs_difference": worst, "seed_case": {
        "p": 4, "m": 8, "formula": bubble(4, 8), "span_units": seed["span"],
        "count": seed["bubble"]}, "timeline": seed["timeline"]}


# ----------------------------------------------------------------------------- part 4: blast radius

def mapping(placement: str, nodes: int, tp: int, pp: int) -> np.ndarray:
    """(rank -> (dp, pp, tp) index) for ranks placed in blocks of PER_NODE per node.

    ``tp-inside``: Megatron's order, TP fastest: a node's 8 GPUs are one TP group, the PP
    stages of a replica on consecutive nodes. ``tp-across``: DP fastest: a TP group is one GPU
    on each of 8 nodes, and a node holds the same (pp, tp) position of 8 replicas.
    """
    n = nodes * PER_NODE
    dp = n // (tp * pp)
    r = np.arange(n)
    if placement == "tp-inside":
        t, s, d = r % tp, (r // tp) % pp, r // (tp * pp)
    elif placement == "tp-across":
        d8 = r % PER_NODE                  # which of 8 replicas, inside a node
        t, rest = (r // PER_NODE) % tp, r // (PER_NODE * tp)
        s, d = rest % pp, (rest // pp) * PER_NODE + d8
    else:
        raise ValueError(f"unknown placement {placement!r}")
    out = np.stack([d, s, t], axis=1)
    assert len({tuple(x) for x in out}) == n and out[:, 0].max() == dp - 1
    return out


def blast_radius(placement: str, failed: np.ndarray, *, nodes: int, tp: int, pp: int) -> dict:
    """What one failure takes out, counted on the mapping, and the GPU-seconds it costs.

    Model (synchronous training, one failure, these constants stated in the lab's output):
    the ranks in the same TP group as a dead rank cannot finish their layer, their pipeline
    neighbours then starve, so the dead rank's whole DP replica (TP x PP GPUs) stops; every
    other replica blocks in the next gradient all-reduce until the timeout fires (DETECT_S).

    * restart: the job restarts from its last checkpoint: every GPU loses DETECT_S + RESTORE_S
      + CHECKPOINT_S/2 (half an interval of work, on average). Placement does not matter.
    * elastic: the surviving replicas re-form DP without the hit ones (every GPU loses
      DETECT_S + REFORM_S); the hit replicas' GPUs stay out until the node is replaced and
      reloaded (RESTORE_S more).
    """
    m = mapping(placement, nodes, tp, pp)
    n = len(m)
    groups = {(int(d), int(s)) for d, s, _ in m[failed]}               # TP groups hit
    replicas = {int(d) for d, _, _ in m[failed]}
    group_ranks = np.isin(m[:, 0] * pp + m[:, 1], [d * pp + s for d, s in groups]).sum()
    replica_ranks = int(np.isin(m[:, 0], list(replicas)).sum())
    nodes_of_group = len({int(r) // PER_NODE for r in np.flatnonzero(
        (m[:, 0] == m[failed[0], 0]) & (m[:, 1] == m[failed[0], 1]))})
    restart = n * (DETECT_S + RESTORE_S + CHECKPOINT_S / 2)
    elastic = n * (DETECT_S + REFORM_S) + replica_ranks * RESTORE_S
    return {"placement": placement, "failed_ranks": len(failed), "tp_groups_hit": len(groups),
            "stalled_tp_ranks": int(group_ranks), "replicas_hit": len(replicas),
            "stalled_replica_ranks": replica_ranks, "nodes_per_tp_group": nodes_of_group,
            "restart_gpu_s": restart, "elastic_gpu_s": elastic,
            "elastic_out_gpu_s": replica_ranks * RESTORE_S}


def blast_part() -> dict:
    nodes, tp, pp = JOB["nodes"], JOB["tp"], JOB["pp"]
    n = nodes * PER_NODE
    print(f"# part 4: blast radius; job {nodes} nodes x {PER_NODE} = {n} GPUs = TP {tp} x PP "
          f"{pp} x DP {n // (tp * pp)}")
    print(f"# model: the dead rank's TP group stops, then its pipeline, i.e. its DP replica; the"
          f" other replicas block in the next all-reduce until the timeout ({DETECT_S:.0f} s). "
          f"restart: every GPU loses timeout + restore ({RESTORE_S:.0f} s) + half a checkpoint "
          f"interval ({CHECKPOINT_S / 60:.0f} min / 2). elastic: every GPU loses timeout + "
          f"re-forming DP ({REFORM_S:.0f} s); the hit replicas stay out for the restore too")
    rows = []
    print("# failure      placement   TP group spans   TP groups hit (GPUs)   replicas hit "
          "(GPUs)   restart GPU-h   elastic GPU-h (hit replicas' share)")
    rng = np.random.default_rng(1)
    one_gpu = np.array([int(rng.integers(n))])
    node = int(rng.integers(nodes))
    one_node = np.arange(node * PER_NODE, (node + 1) * PER_NODE)
    for label, failed in (("one GPU", one_gpu), ("one node", one_node)):
        for placement in ("tp-inside", "tp-across"):
            b = blast_radius(placement, failed, nodes=nodes, tp=tp, pp=pp)
            b["failure"] = label
            rows.append(b)
            print(f"# {label:<9} {placement:>12} {b['nodes_per_tp_group']:>8} node(s) "
                  f"{b['tp_groups_hit']:>10} ({b['stalled_tp_ranks']:>4}) "
                  f"{b['replicas_hit']:>14} ({b['stalled_replica_ranks']:>4}) "
                  f"{b['restart_gpu_s'] / 3600:>14,.0f} {b['elastic_gpu_s'] / 3600:>12,.0f} "
                  f"({b['elastic_out_gpu_s'] / 3600:,.0f})")
    # every node in turn, for the claim that the ratio does not depend on which node fails
    every = {}
    for placement in ("tp-inside", "tp-across"):
        hit = {blast_radius(placement, np.arange(k * PER_NODE, (k + 1) * PER_NODE), nodes=nodes,
                            tp=tp, pp=pp)["replicas_hit"] for k in range(0, nodes, 97)}
        every[placement] = sorted(hit)
    inside = next(r for r in rows if r["failure"] == "one node" and r["placement"] == "tp-inside")
    across = next(r for r in rows if r["failure"] == "one node" and r["placement"] == "tp-across")
    print(f"one dead node: TP inside a node takes out {inside['replicas_hit']} replica "
          f"({inside['stalled_replica_ranks']} GPUs), TP across nodes {across['replicas_hit']} "
          f"replicas ({across['stalled_replica_ranks']} GPUs): "
          f"{across['stalled_replica_ranks'] // inside['stalled_replica_ranks']}x the blast "
          f"radius (replicas hit over every 97th node: {every}); a whole-job restart costs "
          f"{inside['restart_gpu_s'] / 3600:,.0f} GPU-hours whatever the placement "
          "[seed: a failure in a TP group stalls that whole group; placement sets the blast "
          "radius]")
    return {"job": dict(JOB, per_node=PER_NODE, gpus=n), "model": {
        "detect_s": DETECT_S, "reform_s": REFORM_S, "restore_s": RESTORE_S,
        "checkpoint_s": CHECKPOINT_S}, "rows": rows, "replicas_hit_by_node": every}


# ----------------------------------------------------------------------------- main

def main(argv=None) -> int:
    ap = parser(__doc__, png="four panels: TP ratio, hierarchical vs ring, 1F1B timeline, "
                "blast radius")
    ap.add_argument("--max-nodes", type=int, default=NODE_COUNTS[-1],
                    help="largest node count of part 2 (default 3072)")
    args = ap.parse_args(argv)
    tp = tp_part()
    hier = hierarchical_part(args.max_nodes)
    bub = bubble_part()
    blast = blast_part()
    write_json(args.json, {"fabric": FABRIC, "tp": tp, "hierarchical": hier,
                           "bubble": {k: v for k, v in bub.items() if k != "timeline"},
                           "blast": blast})

    def draw(plt):
        fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
        ax = axes[0, 0]
        ax.plot([s["bytes"] for s in tp["sweep"]], [s["ratio"] for s in tp["sweep"]], "o-",
                label="8 nodes x 1 / 1 node x 8: time (simulated)")
        ax.plot([s["bytes"] for s in tp["sweep"]], [s["transfer_ratio"] for s in tp["sweep"]],
                "s--", ms=3, label="... transfer term only")
        ax.axhline(tp["bw_ratio"], color="gray", ls=":",
                   label=f"NVLink/NIC bandwidth ratio {tp['bw_ratio']:.0f}")
        ax.axvline(ACTIVATION, color="red", ls="-.", lw=1, label="16 MiB activation")
        ax.set_xscale("log")
        ax.set_xlabel("TP all-reduce size (bytes)")
        ax.set_ylabel("time across nodes / inside a node")
        ax.set_title("1. TP ring all-reduce over 8 GPUs, dgx-h100-textbook", fontsize=9)
        ax.legend(fontsize=7)
        ax = axes[0, 1]
        for nbytes, colour in zip(HIER_SIZES, ("tab:blue", "tab:orange", "tab:green")):
            rs = [r for r in hier["rows"] if r["bytes"] == nbytes]
            label = f"{nbytes / 2**20:g} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:g} KiB"
            ax.plot([r["nodes"] for r in rs], [r["ring_s"] * 1e6 for r in rs], "o--",
                    color=colour, ms=3, label=f"flat ring, {label}")
            ax.plot([r["nodes"] for r in rs], [r["hier_s"] * 1e6 for r in rs], "s-",
                    color=colour, ms=3, label=f"{HIERARCHICAL}, {label}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("nodes (8 GPUs each)")
        ax.set_ylabel("simulated all-reduce time (us)")
        ax.set_title(f"2. {HIERARCHICAL} vs flat ring, dgx-h100-textbook", fontsize=9)
        ax.legend(fontsize=6)
        ax = axes[1, 0]
        for s, ops in enumerate(bub["timeline"]):
            for kind, j, start, end in ops:
                ax.barh(s, end - start, left=start, color="tab:blue" if kind == "F" else
                        "tab:orange", edgecolor="white")
                ax.text((start + end) / 2, s, f"{kind}{j}", ha="center", va="center",
                        fontsize=6, color="white")
        ax.invert_yaxis()
        ax.set_yticks(range(4))
        ax.set_yticklabels([f"stage {s}" for s in range(4)])
        ax.set_xlabel("time (forward = 1, backward = 2)")
        c = bub["seed_case"]
        ax.set_title(f"3. 1F1B, 4 stages x 8 micro-batches: idle {c['count']:.1%} = 3/11",
                     fontsize=9)
        ax = axes[1, 1]
        labels = [f"{r['failure']}\n{r['placement']}" for r in blast["rows"]]
        ax.bar(labels, [r["stalled_replica_ranks"] for r in blast["rows"]], color=[
            "tab:green" if r["placement"] == "tp-inside" else "tab:red" for r in blast["rows"]])
        for i, r in enumerate(blast["rows"]):
            ax.text(i, r["stalled_replica_ranks"], f"{r['replicas_hit']} replica(s)",
                    ha="center", va="bottom", fontsize=8)
        ax.set_ylabel("GPUs out until the restore")
        ax.set_title("4. blast radius, TP 8 x PP 4 x DP 768 on 3,072 nodes", fontsize=9)
        return fig
    save_figure(args.png, draw)

    top = [s for s in hier["summary"] if s["bytes"] == HIER_SIZES[-1]][0]
    one_node = {r["placement"]: r for r in blast["rows"] if r["failure"] == "one node"}
    claim("lab_placement", "TP across nodes ~20x slower (NVLink ~900 vs IB ~50 GB/s); "
          "hierarchical beats flat; bubble (p-1)/(m+p-1) = 3/11 at 4x8; placement sets the "
          "blast radius",
          f"TP 16 MiB {tp['ratio']:.1f}x slower across 8 nodes (transfer {tp['transfer_ratio']:.1f}"
          f"x = 450/50 per direction); {HIERARCHICAL} wins from 2 nodes, "
          f"{top['top']['win']:.1f}x the ring at {top['top']['ranks']} ranks (768 MiB; "
          f"{top['top']['ring_steps']} vs {top['top']['hier_steps']} steps); bubble "
          f"{bub['seed_case']['count']:.1%} counted = 3/11; a dead node takes out "
          f"{one_node['tp-inside']['stalled_replica_ranks']} vs "
          f"{one_node['tp-across']['stalled_replica_ranks']} GPUs (simulated / counted)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
