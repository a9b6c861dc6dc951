"""Lab 1 of the seed: the ring all-reduce traced chunk by chunk, from the project's own schedules.

    python jobs/labs/lab_ring_trace.py [-N 4] [--json FILE] [--png FILE]
    python -m mpicoll trace ring -N 4 --values          # the same trace, from the command line

The seed (000, "Lab 1") simulates a ring of N = 4 GPUs, GPU g contributing g+1 to each of four
8-byte chunks: three reduce-scatter steps leave GPU i with the full sum (10) of chunk i, three
all-gather steps spread it, 6 steps in all, and every link carries 48 bytes, 2(N-1)/N of the
32-byte vector. Here the in-process executor runs mpicoll's ring schedules
(``mpicoll.tools.trace.render_values``); the lab prints that trace, compares it line by line with
the seed's printed output, and sweeps N to check bytes per link against 2(N-1)/N.D.
"""

from __future__ import annotations

import re

from lab_common import claim, parser, save_figure, write_json

from mpicoll.tools.trace import render_values

# The seed's printed output of `python3 ring_ar.py demo` (seed 000, Lab 1), verbatim.
SEED_DEMO = """\
ring all-reduce, N=4: data=32B = 4 chunks x 8B
  RS0: G0->G1 c3=1  G1->G2 c0=2  G2->G3 c1=3  G3->G0 c2=4
  RS1: G0->G1 c2=5  G1->G2 c3=3  G2->G3 c0=5  G3->G0 c1=7
  RS2: G0->G1 c1=8  G1->G2 c2=7  G2->G3 c3=6  G3->G0 c0=9
  -> GPU i owns the FULL sum of chunk i: [10, 10, 10, 10]
  AG0: G0->G1 c0=10  G1->G2 c1=10  G2->G3 c2=10  G3->G0 c3=10
  AG1: G0->G1 c3=10  G1->G2 c0=10  G2->G3 c1=10  G3->G0 c2=10
  AG2: G0->G1 c2=10  G1->G2 c3=10  G2->G3 c0=10  G3->G0 c1=10
  -> the total everywhere: True; steps = 6; bytes/link = 48 (theory 2(N-1)/N*D = 48)
"""
SUMMARY = re.compile(r"steps = (\d+); bytes/link = (\d+) \(theory 2\(N-1\)/N\*D = (\d+)\)")


def summary(trace: str) -> tuple[int, int, int]:
    """(steps, bytes per link, theory) from a trace's last line."""
    steps, link, theory = SUMMARY.search(trace).groups()
    return int(steps), int(link), int(theory)


def main(argv=None) -> int:
    ap = parser(__doc__, png="bytes per link against N")
    ap.add_argument("-N", "--nranks", type=int, default=4)
    ap.add_argument("--sweep", type=int, default=16, help="sweep N = 2 .. this (default 16)")
    args = ap.parse_args(argv)

    ours = render_values(args.nranks)
    print(ours, end="")
    same = [a == b for a, b in zip(ours.splitlines(), SEED_DEMO.splitlines())]
    if args.nranks == 4:
        print(f"# against the seed's printed demo: {sum(same)}/{len(SEED_DEMO.splitlines())} "
              "lines identical")
        for a, b in zip(ours.splitlines(), SEED_DEMO.splitlines()):
            if a != b:
                print(f"#   seed: {b}\n#   ours: {a}")

    sweep = []
    print("#  N  data B  steps  bytes/link  2(N-1)/N*D")
    for n in range(2, args.sweep + 1):
        steps, link, theory = summary(render_values(n))
        sweep.append({"N": n, "data_bytes": 8 * n, "steps": steps, "bytes_per_link": link,
                      "theory": theory})
        print(f"# {n:>2} {8 * n:>7} {steps:>6} {link:>11} {theory:>11}")
    write_json(args.json, {"N": args.nranks, "trace": ours.splitlines(),
                           "seed_demo": SEED_DEMO.splitlines(),
                           "identical_lines": sum(same) if args.nranks == 4 else None,
                           "sweep": sweep})

    steps = [line.strip().split(": ", 1) for line in ours.splitlines()
             if line.startswith(("  RS", "  AG"))]
    total = args.nranks * (args.nranks + 1) / 2

    def draw(plt):
        fig, (grid, ax) = plt.subplots(1, 2, figsize=(11, 3.8),
                                       gridspec_kw={"width_ratios": [1.2, 1]})
        # left: every message of the trace, one row per step, one column per link
        values = [[float(m.split("=")[1]) for m in msgs.split("  ")] for _, msgs in steps]
        if values:
            grid.imshow([[v / total for v in row] for row in values], cmap="Blues",
                        vmin=0, vmax=1.4, aspect="auto")
            for y, (_, msgs) in enumerate(steps):
                for x, m in enumerate(msgs.split("  ")):
                    grid.text(x, y, m.split(" ")[1] if " " in m else m, ha="center",
                              va="center", fontsize=8)
            links = [m.split(" ")[0] for m in steps[0][1].split("  ")]
            grid.set_xticks(range(len(links)), links, fontsize=8)
            grid.set_yticks(range(len(steps)), [name for name, _ in steps], fontsize=8)
        grid.set_title(f"N={args.nranks}: chunk=value sent on each link (shade: share of "
                       f"the sum {total:g})", fontsize=9)
        ns = [r["N"] for r in sweep]
        ax.plot(ns, [r["bytes_per_link"] / r["data_bytes"] for r in sweep], "o",
                label="measured (in-process executor)")
        ax.plot(ns, [2 * (n - 1) / n for n in ns], "-", label="2(N-1)/N")
        ax.axhline(2, color="gray", ls=":", lw=1)
        ax.set_xlabel("N (ranks in the ring)")
        ax.set_ylabel("bytes per link / D")
        ax.set_title("each link carries 2(N-1)/N of the vector", fontsize=9)
        ax.legend()
        return fig
    save_figure(args.png, draw)

    steps, link, theory = summary(ours)
    lines = (f", {sum(same)}/{len(SEED_DEMO.splitlines())} lines as the seed's demo"
             if args.nranks == 4 else "")
    claim("lab_ring_trace",
          "N=4: steps = 6, bytes/link = 48 = 2(N-1)/N*32 B, sum 10 everywhere",
          f"N={args.nranks}: steps = {steps}, bytes/link = {link} (theory {theory})" + lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
