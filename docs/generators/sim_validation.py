"""The timed executor's validation tables and the node-scaling figure of docs/simulator.md.

    python docs/generators/sim_validation.py published --json docs/simulator-validation.json  # the table
    python docs/generators/sim_validation.py measured       # 4b: this-machine vs docs/results bench JSON
    python docs/generators/sim_validation.py nccl           # 4c: dgx-h100-textbook vs NCCL's tuning model
    python docs/generators/sim_validation.py nodes -o docs/simulator-nodes.png   # hierarchical vs ring
    python docs/generators/sim_validation.py pipeline --json docs/simulator-pipeline.json  # k chunks
    python docs/generators/sim_validation.py workload --json docs/simulator-workload.json  # a step

``published`` is the validation table of docs/simulator.md (issue 24): every row a published
measurement or NCCL's own tuning model, our prediction on the ``dgx-h100-nccl`` /
``dgx-a100-nccl`` fabrics (parameters from data sheets and NCCL's source, none fitted to a row)
and the ratio; ``--json`` keeps the rows, ``render`` prints the table from them (what
tests/unit/test_sim_validation.py compares with the doc). ``measured --json`` likewise.

Not MPI: the simulator runs on one core. Prints markdown tables.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from mpicoll.simulators import fabric, timed

ROOT = Path(__file__).resolve().parents[2]


def measured_tables(results, profile=None) -> list[dict]:
    """4b's rows: per bench file, per size, per algorithm with a schedule: simulated and
    measured us. Algorithms without a schedule (``shm``, ``mpi``, ``auto``) are skipped and
    listed in ``skipped``."""
    from mpicoll.registry import lookup
    out = []
    for path in results:
        bench = json.loads(Path(path).read_text())
        n = bench["nranks"]
        fab = fabric.preset("this-machine", 1, n, profile=profile)
        names, skipped = [], []
        for a in dict.fromkeys(r["algorithm"] for r in bench["records"]):
            try:
                ok = lookup("allreduce", a).scheduled
            except ValueError:
                ok = False
            (names if ok else skipped).append(a)
        rows = []
        for size in sorted({r["size"] for r in bench["records"]}):
            cells = {}
            for name in names:
                rec = next((r for r in bench["records"] if r["algorithm"] == name
                            and r["size"] == size and not r["inplace"]), None)
                if rec is None:
                    continue
                sim = timed.simulate("allreduce", name, fab, size).time * 1e6
                cells[name] = [round(sim, 1), round(rec["time_us"], 1)]
            rows.append({"size": size, "cells": cells})
        out.append({"file": Path(path).name, "nranks": n, "algorithms": names,
                    "skipped": skipped, "rows": rows})
    return out


def render_measured(tables) -> str:
    lines = []
    for t in tables:
        lines += ["", f"`{t['file']}` ({t['nranks']} ranks, one node; simulated / measured us; "
                      f"no schedule to simulate, skipped: {', '.join(t['skipped']) or 'none'})",
                  "", "| size (B) | " + " | ".join(t["algorithms"]) + " |",
                  "|---:|" + "---:|" * len(t["algorithms"])]
        for row in t["rows"]:
            cells = []
            for name in t["algorithms"]:
                if name not in row["cells"]:
                    cells.append("-")
                    continue
                sim, meas = row["cells"][name]
                cells.append(f"{sim:.1f} / {meas:.1f} = {sim / meas:.2f}")
            lines.append(f"| {row['size']} | " + " | ".join(cells) + " |")
    return "\n".join(lines).strip("\n")


def measured(args) -> None:
    """4b: the timed executor on this-machine beside the measured bench medians."""
    tables = measured_tables(args.results, args.profile)
    print(render_measured(tables))
    if args.json:
        Path(args.json).write_text(json.dumps(tables, indent=1) + "\n")


# ----------------------------------------------------------------------------- published

SOURCES = {
    "212": "nccl-tests #212 (sjeaugey: NVLink line rate 450 GB/s, ~370 GB/s busbw with the "
           "protocol overhead, for ring all-reduce and for the other collectives)",
    "212nvls": "nccl-tests #212 (sjeaugey: all-reduce on 8 H100 uses NVLink SHARP by default, "
               "peak busBw ~480 GB/s, algbw ~275 GB/s, at large sizes)",
    "a100": "nccl #812 / nccl-tests #290: DGX-A100, 8 HDR NICs per node, all-reduce busbw "
            "~192 GB/s across nodes (8 x 24 GB/s)",
    "h100": "nccl-tests #290 / #212: DGX-H100, 8 NDR NICs per node, 46-48 GB/s per NIC x 8, "
            "~370 GB/s",
    "model": "NCCL 2.30 src/graph/tuning.cc: tree LL (NCCL's pick at 8 KiB), latency "
             "6.8 + 2((8-1) x 0.6 + lg(nodes) x 5.0) us + bytes / bandwidth",
    "2409": "nccl #2409 (2 x 8 H100, 8 x 400 Gb/s per node: '~470 GB/s busbw for AllReduce' "
            "expected, citing nccl-tests #309's results; a second-hand figure, size not given)",
    "283": "nccl-tests #283 (248 nodes x 8 H200, 8 IB NICs each, NCCL's default algorithm, "
           "512 MiB: busbw 'typically around 350G', at times below 300)",
    "1221": "nccl #1221 (8 H100 + 8 x 400 Gb RoCE per node, NCCL 2.19.3, all_reduce_perf -b 4G "
            "-e 8G: 1 or 2 nodes 430 GB/s busbw with NVLS, 330 with NCCL_NVLS_ENABLE=0; "
            "4 nodes 320 either way)",
    "tuning": "NCCL src/graph/tuning.cc (NVIDIA/nccl 5067397c), its whole all-reduce model with "
              "the adjustments: mpicoll/simulators/nccl_tuning.py, each constant cited to its "
              "line; crossover: the smallest power of two from 1 MiB at which the ring (its best "
              "protocol) is at least as fast as the tree",
}


def nccl_tree_ll(nodes: int, ppn: int, nbytes: float) -> float:
    """NCCL 2.30's tuning model for the tree LL all-reduce, seconds (shared/notes/sim-anchors.md
    section 3): latency 6.8 + 2((ppn-1) 0.6 + floor(lg nodes) 5.0) us; bandwidth 16 channels x
    24 GB/s (two channels per 48 GB/s NIC), x0.92, capped at 16 x 36.0 (Hopper, > 2 nodes),
    /3.8 for LL, algbw = busbw / 2 (its size-indexed correction table left out: < 1 % here)."""
    lat = 6.8 + 2 * ((ppn - 1) * 0.6 + math.floor(math.log2(nodes)) * 5.0)
    bus = min(0.92 * 16 * 24.0, 16 * 36.0) / 3.8
    return lat * 1e-6 + nbytes / (bus * 0.5 * 1e9)


# (label, collective, algorithm, preset, nodes, bytes, metric, anchor, tolerance, source)
PUBLISHED = [
    ("1 x 8 H100, ring all-reduce, 1 GiB", "allreduce", "ring", "dgx-h100-nccl", 1, 1 << 30,
     "busbw", 370e9, 0.20, "212"),
    ("1 x 8 H100, ring all-reduce, 8 GiB", "allreduce", "ring", "dgx-h100-nccl", 1, 8 << 30,
     "busbw", 370e9, 0.20, "212"),
    ("1 x 8 H100, NVLS all-reduce (NVLink SHARP), 8 GiB", "allreduce", "nvls", "dgx-h100", 1,
     8 << 30, "busbw", 480e9, 0.20, "212nvls"),
    ("1 x 8 H100, all-gather, 1 GiB", "allgather", "ring", "dgx-h100-nccl", 1, 1 << 30,
     "busbw", 370e9, 0.20, "212"),
    ("1 x 8 H100, reduce-scatter, 1 GiB", "reduce_scatter_block", "ring", "dgx-h100-nccl", 1,
     1 << 30, "busbw", 370e9, 0.20, "212"),
    ("4 x DGX-A100, ring all-reduce, 4 GiB", "allreduce", "ring", "dgx-a100-nccl", 4, 4 << 30,
     "busbw", 192e9, 0.20, "a100"),
    ("16 x DGX-A100, ring all-reduce, 4 GiB", "allreduce", "ring", "dgx-a100-nccl", 16, 4 << 30,
     "busbw", 192e9, 0.20, "a100"),
    ("4 x DGX-H100, ring all-reduce, 4 GiB", "allreduce", "ring", "dgx-h100-nccl", 4, 4 << 30,
     "busbw", 370e9, 0.20, "h100"),
    ("16 x DGX-H100, ring all-reduce, 4 GiB", "allreduce", "ring", "dgx-h100-nccl", 16, 4 << 30,
     "busbw", 370e9, 0.20, "h100"),
] + [
    (f"{k} x DGX-H100, tree all-reduce, 8 KiB, one tree (--channels 1)", "allreduce",
     "double_binary_tree", "dgx-h100-nccl", k, 8192, "time", nccl_tree_ll(k, 8, 8192), 0.30,
     "model")
    for k in (16, 128, 1024)
]


def nccl_ring_ll(nodes: int, nbytes: float) -> float:
    """NCCL's model of its ring LL all-reduce on DGX-H100 nodes, seconds (``nccl_tuning``)."""
    from mpicoll.simulators import nccl_tuning
    g = nccl_tuning.graph_of(fabric.preset("dgx-h100-nccl", nodes, 8))
    return nccl_tuning.time(g, "ring", "LL", nbytes)


