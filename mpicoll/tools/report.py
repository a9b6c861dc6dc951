"""``mpicoll report R.json``: a bench JSON as markdown tables (median time and vs_mpi by size).

One row per size, one column per algorithm; the fastest of mpicoll's algorithms at each size is
in bold, ``auto`` shows which algorithm it ran. ``docs/make-results.sh`` pastes these into
docs/results.md. Simulator JSON (``mpicoll simulate --json``) is refused: it has no MPI times.
"""

from __future__ import annotations

from .cli import Parser, read_bench_json

__all__ = ["main", "markdown"]


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
    ap.add_argument("results", nargs="+", help="JSON files written by mpicoll bench --json")
    args = ap.parse_args(argv)
    try:
        results = [read_bench_json(path) for path in args.results]
    except ValueError as e:
        ap.error(str(e))
    for res in results:
        print(markdown(res))
    return 0
