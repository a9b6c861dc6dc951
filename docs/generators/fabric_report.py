"""docs/fabric.md's tables and plots, from the shaped-fabric runs (no MPI needed).

    python docs/generators/fabric_report.py [--collect RESULTS_DIR ...] [--results docs/results]
        [--doc docs/fabric.md]

``--collect`` first copies a slurm/fabric.sbatch job's fabric-bench-*.json and
fabric_bytes.json (as fabric-bytes-<fabric>.json) into --results; ``--collect-tuned`` copies a
bench job run with ``MPICOLL_TUNING`` (auto with the fabric's decision table) as
fabric-tuned-*.json. Then, from every
docs/results/fabric-bench-<fabric>-<N>x<K>[-cyclic].json:

* per fabric and layout: MPI_Allreduce's time, mpicoll's best variant and ``auto`` against it;
* the seeds' claims (hierarchical against the flat rank-order ring; node vs rank order);
* the simulator (``mpicoll.simulators.timed.simulate``) on the fabric JSON the cluster was
  started with (slurm/local/fabric-<speed>.json: the NIC is the node's one link, shared by its
  ranks -- ``leaf="node"``, one node per leaf, ``oversubscription`` = ranks per node, so a node's
  uplink carries the NIC's bandwidth whatever the number of ranks), predicted against measured
  at every size >= 64 KiB, with the ratio, the order of the variants, and the crossovers;
* plots docs/fabric-<fabric>.png: time and bus bandwidth against size, one line per variant.

It rewrites the part of --doc between ``<!-- fabric-report:begin -->`` and
``<!-- fabric-report:end -->``; the text around it is written by hand.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from mpicoll.tools.sizes import human  # noqa: E402

FABRIC_FILES = {"veth-1g": ROOT / "slurm/local/fabric-1g.json",
                "veth-10g": ROOT / "slurm/local/fabric-10g.json"}
BEGIN, END = "<!-- fabric-report:begin -->", "<!-- fabric-report:end -->"
SIM_MIN = 64 << 10
TUNED = "fabric-tuned-"      # the bench again, auto with MPICOLL_TUNING (--collect-tuned)
# The "host" model adds the hosts' network stack and memory copies that
# jobs/experiments/fabric_stack.py measured (fabric-stack-*.json, from `slurm/fabric.sbatch all`
# or `stack`): on the fastest
# fabric measured, where the link is faster than the stack, so that the rates are the stack's
# (the copies between ranks of one node do not cross a link: any fabric measures them).
STACK = "fabric-stack-"
PAIR = 1.25     # two variants measured further apart than this are "clearly" in an order


def within_band(predicted: float, measured: float) -> bool:
    """The issue's +-25 %: predicted / measured in 0.80-1.25."""
    return 0.8 <= predicted / measured <= 1.25


def collect(dirs, results: Path, prefix: str = "fabric-bench-") -> None:
    results.mkdir(parents=True, exist_ok=True)
    for d in map(Path, dirs):
        for p in sorted(d.glob("fabric-bench-*.json")):
            name = prefix + p.name[len("fabric-bench-"):]
            shutil.copy(p, results / name)
            print(f"# {p} -> {results / name}")
        for what in ("bytes", "stack"):
            b = d / f"fabric_{what}.json"
            if b.exists():
                res = json.loads(b.read_text())
                name = f"fabric-{what}-{res.get('fabric') or 'plain'}-{res['nranks']}ranks.json"
                shutil.copy(b, results / name)
                print(f"# {b} -> {results / name}")


