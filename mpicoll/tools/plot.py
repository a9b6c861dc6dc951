"""``mpicoll plot RESULTS.json [-o FIG.png]``: time and bus bandwidth against size.

One line per algorithm; ``mpi`` (the MPI library's own collective, the reference) in black;
log axes; a dotted vertical line and a label where the fastest of mpicoll's algorithms changes
(the measured crossovers). The figure goes next to the JSON (``r.json`` -> ``r.png``) unless
``-o`` names another file (its folder must exist). Also draws what ``mpicoll simulate --json``
writes. Needs matplotlib (``pip install .[plot]``).
"""

from __future__ import annotations

import sys
from pathlib import Path

from .cli import Parser, prepare_output, read_bench_json

__all__ = ["main", "plot", "best_by_size", "crossover", "save_figure"]


def best_by_size(records: list[dict], inplace: bool = False) -> list[tuple[int, str]]:
    """(size, fastest algorithm) for each size, among mpicoll's own algorithms."""
    by_size: dict[int, dict[str, float]] = {}
    for r in records:
        if r["inplace"] == inplace and r["algorithm"] not in ("mpi", "auto"):
            by_size.setdefault(r["size"], {})[r["algorithm"]] = r["time_us"]
    return [(s, min(t, key=t.get)) for s, t in sorted(by_size.items())]


def crossover(sizes: list[int], ring: list[float], trees: list[list[float]]) -> int | None:
    """Smallest size from which ring is faster than every tree at every larger size."""
    wins = [r < min(t) for r, *t in zip(ring, *trees)]
    if not wins or not wins[-1]:
        return None
    i = len(wins) - 1
    while i > 0 and wins[i - 1]:
        i -= 1
    return sizes[i]


def save_figure(path: Path | None, draw, dpi: int = 100) -> None:
    """``draw(plt)`` returns a figure, saved to ``path`` (its folder made); no path: skipped;
    no matplotlib: a warning. The PNG carries no software stamp, so a rerun that draws the
    same figure writes the same bytes. (The one way the labs and experiments save a plot.)"""
    if path is None:
        return
    try:
        import matplotlib
    except ImportError:
        print(f"# no matplotlib: skipped {path} (pip install matplotlib)", file=sys.stderr)
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig = draw(plt)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, metadata={"Software": None})
    plt.close(fig)
    print(f"# wrote {path}", flush=True)


def plot(results: dict, output: str, title: str | None = None) -> list[tuple[int, str, str]]:
    """Draw the figure; returns the crossovers (size, old winner, new winner)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = results["records"]
    inplace = all(r["inplace"] for r in records)
    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(13, 5))
    names = list(dict.fromkeys(r["algorithm"] for r in records))
    for name in names:
        rows = sorted((r for r in records if r["algorithm"] == name and r["inplace"] == inplace),
                      key=lambda r: r["size"])
        sizes = [r["size"] for r in rows]
        style = dict(color="black", lw=2.5, ls="--") if name == "mpi" else dict(marker="o", ms=3)
        label = "mpi (MPI library)" if name == "mpi" else name
        ax_t.plot(sizes, [r["time_us"] for r in rows], label=label, **style)
        if any(r["busbw"] > 0 for r in rows):          # 0 on one rank: nothing crosses a bus
            ax_b.plot(sizes, [r["busbw"] for r in rows], label=label, **style)
    best = best_by_size(records, inplace)
    cross = [(best[i][0], best[i - 1][1], best[i][1]) for i in range(1, len(best))
             if best[i][1] != best[i - 1][1]]
    for size, _, new in cross:
        for ax in (ax_t, ax_b):
            ax.axvline(size, color="grey", ls=":", lw=1)
        ax_t.annotate(f"→ {new}", (size, ax_t.get_ylim()[1]), rotation=90, va="top",
                      ha="right", fontsize=7, color="grey")
    for ax, ylabel in ((ax_t, "time (µs), median"), (ax_b, "bus bandwidth (GB/s)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    ax_b.legend(fontsize=8, loc="upper left")
    fig.suptitle(title or f"{results.get('collective', 'allreduce')}: {results['nranks']} ranks, "
                 f"{results['nodes']} node(s), {results.get('dtype', '')} "
                 f"{results.get('op', '')} — {results.get('mpi_library', '')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(output, dpi=110)
    plt.close(fig)
    return cross


def figure_format(output: str) -> str | None:
    """Why matplotlib can't write ``output`` (not installed, or no such file format), else
    None; asked before any drawing."""
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        return "needs matplotlib (pip install .[plot])"
    formats = FigureCanvasBase.get_supported_filetypes()
    suffix = Path(output).suffix.lstrip(".").lower()
    if suffix not in formats:
        return (f"-o {output}: {'no file format given' if not suffix else repr(suffix) + ' is not a figure format'}"
                f"; name a file ending in one of {', '.join('.' + f for f in sorted(formats))}")
    return None


def main(argv=None) -> int:
    ap = Parser("mpicoll plot", __doc__)
    ap.add_argument("results", help="JSON written by mpicoll bench --json")
    ap.add_argument("-o", "--output",
                    help="the figure (PNG, PDF, SVG ...; default: the JSON's path with .png)")
    ap.add_argument("--title", help="the figure's title (default: what and where was measured)")
    args = ap.parse_args(argv)
    args.output = args.output or str(Path(args.results).with_suffix(".png"))
    try:
        results = read_bench_json(args.results, simulated=True)
    except ValueError as e:
        ap.error(str(e))
    problem = figure_format(args.output) or prepare_output(args.output, create=False)
    if problem:
        ap.error(problem)
    for size, old, new in plot(results, args.output, args.title):
        print(f"crossover: {new} overtakes {old} at {size} B")
    print(f"wrote {args.output}")
    return 0