CROSSOVER_SIZES = [1 << k for k in range(20, 35)]        # 1 MiB .. 16 GiB


def crossover(nodes: int, simulated: bool) -> int:
    """The smallest size (``CROSSOVER_SIZES``) at which the ring all-reduce is at least as fast
    as the tree on dgx-h100-nccl nodes: simulated, or in NCCL's tuning model (best protocol
    each); the last size + 1 if never."""
    from mpicoll.simulators import nccl_tuning
    fab = fabric.preset("dgx-h100-nccl", nodes, 8)
    g = nccl_tuning.graph_of(fab)
    for b in CROSSOVER_SIZES:
        if simulated:
            ring = timed.simulate("allreduce", "ring", fab, b).time
            tree = timed.simulate("allreduce", "double_binary_tree", fab, b).time
        else:
            ring, tree = (min(nccl_tuning.time(g, a, p, b) for p in nccl_tuning.PROTOCOLS)
                          for a in ("ring", "tree"))
        if ring <= tree:
            return b
    return CROSSOVER_SIZES[-1] + 1


PUBLISHED += [
    (f"{k} x DGX-H100, ring all-reduce, 8 KiB, LL (NCCL's model)", "allreduce", "ring",
     "dgx-h100-nccl", k, 8192, "time", nccl_ring_ll(k, 8192), 0.20, "tuning")
    for k in (2, 16)
] + [
    (f"{k} x DGX-H100, ring/tree crossover (NCCL's model)", "allreduce", "ring",
     "dgx-h100-nccl", k, None, "crossover", crossover(k, False), 1.0, "tuning")
    for k in (2, 16, 32)
]


