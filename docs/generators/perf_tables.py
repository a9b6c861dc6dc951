"""The all-reduce tables of docs/performance.md: medians of several bench runs, against MPI.

    python docs/generators/perf_tables.py --runs DIR/np2-{1,2,3}.json \
        --persistent DIR/np2-persistent-{1,2,3}.json
    python docs/generators/perf_tables.py --shm-single DIR/shm-single-auto-{1,2,3}.json \
        --shm-window DIR/shm-single-off-{1,2,3}.json
    python docs/generators/perf_tables.py --in-place DIR/shm-inplace-np2-{1,2,3}.json
    python docs/generators/perf_tables.py --before DIR/before-{1,2,3}.json --after DIR/after-{1,2,3}.json

Each run is ``mpicoll bench --json`` (plain calls) and, optionally, ``--persistent`` runs of the
same sizes. Every column is a ratio vs_mpi (MPI's time over mpicoll's, in the same run; above 1
is faster than ``MPI_Allreduce``) and the median over the runs of that ratio: per algorithm
first, then the best algorithm by its median, so one lucky run can't pick the winner. "MPI" is
the median of MPI's own times (µs). "auto runs" lists auto's ratio in each run, the spread the
median hides; "shm" is ``algorithm="shm"`` (one node only). Goals (issue 12): the best plain
call >= 1.0 at every size, auto >= 0.95; the rows that miss one are marked.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict


def ratios(paths: list[str], in_place: bool = False) -> tuple[dict, dict, int]:
    """``(vs[size][algorithm] -> [ratio per run], mpi[size] -> [µs per run], nranks)``, out of
    place only (``in_place``: in place only)."""
    vs: dict = defaultdict(lambda: defaultdict(list))
    mpi: dict = defaultdict(list)
    nranks = 0
    for path in paths:
        with open(path) as f:
            run = json.load(f)
        nranks = run["nranks"]
        for r in run["records"]:
            if bool(r.get("inplace")) != in_place:
                continue
            if r["algorithm"] == "mpi":
                mpi[r["size"]].append(r["time_us"])
            elif r["vs_mpi"] is not None:
                name = "auto" if r["algorithm"].startswith("auto") else r["algorithm"]
                vs[r["size"]][name].append(r["vs_mpi"])
    return vs, mpi, nranks


def size_label(size: int) -> str:
    for unit, k in (("Mi", 1 << 20), ("Ki", 1 << 10)):
        if size >= k and size % k == 0:
            return f"{size // k} {unit}"
    return str(size)


def median_cell(runs) -> str:
    """The median of a cell's per-run ratios, or "-" where there are none."""
    return f"{statistics.median(runs):.2f}" if runs else "-"


def best(row: dict) -> tuple[str, float] | tuple[None, None]:
    """The algorithm with the highest median ratio (auto left out), and that median."""
    own = {a: statistics.median(v) for a, v in row.items() if a != "auto"}
    if not own:
        return None, None
    name = max(own, key=own.get)
    return name, own[name]


def table(runs: list[str], persistent: list[str]) -> str:
    vs, mpi, nranks = ratios(runs)
    pvs = ratios(persistent)[0] if persistent else {}
    lines = [f"N = {nranks}: medians of {len(runs)} runs"
             + (f" (persistent: {len(persistent)} runs)" if persistent else ""), "",
             "| size (B) | MPI (µs) | best plain call | its algorithm | `auto` | auto runs "
             "| `shm` | best persistent | goal |",
             "|---:|---:|---:|---|---:|---|---:|---:|---|"]
    for size in sorted(vs):
        row = vs[size]
        name, ratio = best(row)
        auto = statistics.median(row["auto"]) if row.get("auto") else None
        shm = statistics.median(row["shm"]) if row.get("shm") else None
        pname, pratio = best(pvs.get(size, {}))
        misses = []
        if ratio is not None and ratio < 1.0:
            misses.append("best < 1.0")
        if auto is not None and auto < 0.95:
            misses.append("auto < 0.95")
        lines.append(
            f"| {size_label(size)} | {statistics.median(mpi[size]):.1f} | "
            f"{ratio:.2f} | {name} | "
            + (f"{auto:.2f}" if auto is not None else "-") + " | "
            + " / ".join(f"{x:.2f}" for x in row.get("auto", [])) + " | "
            + (f"{shm:.2f}" if shm is not None else "-") + " | "
            + (f"{pratio:.2f} ({pname})" if pratio is not None else "-") + " | "
            + (", ".join(misses) or "met") + " |")
    return "\n".join(lines)