def load_runs(results: Path, prefix: str = "fabric-bench-") -> list[dict]:
    runs = []
    for p in sorted(results.glob(f"{prefix}*.json")):
        m = re.fullmatch(prefix + r"(.+)-(\d+)x(\d+)(-cyclic)?\.json", p.name)
        if not m:
            continue
        res = json.loads(p.read_text())
        res.update(_file=p.name, _fabric=m.group(1), _nodes=int(m.group(2)),
                   _per=int(m.group(3)), _cyclic=bool(m.group(4)))
        runs.append(res)
    speed = {"veth-1g": 0, "veth-10g": 1}
    runs.sort(key=lambda r: (speed.get(r["_fabric"], 9), r["_cyclic"], r["_nodes"], r["_per"]))
    return runs


def table(runs_records) -> dict:
    """{size: {variant: record}} of out-of-place records."""
    out = {}
    for r in runs_records:
        if not r["inplace"]:
            out.setdefault(r["size"], {})[r["algorithm"]] = r
    return dict(sorted(out.items()))


def split(variant: str):
    name, _, rest = variant.partition("@")
    return name, dict(kv.split("=", 1) for kv in rest.replace("+", ",").split(",") if kv)


def load_stack(results: Path) -> dict | None:
    """The stack measured on the fabric with the fastest links (None: none measured)."""
    from mpicoll.simulators.fabric import from_json
    found = []
    for p in sorted(results.glob(f"{STACK}*.json")):
        res = json.loads(p.read_text())
        if res.get("fabric") in FABRIC_FILES:
            nic = from_json(FABRIC_FILES[res["fabric"]], 1, 1).nic.bandwidth
            found.append((nic, p.name, res))
    if not found:
        return None
    nic, name, res = max(found, key=lambda x: x[0])
    return dict(res, _file=name, _nic=nic)


def model_fabric(fabric_name: str, nodes: int, per: int, stack: dict | None = None):
    """The fabric JSON's model at ``nodes`` x ``per``, plus the hosts' network stack and memory
    copies when ``stack`` (a fabric-stack-*.json) is given: every emulated node on the one
    host."""
    from mpicoll.simulators.fabric import from_json
    f = from_json(FABRIC_FILES[fabric_name], nodes, per)
    # the node's one link is shared by its ranks: the leaf (the node) uplink = one NIC
    f = replace(f, oversubscription=float(per) if f.leaf == "node" else f.oversubscription)
    if stack is not None:
        f = replace(f, name=f.name + "+host", stack=stack["stack"],
                    stack_per_flow=stack["stack_per_flow"], copy=stack.get("copy"),
                    nodes_per_host=nodes)
    return f


def predict(fabric, variant: str, auto_choice, nbytes: int):
    from mpicoll.simulators.timed import simulate
    name, opts = split(auto_choice if variant == "auto" and auto_choice else variant)
    if name in ("mpi", "auto") or opts.get("inner") == "shm":
        return None
    try:
        return simulate("allreduce", name, fabric, nbytes, **opts).time * 1e6
    except ValueError:
        return None


def crossover(sizes, a, b):
    """The first size at which series a (times) gets below series b, or None."""
    for s, x, y in zip(sizes, a, b):
        if x is not None and y is not None and x < y:
            return s
    return None