# NCCL's own pick (``timed.nccl_choice``: ring, tree, NVLS, NVLSTree as NCCL's tuning picks),
# busbw at the published sizes; (..., source, changes to the preset) where the run changed it
PUBLISHED += [
    ("2 x 8 H100 NDR, NCCL's pick, 8 GiB", "allreduce", "nccl", "dgx-h100", 2, 8 << 30,
     "busbw", 470e9, 0.20, "2409"),
    ("248 x 8 H200 InfiniBand, NCCL's pick, 512 MiB", "allreduce", "nccl", "dgx-h200", 248,
     512 << 20, "busbw", 350e9, 0.20, "283"),
    ("2 x 8 H100 RoCE, NCCL's pick, 8 GiB", "allreduce", "nccl", "dgx-h100-roce", 2, 8 << 30,
     "busbw", 430e9, 0.20, "1221"),
    ("2 x 8 H100 RoCE, NCCL's pick without NVLS (NCCL_NVLS_ENABLE=0), 8 GiB", "allreduce",
     "nccl", "dgx-h100-roce", 2, 8 << 30, "busbw", 330e9, 0.20, "1221", {"nvls": False}),
    ("4 x 8 H100 RoCE, NCCL's pick, 8 GiB", "allreduce", "nccl", "dgx-h100-roce", 4, 8 << 30,
     "busbw", 320e9, 0.20, "1221"),
    ("4 x 8 H100 RoCE, NCCL's pick without NVLS (NCCL_NVLS_ENABLE=0), 8 GiB", "allreduce",
     "nccl", "dgx-h100-roce", 4, 8 << 30, "busbw", 320e9, 0.20, "1221", {"nvls": False}),
]


