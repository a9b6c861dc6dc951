"""``mpicoll tune R1.json [R2.json ...] -o tuning.json``: bench sweeps -> decision table.

For each collective and rank count found in the results, the fastest of mpicoll's algorithms
(median time, out-of-place rows unless only in-place ones exist) at each measured size; runs of
sizes with the same winner become one range. Several sweeps of one N are pooled (median). To keep noise from splitting ranges, the winner of
the range so far keeps a size while it is within ``--margin`` (default 10 %) of the fastest. A size between two measured ones goes to the range
of the next larger measured size; the last range has no upper end. ``algorithm="auto"`` reads the
table from ``MPICOLL_TUNING`` (else the shipped ``profiles/tuning.json``):

    {"allreduce": {"4": [{"max_bytes": 32768, "algorithm": "recursive_doubling"},
                         {"max_bytes": null, "algorithm": "ring"}]}}
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from ..registry import COLLECTIVES

__all__ = ["main", "decision_table"]


def decision_table(results: list[dict], margin: float = 0.1) -> dict:
    """Sweeps of the same collective and N are pooled: each (size, algorithm) takes the median
    of its medians over the runs, so one noisy run cannot decide alone."""
    pooled: dict = {}
    for res in results:
        records = res["records"]
        inplace = all(r["inplace"] for r in records)
        key = (res.get("collective", "allreduce"), res["nranks"])
        # on one node a node-aware algorithm is its node phase alone: not a choice to record
        table = COLLECTIVES[key[0]]
        skip = {"mpi", "auto"} | ({a for a, algo in table.items() if algo.has("node-phases")}
                                  if res.get("nodes") == 1 else set()) \
            | {a for a, algo in table.items() if algo.has("own-rounding")}   # auto: same bits
        for r in records:
            if r["inplace"] == inplace and r["algorithm"] not in skip:
                pooled.setdefault(key, {}).setdefault((r["size"], r["algorithm"]), []).append(
                    r["time_us"])
    table: dict = {}
    for (collective, nranks), runs in sorted(pooled.items()):
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
        ranges[-1]["max_bytes"] = None
        table.setdefault(collective, {})[str(nranks)] = ranges
    return table


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="mpicoll tune", description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", help="JSON files written by mpicoll bench --json")
    ap.add_argument("-o", "--output", default="tuning.json")
    ap.add_argument("--margin", type=float, default=0.1,
                    help="keep the current winner while within this fraction of the fastest")
    args = ap.parse_args(argv)
    results = []
    for path in args.results:
        with open(path) as f:
            results.append(json.load(f))
    table = decision_table(results, args.margin)
    with open(args.output, "w") as f:
        json.dump(table, f, indent=1)
        f.write("\n")
    for collective, per_n in table.items():
        for n, ranges in per_n.items():
            print(f"{collective} N={n}: " + ", ".join(
                f"{r['algorithm']} up to {r['max_bytes'] if r['max_bytes'] else 'any size'}"
                for r in ranges))
    print(f"wrote {args.output}")
    return 0