def plot(runs, fabric_name: str, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    sel = [r for r in runs if r["_fabric"] == fabric_name]
    if not sel:
        return
    fig, axes = plt.subplots(2, len(sel), figsize=(4.2 * len(sel), 7.5), squeeze=False)
    for j, run in enumerate(sel):
        t = table(run["records"])
        variants = run.get("variants") or sorted({a for row in t.values() for a in row})
        for v in variants:
            pts = [(s, row[v]) for s, row in t.items() if v in row]
            if not pts:
                continue
            xs = [s for s, _ in pts]
            style = dict(lw=2.2, color="k") if v == "mpi" else dict(lw=1.2)
            if v.startswith("hierarchical"):
                style["ls"] = "--"
            axes[0, j].loglog(xs, [r["time_us"] for _, r in pts], marker=".", label=v, **style)
            axes[1, j].semilogx(xs, [r["busbw"] * 1e3 for _, r in pts], marker=".", **style)
        lay = f"{run['_nodes']} nodes x {run['_per']}" + (" (cyclic)" if run["_cyclic"] else "")
        axes[0, j].set_title(f"{fabric_name}: {lay}")
        axes[0, j].set_ylabel("time (us)")
        axes[1, j].set_ylabel("bus bandwidth (MB/s)")
        axes[1, j].set_xlabel("size (B)")
        for ax in axes[:, j]:
            ax.grid(True, which="both", alpha=0.3)
    axes[0, 0].legend(fontsize=6.5, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    print(f"# wrote {path}")


def report(runs, results: Path, doc_dir: Path) -> str:
    lines = []
    add = lines.append
    # -- link bytes
    byte_files = sorted(results.glob("fabric-bytes-*.json"))
    if byte_files:
        add("### The traffic crosses the links\n")
        add("| fabric | ranks | algorithm | size x calls | bytes on the links (tx) | "
            "mpicoll's inter-node count | ratio |")
        add("|---|---|---|---|---:|---:|---:|")
        for p in byte_files:
            b = json.loads(p.read_text())
            for r in b["records"]:
                ref = (f"{r['counted_internode_bytes']:,}" if r["algorithm"] != "mpi" else
                       f"({r['reference_bytes']:,}: the least a node-aware all-reduce sends)")
                add(f"| {b['fabric']} | {b['nranks']} on {len(b['nodes'])} nodes | "
                    f"{r['algorithm']} | {human(r['size'])} x {r['iterations']} | "
                    f"{r['link_tx_bytes']:,} | {ref} | {r['ratio']:.4f} |")
        add(f"\n(from {', '.join('docs/results/' + p.name for p in byte_files)})\n")

    # -- per layout: MPI, best, auto
    add("### mpicoll against MPI_Allreduce, per layout\n")
    add("Median time of the slowest rank (us); `vs MPI` = MPI's time / mpicoll's (above 1: "
        "mpicoll is faster). *best* is the fastest mpicoll variant at that size.\n")
    sims = {}
    for run in runs:
        t = table(run["records"])
        lay = f"{run['_nodes']}x{run['_per']}" + ("-cyclic" if run["_cyclic"] else "")
        add(f"**{run['_fabric']}, {run['_nodes']} nodes x {run['_per']} rank(s)"
            f"{' (cyclic placement)' if run['_cyclic'] else ''}** "
            f"(`docs/results/{run['_file']}`)\n")
        add("| size | MPI | best mpicoll | best vs MPI | auto | auto vs MPI |")
        add("|---:|---:|---|---:|---|---:|")
        for s, row in t.items():
            if "mpi" not in row:
                continue
            mpi = row["mpi"]["time_us"]
            mine = {v: r for v, r in row.items() if v != "mpi"}
            best = min(mine, key=lambda v: mine[v]["time_us"])
            auto = row.get("auto")
            auto_s = (f"{auto['auto_choice']} {auto['time_us']:.0f} | "
                      f"{mpi / auto['time_us']:.2f}" if auto else "- | -")
            add(f"| {human(s)} | {mpi:.0f} | {best} {mine[best]['time_us']:.0f} | "
                f"{mpi / mine[best]['time_us']:.2f} | {auto_s} |")
        add("")
        if not run["_cyclic"] and run["_fabric"] in FABRIC_FILES:
            sims[(run["_fabric"], lay)] = (run, t)

    # -- auto with the fabric's own decision table (MPICOLL_TUNING, `mpicoll tune` on the
    # sweeps above): a later run of the same bench
    tuned = load_runs(results, TUNED)
    if tuned:
        add("### auto with the fabric's decision table\n")
        add("A later run of the same bench with `MPICOLL_TUNING=slurm/local/tuning-fabric-1g.json` "
            "(`mpicoll tune` on the 1 Gbit/s sweeps above: one `\"N/L\"` row per layout). `auto "
            "vs MPI` = MPI's time / auto's, both measured in this run (interleaved).\n")
        add("| layout | size | MPI | auto ran | auto | auto vs MPI | best mpicoll | best vs MPI |")
        add("|---|---:|---:|---|---:|---:|---|---:|")
        for run in tuned:
            lay = f"{run['_nodes']}x{run['_per']}" + ("c" if run["_cyclic"] else "")
            for s, row in table(run["records"]).items():
                if "mpi" not in row or "auto" not in row:
                    continue
                mpi, auto = row["mpi"]["time_us"], row["auto"]
                mine = {v: r for v, r in row.items() if v != "mpi"}
                best = min(mine, key=lambda v: mine[v]["time_us"])
                add(f"| {run['_fabric']} {lay} | {human(s)} | {mpi:.0f} | {auto['auto_choice']} | "
                    f"{auto['time_us']:.0f} | {mpi / auto['time_us']:.2f} | {best} | "
                    f"{mpi / mine[best]['time_us']:.2f} |")
        add("")
    # every run of auto against MPI at 1 Gbit/s, block placement: before (the sweeps) and
    # with the table it had (the later runs, each tuned on the runs before it)
    sets = [("the sweeps above (auto before: one-node table and model)",
             [r for r in runs if r["_fabric"] == "veth-1g" and not r["_cyclic"]])]
    for sub, what in (("fabric-tuned-first", "2026-12-01, loaded machine: first run with a "
                                             "fabric table (from that day's sweeps)"),
                      ("fabric-tuned-second", "2026-12-01, loaded machine: second run (table "
                                              "from the sweeps and the first, --with-mpi)")):
        if (results / sub).is_dir():
            sets.append((f"{what}, `docs/results/{sub}/`", load_runs(results / sub)))
    if tuned:
        sets.append(("the run in the table above (table from the sweeps above)", tuned))
    if len(sets) > 1:
        add("auto against MPI at 1 Gbit/s, block placement, every run (each point: MPI's time / "
            "auto's in that run):\n")
        add("| run | layouts | auto >= MPI | from 1 MiB | lowest from 1 MiB | below 1 MiB: "
            "best mpicoll variant >= MPI |")
        add("|---|---|---:|---:|---:|---:|")
        for what, rs in sets:
            pts = [(s, row["mpi"]["time_us"] / row["auto"]["time_us"],
                    row["mpi"]["time_us"] / min(r["time_us"] for v, r in row.items() if v != "mpi"))
                   for run in rs for s, row in table(run["records"]).items()
                   if "mpi" in row and "auto" in row]
            big = [a for s, a, _ in pts if s >= 1 << 20]
            small = [b for s, _, b in pts if s < 1 << 20]
            lays = " ".join(sorted({f"{r['_nodes']}x{r['_per']}" for r in rs}))
            add(f"| {what} | {lays} | "
                f"{sum(a >= 1 for _, a, _ in pts)} / {len(pts)} | {sum(a >= 1 for a in big)} / "
                f"{len(big)} | {min(big):.2f} | {sum(b >= 1 for b in small)} / {len(small)} |")
        add("")

    # -- the claims
    add("### The seeds' claims, measured\n")
    for run in runs:
        if (run["_nodes"], run["_per"]) != (4, 2):
            continue
        t = table(run["records"])
        lay = "cyclic placement" if run["_cyclic"] else "block placement"
        add(f"**{run['_fabric']}, 4 nodes x 2, {lay}:** flat rank-order ring / hierarchical "
            f"(above 1: hierarchical faster); ring rank order / node order\n")
        add("| size | ring (us) | best hierarchical (us) | ring / hierarchical | "
            "ring@order=node (us) | rank / node |")
        add("|---:|---:|---:|---:|---:|---:|")
        for s, row in t.items():
            if s < 1 << 20 or "ring" not in row:
                continue
            hier = {v: r["time_us"] for v, r in row.items() if v.startswith("hierarchical")}
            hb = min(hier, key=hier.get)
            node = row.get("ring@order=node")
            add(f"| {human(s)} | {row['ring']['time_us']:.0f} | {hier[hb]:.0f} "
                f"({hb.partition('@')[2].replace('inner=', '')}) | {row['ring']['time_us'] / hier[hb]:.2f} | "
                + (f"{node['time_us']:.0f} | {row['ring']['time_us'] / node['time_us']:.2f} |"
                   if node else "- | - |"))
        add("")

    # -- simulator
    add("### The simulator against the measurements\n")
    stack = load_stack(results)
    add(f"Every variant with a schedule at every size >= {human(SIM_MIN)}: predicted / measured "
        "(1.00 = exact; 0.80-1.25 is the issue's +-25 %), for two models: **network** = the "
        "fabric JSON the cluster was started with (TCP's per-message cost across the link, "
        "112 us), and *host* = the same plus the hosts' network stack (every emulated node on "
        "this one machine: its CPU moves each inter-node byte out of one node and into another) "
        "and their memory copies (the bytes between ranks of one node that MPI's shared memory "
        "copies, shared by every rank on the machine)"
        + (f", as `jobs/experiments/fabric_stack.py` measured them with point-to-point messages on "
           f"{stack['fabric']} ({stack['nranks']} ranks on {stack['nodes']} nodes, "
           f"`docs/results/{stack['_file']}`): one message between nodes alone "
           f"{stack['stack_per_flow'] / 1e6:.0f} MB/s, every rank at once "
           f"{stack['all_flows_Bps'] / 1e6:.0f} MB/s between nodes in all"
           + (f", every rank with a rank of its own node at once {stack['copy'] / 1e9:.1f} GB/s "
              "in all" if stack.get("copy") else "") if stack else
           ": not measured, so the same as network") + ". "
        "`auto` is simulated as the variant it picked; MPI_Allreduce and "
        "`hierarchical@inner=shm` have no schedule. Both predictions and the measurements are in "
        "docs/results/fabric-sim-*.json.\n")
    summary = []
    for (fabric_name, lay), (run, t) in sims.items():
        fabs = {"network": model_fabric(fabric_name, run["_nodes"], run["_per"]),
                "host": model_fabric(fabric_name, run["_nodes"], run["_per"], stack)}
        sizes = [s for s in t if s >= SIM_MIN]
        variants = [v for v in (run.get("variants") or []) if v != "mpi"]
        meas = {v: [t[s][v]["time_us"] if v in t[s] else None for s in sizes] for v in variants}
        pred = {m: {v: [predict(f, v, t[s].get(v, {}).get("auto_choice"), s)
                        if v in t[s] else None for s in sizes] for v in variants}
                for m, f in fabs.items()}
        sim_vs = [v for v in variants if any(p is not None for p in pred["network"][v])]
        add(f"**{fabric_name}, {run['_nodes']} nodes x {run['_per']}** (network model: "
            f"{fabs['network'].describe()})\n")
        add("| variant | " + " | ".join(human(s) for s in sizes) + " |")
        add("|---|" + "---:|" * len(sizes))
        stats = {m: {"within": 0, "total": 0, "same": 0, "rho": [], "pairs": 0, "alike": 0}
                 for m in fabs}
        for v in sim_vs:
            cells = []
            for i, mv in enumerate(meas[v]):
                pn, pl = pred["network"][v][i], pred["host"][v][i]
                if pn is None or mv is None:
                    cells.append("-")
                    continue
                for m, p in (("network", pn), ("host", pl)):
                    stats[m]["total"] += 1
                    stats[m]["within"] += within_band(p, mv)
                cells.append(f"**{pn / mv:.2f}** *{pl / mv:.2f}*")
            add(f"| {v} | " + " | ".join(cells) + " |")
        for m in fabs:
            for i in range(len(sizes)):
                vs = [v for v in sim_vs if pred[m][v][i] is not None and meas[v][i] is not None]
                if len(vs) < 3:
                    continue
                stats[m]["same"] += (sorted(vs, key=lambda v: meas[v][i])
                                     == sorted(vs, key=lambda v: pred[m][v][i]))
                a = np.argsort(np.argsort([meas[v][i] for v in vs]))
                b = np.argsort(np.argsort([pred[m][v][i] for v in vs]))
                stats[m]["rho"].append(float(np.corrcoef(a, b)[0, 1]))
                # the pairs whose measured times differ by more than the +-25 % band
                for j, v in enumerate(vs):
                    for w in vs[j + 1:]:
                        if max(meas[v][i], meas[w][i]) > PAIR * min(meas[v][i], meas[w][i]):
                            stats[m]["pairs"] += 1
                            stats[m]["alike"] += ((meas[v][i] < meas[w][i])
                                                  == (pred[m][v][i] < pred[m][w][i]))
        add("")
        for m in fabs:
            st = stats[m]
            add(f"- {m}: within +-25 % at {st['within']} of {st['total']} points; the same "
                f"order of all variants at {st['same']} of {len(sizes)} sizes (rank correlation "
                f"per size: {', '.join(f'{c:.2f}' for c in st['rho'])}); of the pairs of "
                f"variants measured more than {PAIR:g}x apart at a size, {st['alike']} of "
                f"{st['pairs']} in the same order.")
        full = sorted(t)
        for a, b in (("ring", "recursive_doubling"), ("ring", "binomial")):
            if a in variants and b in variants:
                ms = crossover(full, [t[s].get(a, {}).get("time_us") for s in full],
                               [t[s].get(b, {}).get("time_us") for s in full])
                ps = {m: crossover(full, [predict(f, a, None, s) for s in full],
                                   [predict(f, b, None, s) for s in full])
                      for m, f in fabs.items()}
                add(f"- {a} overtakes {b}: measured at {human(ms) if ms else 'no size'}; "
                    f"predicted at {human(ps['network']) if ps['network'] else 'no size'} "
                    f"(network), {human(ps['host']) if ps['host'] else 'no size'} (host).")
        add("")
        (results / f"fabric-sim-{fabric_name}-{lay}.json").write_text(json.dumps({
            "fabric": fabric_name, "layout": lay,
            "models": {m: f.to_json() for m, f in fabs.items()},
            "sizes": sizes, "measured_us": meas, "predicted_us": pred,
            "stats": stats}, indent=1) + "\n")
        summary.append((fabric_name, lay, stats, len(sizes)))
    if summary:
        add(f"| fabric | layout | within +-25 %: network | host | same order: network | "
            f"host | pairs > {PAIR:g}x apart in the same order: network | host |")
        add("|---|---|---:|---:|---:|---:|---:|---:|")
        for f, lay, st, n in summary:
            add(f"| {f} | {lay} | {st['network']['within']} / {st['network']['total']} | "
                f"{st['host']['within']} / {st['host']['total']} | "
                f"{st['network']['same']} / {n} | {st['host']['same']} / {n} | "
                f"{st['network']['alike']} / {st['network']['pairs']} | "
                f"{st['host']['alike']} / {st['host']['pairs']} |")
        add("")
    repeat_section(add, results, sims, stack)
    for name in sorted({r["_fabric"] for r in runs}):
        path = doc_dir / f"fabric-{name}.png"
        try:
            plot(runs, name, path)
            add(f"![{name}: time and bus bandwidth against size](fabric-{name}.png)\n")
        except ImportError:
            add(f"(no matplotlib: plot {path.name} not drawn)\n")
    return "\n".join(lines)


REPEAT = "-repeat"      # fabric-bench-<fabric>-<N>x<K>-repeat.json: the same sweep, run again


def repeat_section(add, results: Path, sims: dict, stack: dict | None) -> None:
    """How far two runs of the same sweep are apart, and what that does to the simulator's
    +-25 %: for every layout with a fabric-bench-*-repeat.json beside its sweep."""
    rows = []
    for (fabric_name, lay), (run, t) in sims.items():
        p = results / f"fabric-bench-{fabric_name}-{lay}{REPEAT}.json"
        if not p.exists():
            continue
        t2 = table(json.loads(p.read_text())["records"])
        fab = model_fabric(fabric_name, run["_nodes"], run["_per"], stack)
        ratios, within = [], [0, 0, 0, 0]       # sweep, repeat, both, either
        points = 0
        for s in (s for s in t if s >= SIM_MIN and s in t2):
            for v in t[s]:
                if v not in t2[s] or t[s][v].get("auto_choice") != t2[s][v].get("auto_choice"):
                    continue            # auto compared only where both runs ran the same
                m1, m2 = t[s][v]["time_us"], t2[s][v]["time_us"]
                ratios.append(m2 / m1)
                if v == "mpi":
                    continue
                p1 = predict(fab, v, t[s][v].get("auto_choice"), s)
                p2 = predict(fab, v, t2[s][v].get("auto_choice"), s)
                if p1 is None or p2 is None:
                    continue
                points += 1
                a, b = within_band(p1, m1), within_band(p2, m2)
                within[0] += a
                within[1] += b
                within[2] += a and b
                within[3] += a or b
        if ratios:
            r = np.array(ratios)
            rows.append((fabric_name, lay, len(r), int(((r < 0.8) | (r > 1.25)).sum()),
                         float(np.median(r)), float(r.min()), float(r.max()), points, within))
    if not rows:
        return
    add("**Run to run.** The same sweep run again on the same cluster (`--tag repeat`, "
        "`docs/results/fabric-bench-*-repeat.json`): how far the two runs' medians are apart at "
        f"every size >= {human(SIM_MIN)} (every variant and MPI; `auto` only where both runs "
        "ran the same algorithm), and the host model's +-25 % on each run (the variants it "
        "simulates). A model can't be held closer to one run than the runs are to each "
        "other.\n")
    add("| fabric | layout | points | runs > 1.25x apart | repeat / sweep: median (range) | "
        "simulated points | host within +-25 %: sweep | repeat | both runs | either run |")
    add("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for fabric_name, lay, n, apart, med, lo, hi, pts, w in rows:
        add(f"| {fabric_name} | {lay} | {n} | {apart} | {med:.2f} ({lo:.2f}-{hi:.2f}) | {pts} | "
            f"{w[0]} | {w[1]} | {w[2]} | {w[3]} |")
    add("")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--collect", nargs="*", default=[], help="job results directories")
    ap.add_argument("--collect-tuned", nargs="*", default=[],
                    help="job results directories of a bench run with MPICOLL_TUNING (copied "
                         "as fabric-tuned-*.json)")
    ap.add_argument("--results", type=Path, default=ROOT / "docs/results")
    ap.add_argument("--doc", type=Path, default=ROOT / "docs/fabric.md")
    args = ap.parse_args(argv)
    if args.collect:
        collect(args.collect, args.results)
    if args.collect_tuned:
        collect(args.collect_tuned, args.results, TUNED)
    runs = load_runs(args.results)
    if not runs:
        print(f"no fabric-bench-*.json in {args.results}", file=sys.stderr)
        return 1
    body = report(runs, args.results, args.doc.parent)
    text = args.doc.read_text() if args.doc.exists() else f"# Fabric\n\n{BEGIN}\n{END}\n"
    if BEGIN not in text:
        text += f"\n{BEGIN}\n{END}\n"
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1] if END in rest else ""
    args.doc.write_text(f"{head}{BEGIN}\n<!-- generated by "
                        f"`python docs/generators/fabric_report.py`: "
                        f"edit the text outside these markers -->\n\n{body}\n{END}{tail}")
    print(f"# wrote {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
