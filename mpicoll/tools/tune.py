"""``mpicoll tune R1.json [R2.json ...] -o tuning.json``: bench sweeps -> decision table.

For each collective and rank count found in the results, the fastest of mpicoll's algorithms
(median time, out-of-place rows unless only in-place ones exist) at each measured size; runs of
sizes with the same winner become one range. Several sweeps of one N are pooled (median). To keep noise from splitting ranges, the winner of
the range so far keeps a size while it is within ``--margin`` (default 10 %) of the fastest. A size between two measured ones goes to the range
of the next larger measured size; the last range ends at the largest measured size: nothing was
measured beyond it, so there ``algorithm="auto"`` falls through to the cost model
(``mpicoll.select``). ``auto`` reads the table from ``MPICOLL_TUNING`` (else the shipped
``profiles/tuning.json``):

    {"allreduce": {"4": [{"max_bytes": 32768, "algorithm": "recursive_doubling"},
                         {"max_bytes": 16777216, "algorithm": "ring"}]}}

(A range written by hand with ``"max_bytes": null`` has no upper end.)

With ``--with-mpi`` the table may also name ``mpi``, the MPI library's own algorithm, where it
was the fastest: ``auto`` then runs it there (a site whose MPI wins some sizes on its network,
docs/fabric.md); without, only mpicoll's algorithms.

A sweep across nodes (its JSON's ``nodes`` > 1) is keyed ``"N/L"``, N ranks with L on the
largest node (``"8/2"``: 4 nodes x 2), and serves only calls on that layout: a one-node row
(``"8"``) is measured with shared memory between all ranks and says nothing about a network,
so across nodes ``auto`` never reads it. A variant measured as ``NAME@KEY=VALUE[,...]`` (the
cross-node bench, jobs/experiments/fabric_bench.py: ``ring@order=node``, ``hierarchical@inner=shm``) is a
range's algorithm with ``"options"``, which ``auto`` passes on (``select.decide``).

Left out, with a line saying so: ``shm`` (one node only; ``select.shm_wins`` decides where
``auto`` runs it), node-aware algorithms measured on one node (``hierarchical``,
``double_binary_tree``: their node phase alone) and ``naive`` (a teaching baseline). Simulator
JSON (``mpicoll simulate --json``) is refused: the table is for measured times.
"""

from __future__ import annotations

import json

import numpy as np

from ..registry import COLLECTIVES
from .cli import Parser, nonnegative_float, prepare_output, read_bench_json

__all__ = ["main", "decision_table"]


def split(variant: str) -> tuple[str, dict]:
    """``"ring@order=node"`` -> ``("ring", {"order": "node"})``; several options are joined by
    ``+`` (``"hierarchical@inner=shm+outer=ring"``) or ``,``."""
    name, _, rest = variant.partition("@")
    pairs = rest.replace("+", ",").split(",")
    return name, dict(kv.split("=", 1) for kv in pairs if "=" in kv)


def layout_key(nranks: int, nodes: int | None, ranks_per_node: int | None) -> str:
    """The table's key for a sweep: ``"N"`` on one node, ``"N/L"`` across nodes (L: ranks of
    the largest node) -- the key ``select`` looks up for a call on that layout."""
    if nodes is None or nodes <= 1 or not ranks_per_node:
        return str(nranks)
    return f"{nranks}/{ranks_per_node}"


def left_out(results: list[dict]) -> dict[str, str]:
    """The measured algorithms the table never names, each with the reason (what ``tune``
    prints, so a faster ``shm`` missing from the table is no surprise)."""
    why = {}
    for res in results:
        table = COLLECTIVES[res.get("collective", "allreduce")]
        for name in dict.fromkeys(split(r["algorithm"])[0] for r in res["records"]):
            algo = table.get(name)
            if algo is None or name in why:
                continue
            if algo.has("shared-memory"):
                why[name] = ("runs on one node only, and the table also serves calls across "
                             "nodes: auto runs it by select.shm_wins, not by this table")
            elif algo.has("baseline"):
                why[name] = "a teaching baseline: auto never chooses it"
            elif algo.has("node-phases") and res.get("nodes") == 1:
                why[name] = ("node-aware, measured on one node (its node phase alone): not the "
                             "choice it would be across nodes")
    return why


