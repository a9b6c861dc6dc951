"""``mpicoll report R.json``: a bench JSON as markdown tables (median time and vs_mpi by size).

One row per size, one column per algorithm; the fastest of mpicoll's algorithms at each size is
in bold, ``auto`` shows which algorithm it ran. ``docs/make-results.sh`` pastes these into
docs/results.md. Simulator JSON (``mpicoll simulate --json``) is refused: it has no MPI times.
A stragglers file (``MPICOLL_STRAGGLERS=FILE``, ``mpicoll.stats``) is shown as a table of how
long the others waited for each rank.
"""

from __future__ import annotations

import json
from pathlib import Path

from .cli import Parser, read_bench_json

__all__ = ["main", "markdown", "stragglers"]


def stragglers(result: dict) -> str:
    """``mpicoll.stats``'s result (as ``MPICOLL_STRAGGLERS`` writes it) as a markdown table."""
    ranks = result.get("ranks", {})
    out = [f"*stragglers: over the last {result.get('calls', 0)} calls, how long each rank "
           "held the others (it arrived last, by that much)*", "",
           "| rank | calls | mean (ms) | p99 (ms) |", "|---:|---:|---:|---:|"]
    for rank in sorted(ranks, key=int):
        r = ranks[rank]
        out.append(f"| {rank} | {r['calls']} | {1e3 * r['mean']:.3f} | {1e3 * r['p99']:.3f} |")
    who = result.get("straggler")
    out += ["", f"straggler: rank {who}" if who is not None else
            "straggler: none (no rank held the others markedly longer than the rest)"]
    return "\n".join(out) + "\n"


def _stragglers_file(path: str):
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("kind") == "mpicoll-stragglers" else None


def markdown(results: dict) -> str:
    records = results["records"]
    inplace = all(r["inplace"] for r in records)
    rows = [r for r in records if r["inplace"] == inplace]
    names = list(dict.fromkeys(r["algorithm"] for r in rows))
    sizes = sorted({r["size"] for r in rows})
    at = {(r["size"], r["algorithm"]): r for r in rows}
    head = (f"{results.get('collective', 'allreduce')}, {results['nranks']} ranks, "
            f"{results['nodes']} node(s), {results.get('dtype')} {results.get('op')}, "
            f"{results.get('mpi_library')}; median µs of the slowest rank "
            f"(vs_mpi = MPI's time / this one's)")
    out = [f"*{head}*", "",
           "| size (B) | " + " | ".join(names) + " | auto ran |",
           "|---:|" + "---:|" * len(names) + "---|"]
    for s in sizes:
        own = {n: at[(s, n)]["time_us"] for n in names
               if n not in ("mpi", "auto") and (s, n) in at}
        best = min(own, key=own.get) if own else None
        cells = []
        for n in names:
            r = at.get((s, n))
            if r is None:                   # not measured at this size
                cells.append("-")
                continue
            ratio = None if n == "mpi" else r.get("vs_mpi")   # None: no mpi run (bfloat16)
            cell = f"{r['time_us']:.1f}" + ("" if ratio is None else f" ({ratio:.2f})")
            cells.append(f"**{cell}**" if n == best else cell)
        auto = at.get((s, "auto"), {}).get("auto_choice") or "-"
        out.append(f"| {s} | " + " | ".join(cells) + f" | {auto} |")
    checked = [r["wrong"] for r in records if r.get("wrong") is not None]
    verdict = (f"{sum(checked)} wrong elements" if len(checked) == len(records) else
               f"{sum(checked)} wrong elements in the {len(checked)} checked" if checked else
               "results not checked (bench --no-check)")
    out += ["", f"{len(records)} measurements, {verdict}."]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = Parser("mpicoll report", __doc__)
    ap.add_argument("results", nargs="+", help="JSON files written by mpicoll bench --json "
                    "(or by MPICOLL_STRAGGLERS)")
    args = ap.parse_args(argv)
    shown = []
    try:
        for path in args.results:
            found = _stragglers_file(path)
            shown.append(stragglers(found) if found is not None else
                         markdown(read_bench_json(path)))
    except ValueError as e:
        ap.error(str(e))
    for text in shown:
        print(text)
    return 0