def published_rows(only=None) -> list[dict]:
    from dataclasses import replace
    rows = []
    for (label, coll, algo, name, nodes, nbytes, metric, anchor, tol, src, *changes) in PUBLISHED:
        if only is not None and label not in only:
            continue
        if metric == "crossover":
            ours = crossover(nodes, True)
            rows.append({"case": label, "collective": coll, "algorithm": "ring/tree",
                         "fabric": name, "nodes": nodes, "per_node": 8, "bytes": None,
                         "metric": metric, "anchor": anchor, "ours": ours,
                         "ratio": ours / anchor, "tolerance": tol, "protocol": "-",
                         "channels": 8, "max_link": "-", "source": src})
            continue
        fab = replace(fabric.preset(name, nodes, 8), **(changes[0] if changes else {}))
        # NCCL's tuning-model latency has no channel term: the latency rows run one tree
        r = timed.simulate(coll, algo, fab, nbytes, channels=1 if metric == "time" else None)
        ours = r.busbw if metric == "busbw" else r.time
        if r.algorithm:
            algo = f"{algo}={r.algorithm}"
        rows.append({"case": label, "collective": coll, "algorithm": algo, "fabric": name,
                     "nodes": nodes, "per_node": 8, "bytes": nbytes, "metric": metric,
                     "anchor": anchor, "ours": ours, "ratio": ours / anchor,
                     "tolerance": tol, "protocol": r.protocol, "channels": r.channels,
                     "max_link": r.max_link, "source": src})
    return rows


# Rows known to be out of their band, and why (tests/unit/test_sim_validation.py requires them
# to be out: a fix must take them off this list).
KNOWN_OUT: dict = {}


def in_band(row) -> bool:
    """Within +-tolerance; a crossover within 2x either way."""
    if row["metric"] == "crossover":
        return 0.5 <= row["ratio"] <= 2.0
    return abs(row["ratio"] - 1) <= row["tolerance"]


def _picked(row) -> str:
    """NCCL's pick, where the row ran ``nccl``: its algorithm before the protocol."""
    return row["algorithm"].split("=", 1)[1] + " " if "=" in row["algorithm"] else ""


def render_published(rows) -> str:
    def q(row, v):
        if row["metric"] == "crossover":
            return f"{v / 2**20:g} MiB" if v < 2**30 else f"{v / 2**30:g} GiB"
        return f"{v / 1e9:.0f} GB/s" if row["metric"] == "busbw" else f"{v * 1e6:.1f} us"
    lines = ["| case | anchor | ours | ratio | band | protocol, channels | bottleneck | source |",
             "|---|---:|---:|---:|---:|---|---|---|"]
    for row in rows:
        ok = in_band(row)
        band = ("x2" if row["metric"] == "crossover"
                else f"+-{row['tolerance'] * 100:.0f} %")
        lines.append(f"| {row['case']} | {q(row, row['anchor'])} | {q(row, row['ours'])} | "
                     f"{row['ratio']:.2f}{'' if ok else ' (out)'} | "
                     f"{band} | {_picked(row)}{row['protocol']}, "
                     f"{row['channels']} | {row['max_link']} | [{row['source']}] |")
    lines.append("")
    lines += [f"[{k}] {v}" for k, v in SOURCES.items()]
    return "\n".join(lines)