def shm_single_table(single: list[str], window: list[str]) -> str:
    """``shm``'s single copy against its window copy (``MPICOLL_SHM_SINGLE_COPY=auto`` runs and
    ``=off`` runs): medians of vs_mpi per mode, the ring and Rabenseifner over all the runs,
    MPI's time over the single copy's runs, and the single copy's ratio in each run."""
    one, mpi, _ = ratios(single)
    other = ratios(window)[0]
    lines = ["| size (B) | MPI (µs) | `shm`, single copy | `shm`, window copy | `ring` | "
             "`recursive_halving` | single copy, per run |",
             "|---:|---:|---:|---:|---:|---:|---|"]
    for size in sorted(one):
        both = {a: one[size].get(a, []) + other.get(size, {}).get(a, [])
                for a in ("ring", "recursive_halving")}
        lines.append(
            f"| {size_label(size)} | {statistics.median(mpi[size]):.1f} | "
            f"**{statistics.median(one[size]['shm']):.2f}** | "
            f"{statistics.median(other[size]['shm']):.2f} | "
            f"{statistics.median(both['ring']):.2f} | "
            f"{statistics.median(both['recursive_halving']):.2f} | "
            + " / ".join(f"{x:.2f}" for x in one[size]["shm"]) + " |")
    return "\n".join(lines)


def in_place_table(paths: list[str]) -> str:
    """In place against out of place (runs with both ``--inplace`` and ``--outofplace``):
    medians of vs_mpi (each place against MPI's own call in the same place), ``auto`` with
    what it ran, and the in-place ratios of ``shm`` and the ring in each run."""
    inside, mpi, _ = ratios(paths, in_place=True)
    outside = ratios(paths)[0]
    ran: dict = defaultdict(set)
    for path in paths:
        with open(path) as f:
            for r in json.load(f)["records"]:
                if r["algorithm"].startswith("auto") and r.get("auto_choice"):
                    ran[r["size"], bool(r.get("inplace"))].add(r["auto_choice"])

    def cell(row, name):
        return median_cell(row.get(name))

    def auto(row, size, place):
        return f"{cell(row, 'auto')} ({', '.join(sorted(ran[size, place])) or '-'})"
    lines = ["| size (B) | MPI in place (µs) | in place: `shm` | `ring` | `recursive_halving` | "
             "`auto` | out of place: `shm` | `auto` | in place, per run: `shm` / `ring` |",
             "|---:|---:|---:|---:|---:|---|---:|---|---|"]
    for size in sorted(inside):
        row, out = inside[size], outside.get(size, {})
        runs = ", ".join(f"{a:.2f} / {b:.2f}" for a, b in zip(row["shm"], row["ring"]))
        lines.append(f"| {size_label(size)} | {statistics.median(mpi[size]):.1f} | "
                     f"{cell(row, 'shm')} | {cell(row, 'ring')} | "
                     f"{cell(row, 'recursive_halving')} | {auto(row, size, True)} | "
                     f"{cell(out, 'shm')} | {auto(out, size, False)} | {runs} |")
    return "\n".join(lines)


def before_after_table(before: list[str], after: list[str]) -> str:
    """What a change did: the median vs_mpi of each algorithm in runs of the tree before it and
    of the tree after it (the runs taken in turns), per size, and MPI's median time in each."""
    old, old_mpi, _ = ratios(before)
    new, new_mpi, _ = ratios(after)
    names = sorted({a for row in new.values() for a in row}, key=lambda a: (a == "auto", a))
    lines = ["| size (B) | MPI before / after (µs) | "
             + " | ".join(f"`{a}` before / after" for a in names) + " |",
             "|---:|---:|" + "---:|" * len(names)]

    def cell(rows, size, name):
        return median_cell(rows.get(size, {}).get(name))
    for size in sorted(new):
        lines.append(f"| {size_label(size)} | {statistics.median(old_mpi[size]):.0f} / "
                     f"{statistics.median(new_mpi[size]):.0f} | "
                     + " | ".join(f"{cell(old, size, a)} / **{cell(new, size, a)}**"
                                  for a in names) + " |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", nargs="+", help="mpicoll bench --json files")
    ap.add_argument("--persistent", nargs="*", default=[],
                    help="mpicoll bench --persistent --json files of the same sizes")
    ap.add_argument("--shm-single", nargs="+", metavar="JSON",
                    help="instead: shm's single-copy table; runs with MPICOLL_SHM_SINGLE_COPY="
                         "auto, then --shm-window runs with =off")
    ap.add_argument("--shm-window", nargs="+", metavar="JSON", default=[])
    ap.add_argument("--in-place", nargs="+", metavar="JSON",
                    help="instead: in place against out of place (runs with --inplace "
                         "--outofplace)")
    ap.add_argument("--before", nargs="+", metavar="JSON",
                    help="instead: a change's effect; runs of the tree before it, then --after "
                         "runs of the tree with it")
    ap.add_argument("--after", nargs="+", metavar="JSON", default=[])
    args = ap.parse_args(argv)
    if args.before:
        print(before_after_table(args.before, args.after))
    elif args.in_place:
        print(in_place_table(args.in_place))
    elif args.shm_single:
        print(shm_single_table(args.shm_single, args.shm_window))
    elif args.runs:
        print(table(args.runs, args.persistent))
    else:
        ap.error("give --runs, --shm-single and --shm-window, --in-place, or --before and "
                 "--after")


if __name__ == "__main__":
    main()