def decision_table(results: list[dict], margin: float = 0.1, with_mpi: bool = False) -> dict:
    """Sweeps of the same collective and N are pooled: each (size, algorithm) takes the median
    of its medians over the runs, so one noisy run cannot decide alone."""
    pooled: dict = {}
    for res in results:
        records = res["records"]
        inplace = all(r["inplace"] for r in records)
        key = (res.get("collective", "allreduce"),
               layout_key(res["nranks"], res.get("nodes"), res.get("ranks_per_node")))
        # on one node a node-aware algorithm is its node phase alone: not a choice to record
        table = COLLECTIVES[key[0]]
        skip = {"auto"} | (set() if with_mpi else {"mpi"}) | ({a for a, algo in table.items() if algo.has("node-phases")}
                                  if res.get("nodes") == 1 else set()) \
            | {a for a, algo in table.items() if algo.has("baseline")} \
            | {a for a, algo in table.items() if algo.has("shared-memory")}
        # (auto: the same bits on every rank; shm runs on one node only, and select.shm_wins,
        # not the table, decides where)
        for r in records:
            name, options = split(r["algorithm"])
            algo = table.get(name)
            choices = {o.name: o.choices for o in algo.options} if algo else {}
            if r["inplace"] != inplace or name in skip or algo is None or any(
                    v not in choices.get(k, ()) for k, v in options.items()):
                continue                    # (not a variant auto can run)
            pooled.setdefault(key, {}).setdefault((r["size"], r["algorithm"]), []).append(
                r["time_us"])
    table: dict = {}
    for (collective, nranks), runs in sorted(pooled.items(), key=lambda kv: (
            kv[0][0], [int(x) for x in kv[0][1].split("/")])):
        times = {k: float(np.median(v)) for k, v in runs.items()}
        ranges = []
        for size in sorted({s for s, _ in times}):
            own = {a: t for (s, a), t in times.items() if s == size}
            algorithm = min(own, key=own.get)
            if ranges and own.get(ranges[-1]["algorithm"], float("inf")) \
                    <= (1 + margin) * own[algorithm]:
                algorithm = ranges[-1]["algorithm"]        # still within the margin: keep it
            if ranges and ranges[-1]["algorithm"] == algorithm:
                ranges[-1]["max_bytes"] = size
            else:
                ranges.append({"max_bytes": size, "algorithm": algorithm})
        for entry in ranges:
            name, options = split(entry["algorithm"])
            entry["algorithm"] = name
            if options:
                entry["options"] = options
        table.setdefault(collective, {})[nranks] = ranges
    return table


def main(argv=None) -> int:
    ap = Parser("mpicoll tune", __doc__)
    ap.add_argument("results", nargs="+", help="JSON files written by mpicoll bench --json")
    ap.add_argument("-o", "--output", default="tuning.json", help="the decision table")
    ap.add_argument("--margin", type=nonnegative_float, default=0.1,
                    help="keep the current winner while within this fraction of the fastest")
    ap.add_argument("--with-mpi", action="store_true",
                    help="the table may name mpi (the MPI library's own) where it was fastest")
    args = ap.parse_args(argv)
    try:
        results = [read_bench_json(path) for path in args.results]
    except ValueError as e:
        ap.error(str(e))
    table = decision_table(results, args.margin, args.with_mpi)
    if not table:
        ap.error("no algorithm of mpicoll's to choose from in these results (only mpi, auto, "
                 "or node-aware algorithms measured on one node)")
    problem = prepare_output(args.output, create=False)
    if problem:
        ap.error(problem)
    for name, why in left_out(results).items():
        print(f"# left out: {name} ({why})")
    with open(args.output, "w") as f:
        json.dump(table, f, indent=1)
        f.write("\n")
    for collective, per_n in table.items():
        for n, ranges in per_n.items():
            print(f"{collective} N={n}: " + ", ".join(
                f"{r['algorithm']}" + "".join(f" {k}={v}" for k, v in r.get("options", {}).items())
                + f" up to {r['max_bytes']} B" for r in ranges)
                + f"; above {ranges[-1]['max_bytes']} B (not measured) auto asks the cost model")
    print(f"wrote {args.output}")
    return 0
