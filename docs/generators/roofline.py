"""Roofline-style plot: all-reduce bus bandwidth against size, under this machine's memory
bandwidth (issue 12).

    mpiexec -n 2 python -m mpicoll bench -b 1K -e 64M -f 4 --json bench.json
    python jobs/experiments/stream.py --json stream.json
    python docs/generators/roofline.py bench.json stream.json -o roofline.png

One line per algorithm of the bench run (``mpi``, the MPI library's own, in black), busbw =
size / median time x ``registry.bus_factor`` (2(N-1)/N for all-reduce), against horizontal
lines at the memory-bandwidth ceiling ``jobs/experiments/stream.py`` measured (the best of its rows) and at
one thread's figure, with the caches' sizes marked: a message that fits in the cache is not
bound by memory. Prints, per size, the best mpicoll algorithm's and MPI's busbw as a fraction
of the ceiling. On one node every byte on the "bus" goes through memory (a copy into and out of
shared memory, or one copy between processes), so the ceiling is a roof, not a prediction.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mpicoll.registry import bus_factor


def busbw(record: dict, nranks: int) -> float:
    """GB/s on the bus: the record's size over its median time, times the bus factor."""
    return record["size"] / (record["time_us"] * 1e-6) / 1e9 * bus_factor(
        record["collective"], nranks)


def table(bench: dict, stream: dict) -> list[dict]:
    """Per size: the best mpicoll algorithm, its busbw, MPI's, and both over the ceiling."""
    n, ceiling = bench["nranks"], stream["ceiling_GBps"]
    by_size: dict = {}
    for r in bench["records"]:
        if not r["inplace"]:
            by_size.setdefault(r["size"], {})[r["algorithm"]] = busbw(r, n)
    rows = []
    for size, bw in sorted(by_size.items()):
        ours = {a: b for a, b in bw.items() if a not in ("mpi", "auto")}
        best = max(ours, key=ours.get) if ours else None
        rows.append({"size": size, "best": best, "best_GBps": ours.get(best),
                     "mpi_GBps": bw.get("mpi"), "auto_GBps": bw.get("auto"),
                     "best_of_ceiling": ours[best] / ceiling if best else None,
                     "mpi_of_ceiling": bw["mpi"] / ceiling if "mpi" in bw else None})
    return rows


def draw(bench: dict, stream: dict, output: Path, title: str | None = None) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = bench["nranks"]
    fig, ax = plt.subplots(figsize=(10, 5))
    for name in dict.fromkeys(r["algorithm"] for r in bench["records"]):
        rows = sorted((r for r in bench["records"] if r["algorithm"] == name
                       and not r["inplace"]), key=lambda r: r["size"])
        style = dict(color="black", lw=2.5, ls="--") if name == "mpi" else dict(marker="o", ms=3)
        ax.plot([r["size"] for r in rows], [busbw(r, n) for r in rows],
                label="mpi (MPI library)" if name == "mpi" else name, **style)
    ax.axhline(stream["ceiling_GBps"], color="red", lw=2,
               label=f"memory bandwidth {stream['ceiling_GBps']:.1f} GB/s "
                     f"(STREAM-like, {stream['ceiling_kernel']})")
    ax.axhline(stream["one_thread_GBps"], color="red", lw=1, ls=":",
               label=f"one thread {stream['one_thread_GBps']:.1f} GB/s "
                     f"({stream['one_thread_kernel']})")
    if stream.get("last_level_cache"):
        ax.axvline(stream["last_level_cache"], color="grey", ls="-.", lw=1,
                   label=f"last-level cache {stream['last_level_cache'] / 2**20:g} MiB")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s), median")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.set_title(title or f"{bench.get('collective', 'allreduce')}, {n} ranks on "
                 f"{bench['nodes']} node(s), {bench.get('dtype', '')}: busbw against memory "
                 f"bandwidth\n(bench {bench.get('date', '?')[:16]}; STREAM at load average "
                 f"{stream.get('load_average', float('nan')):.1f})", fontsize=9)
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=110, metadata={"Software": None})
    plt.close(fig)
    print(f"# wrote {output}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("bench", type=Path, help="a `mpicoll bench --json` file")
    ap.add_argument("stream", type=Path, help="a `jobs/experiments/stream.py --json` file")
    ap.add_argument("-o", "--output", type=Path, help="the PNG (default: next to the bench "
                    "JSON, NAME-roofline.png)")
    ap.add_argument("--title")
    args = ap.parse_args(argv)
    bench = json.loads(args.bench.read_text())
    stream = json.loads(args.stream.read_text())
    if bench["nranks"] < 2:
        ap.error(f"{args.bench}: one rank moves nothing over a bus (busbw 0); bench at N >= 2")
    print(f"# {args.bench}: {bench['nranks']} ranks, {bench['nodes']} node(s), "
          f"{bench.get('date', '')}; {args.stream}: ceiling {stream['ceiling_GBps']:.1f} GB/s, "
          f"one thread {stream['one_thread_GBps']:.1f} GB/s, load average "
          f"{stream.get('load_average', float('nan')):.1f}")
    print("#       size  best mpicoll          busbw  of ceiling    mpi busbw  of ceiling")
    for r in table(bench, stream):
        best = f"{r['best']:<18} {r['best_GBps']:>8.3f} {r['best_of_ceiling']:>10.1%}" \
            if r["best"] else f"{'-':<18} {'':>8} {'':>10}"
        mpi = f"{r['mpi_GBps']:>12.3f} {r['mpi_of_ceiling']:>10.1%}" if r["mpi_GBps"] else ""
        print(f"  {r['size']:>10}  {best} {mpi}")
    draw(bench, stream, args.output or args.bench.with_name(args.bench.stem + "-roofline.png"),
         args.title)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