def _emit(rows, render_rows, json_path) -> None:
    """Print the table of ``rows``; write them to ``json_path`` (if given)."""
    print(render_rows(rows))
    if json_path:
        Path(json_path).write_text(json.dumps(rows, indent=1) + "\n")


def published(args) -> None:
    _emit(published_rows(), render_published, args.json)


def render(args) -> None:
    data = json.loads(Path(args.json).read_text())
    print({"published": render_published, "measured": render_measured,
           "pipeline": render_pipeline, "nodes": render_nodes,
           "workload": render_workload}[args.what_table](data))


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
    """4c: our ring, double binary tree and hierarchical on dgx-h100-textbook beside NCCL's model."""
    print("| nodes | ranks | size (B) | NCCL ring | our ring | NCCL tree | our double_binary_tree "
          "| our hierarchical |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for nodes in args.nodes:
        fab = fabric.preset("dgx-h100-textbook", nodes, 8)
        for nbytes in args.sizes:
            ring_m, tree_m = nccl_model(nodes, 8, nbytes)
            ring = timed.simulate("allreduce", "ring", fab, nbytes).time
            hier = timed.simulate("allreduce", "smp", fab, nbytes).time
            tree = (f"{timed.simulate('allreduce', 'double_binary_tree', fab, nbytes).time * 1e6:.0f}"
                    if nodes <= args.tree_max else "-")
            print(f"| {nodes} | {nodes * 8} | {nbytes:.0e} | {ring_m * 1e6:.0f} | {ring * 1e6:.0f} "
                  f"| {tree_m * 1e6:.0f} | {tree} | {hier * 1e6:.0f} |", flush=True)


PIPELINE = [("dgx-h100-nccl", 4, 64 << 20), ("dgx-h100-nccl", 4, 1 << 30),
            ("dgx-h100-nccl", 16, 1 << 30)]
PIPELINE_CHUNKS = (1, 2, 4, 8, 16)


def pipeline_rows(cases=PIPELINE, outers=("ring", "recursive_doubling"),
                  chunks=PIPELINE_CHUNKS) -> list[dict]:
    """``hierarchical`` (ring inside) with its node and network phases pipelined over k chunks
    (``simulate(..., pipeline=k)``), per outer algorithm: the time at each k."""
    rows = []
    for name, k, nbytes in cases:
        fab = fabric.preset(name, k, 8)
        for outer in outers:
            times = [timed.simulate("allreduce", "hierarchical", fab, nbytes, outer=outer,
                                    pipeline=c).time for c in chunks]
            rows.append({"fabric": name, "nodes": k, "per_node": 8, "bytes": nbytes,
                         "outer": outer, "chunks": list(chunks), "time": times})
    return rows


def render_pipeline(rows) -> str:
    ks = rows[0]["chunks"]
    lines = ["| fabric | nodes x 8 | size | outer | " + " | ".join(f"k = {k}" for k in ks)
             + " | best vs k = 1 |", "|---|---:|---:|---|" + "---:|" * len(ks) + "---:|"]
    for r in rows:
        size = (f"{r['bytes'] / 2**30:g} GiB" if r["bytes"] >= 2**30
                else f"{r['bytes'] / 2**20:g} MiB")
        best = min(range(len(ks)), key=lambda i: r["time"][i])
        cells = [f"**{t * 1e6:.0f}**" if i == best else f"{t * 1e6:.0f}"
                 for i, t in enumerate(r["time"])]
        lines.append(f"| {r['fabric']} | {r['nodes']} | {size} | {r['outer']} | "
                     + " | ".join(cells) + f" | {r['time'][0] / r['time'][best]:.2f}x |")
    return "\n".join(lines)


def pipeline(args) -> None:
    """hierarchical with pipelined node and network phases: us at each chunk count."""
    _emit(pipeline_rows(), render_pipeline, args.json)


# A GPT-like layer: 4,096 tokens per micro-batch, bf16, TP = 8, forward FLOPs 24 x tokens x
# hidden^2 / TP at 400 TFLOP/s per H100 (~40 % of its dense bf16 peak), 12 hidden^2 / TP weights.
WORKLOAD_TOKENS, WORKLOAD_FLOPS, WORKLOAD_LAYERS = 4096, 400e12, 32


def workload_model(hidden: int, bucket: int = 25 << 20):
    from mpicoll.simulators import workload
    fwd = 24 * WORKLOAD_TOKENS * hidden * hidden / 8 / WORKLOAD_FLOPS
    return workload.Model(layers=WORKLOAD_LAYERS, forward=fwd,
                          activation=WORKLOAD_TOKENS * hidden * 2,
                          gradient=12 * hidden * hidden * 2 // 8, bucket=bucket)


def workload_rows() -> list[dict]:
    """The seed's "TP across nodes: a step 2-5x slower" (TP = 8, no DP), per hidden size, and
    the straggler's cost at 25,000 ranks (TP 8 x DP 3,125, one DP rank 1 ms late)."""
    from mpicoll.simulators import workload
    fab = fabric.preset("dgx-h100", 1, 8)
    rows = []
    for hidden in (8192, 4096, 2048):
        m = workload_model(hidden)
        inside = workload.step(m, fab, tp=8, dp=1)
        across = workload.step(m, fab, tp=8, dp=1, tp_across_nodes=True)
        rows.append({"case": f"hidden {hidden}, TP 8", "forward_ms": m.forward * 1e3,
                     "inside_ms": inside.time * 1e3, "across_ms": across.time * 1e3,
                     "tp_inside_us": inside.parts["tp_allreduce"] * 1e6,
                     "tp_across_us": across.parts["tp_allreduce"] * 1e6})
    m = workload_model(4096, bucket=200 << 20)
    import numpy as np
    late = np.zeros(3125)
    late[1234] = 1e-3
    base = workload.step(m, fab, tp=8, dp=3125, dp_algorithm="double_binary_tree")
    slow = workload.step(m, fab, tp=8, dp=3125, dp_algorithm="double_binary_tree", delay=late)
    rows.append({"case": "hidden 4096, TP 8 x DP 3125 = 25,000 ranks, one rank 1 ms late",
                 "step_ms": base.time * 1e3, "late_step_ms": slow.time * 1e3,
                 "dp_exposed_ms": base.dp_exposed * 1e3, "buckets": base.buckets})
    return rows


def render_workload(rows) -> str:
    lines = ["| model | forward per layer (ms) | TP all-reduce inside / across (us) | step, TP "
             "inside a node (ms) | step, TP across nodes (ms) | across / inside |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows[:-1]:
        lines.append(f"| {r['case']} | {r['forward_ms']:.3f} | {r['tp_inside_us']:.0f} / "
                     f"{r['tp_across_us']:.0f} | {r['inside_ms']:.2f} | {r['across_ms']:.2f} | "
                     f"{r['across_ms'] / r['inside_ms']:.2f}x |")
    s = rows[-1]
    lines += ["", f"{s['case']}: step {s['step_ms']:.2f} ms ({s['buckets']} buckets of 200 MiB, "
                  f"{s['dp_exposed_ms']:.2f} ms of DP all-reduce after the backward pass), "
                  f"{s['late_step_ms']:.2f} ms with the late rank: it costs "
                  f"{s['late_step_ms'] - s['step_ms']:.3f} ms."]
    return "\n".join(lines)


def workload(args) -> None:
    """The training-step table of docs/simulator.md (``mpicoll.simulators.workload``)."""
    _emit(workload_rows(), render_workload, args.json)


NODE_COUNTS = [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 3072]
NODE_SIZES = [192 << 10, 12 << 20, 768 << 20]


def node_rows(sizes=NODE_SIZES, counts=NODE_COUNTS) -> list[dict]:
    """Hierarchical vs the rank-order ring on dgx-h100-textbook at each node count of 8 ranks: us."""
    rows = []
    for nbytes in sizes:
        for k in counts:
            fab = fabric.preset("dgx-h100-textbook", k, 8)
            rows.append({"bytes": nbytes, "nodes": k, "ranks": k * 8,
                         "ring_us": timed.simulate("allreduce", "ring", fab, nbytes).time * 1e6,
                         "hierarchical_us": timed.simulate("allreduce", "smp", fab,
                                                           nbytes).time * 1e6})
    return rows


def render_nodes(rows) -> str:
    lines = ["| size (B) | nodes | ranks | ring (us) | hierarchical (us) | ring / hierarchical |",
             "|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['bytes']} | {r['nodes']} | {r['ranks']} | {r['ring_us']:.0f} | "
                     f"{r['hierarchical_us']:.0f} | {r['ring_us'] / r['hierarchical_us']:.1f} |")
    return "\n".join(lines)


def nodes(args) -> None:
    """Hierarchical vs the rank-order ring on dgx-h100-textbook, 2 to 3,072 nodes of 8: the table (and
    ``--json``), and the figure (``-o``).

    The sizes divide into equal ring blocks at every node count (multiples of 3 x 2^14
    elements): uneven blocks at 16,384 ranks and more take minutes (docs/simulator.md).
    """
    rows = node_rows(args.sizes)
    _emit(rows, render_nodes, args.json)
    if not args.output:
        return
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for nbytes, color in zip(args.sizes, ("tab:blue", "tab:orange", "tab:green")):
        mine = [r for r in rows if r["bytes"] == nbytes]
        counts = [r["nodes"] for r in mine]
        label = f"{nbytes / 2**20:g} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:g} KiB"
        ax.plot(counts, [r["ring_us"] for r in mine], "o--", color=color,
                label=f"ring (rank order), {label}")
        ax.plot(counts, [r["hierarchical_us"] for r in mine], "s-", color=color,
                label=f"hierarchical, {label}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("nodes (8 H100 each)")
    ax.set_ylabel("simulated all-reduce time (us)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("timed executor, dgx-h100-textbook fabric: hierarchical (ring inside, recursive "
                 "doubling across) vs flat ring", fontsize=9)
    fig.tight_layout()
    fig.savefig(args.output, dpi=110, metadata={"Software": None})
    print(f"wrote {args.output}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    m = sub.add_parser("measured")
    m.add_argument("results", nargs="*", default=[str(ROOT / "docs/results/allreduce-np2.json"),
                                                   str(ROOT / "docs/results/allreduce-np4.json")])
    m.add_argument("--profile", default=None, help="default: the shipped profile")
    m.add_argument("--json", help="write the rows here")
    p = sub.add_parser("published")
    p.add_argument("--json", help="write the rows here")
    r = sub.add_parser("render")
    r.add_argument("what_table", choices=["published", "measured", "pipeline", "nodes",
                                          "workload"])
    r.add_argument("json")
    c = sub.add_parser("nccl")
    c.add_argument("--nodes", type=int, nargs="*", default=[1, 5, 25, 125, 625, 3125])
    c.add_argument("--sizes", type=lambda s: int(float(s)), nargs="*",
                   default=[100_000, 8_000_000, 1_000_000_000])
    c.add_argument("--tree-max", type=int, default=125,
                   help="largest node count for double_binary_tree (its all-ranks form; "
                        "contended waves at GB sizes are max-min solved per wave)")
    w = sub.add_parser("workload")
    w.add_argument("--json", help="write the rows here")
    q = sub.add_parser("pipeline")
    q.add_argument("--json", help="write the rows here")
    n = sub.add_parser("nodes")
    n.add_argument("--sizes", type=int, nargs="*", default=NODE_SIZES)
    n.add_argument("--json", help="write the rows here")
    n.add_argument("-o", "--output", default=str(ROOT / "docs/simulator-nodes.png"),
                   help="the figure ('' for none)")
    args = ap.parse_args()
    {"measured": measured, "nccl": nccl, "nodes": nodes, "published": published,
     "render": render, "pipeline": pipeline, "workload": workload}[args.what](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
