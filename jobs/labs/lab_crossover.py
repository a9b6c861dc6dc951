"""Lab 1 "sweep" of seed 000: the latency and bandwidth regimes of all-reduce, and their crossover.

    python jobs/labs/lab_crossover.py [--json FILE] [--png FILE] [--measure]

The seed: at N = 8, L = 2 us per hop and B = 25 GB/s, the ring's latency term 2(N-1).L = 28 us
stays flat while its bandwidth term 2(N-1)/N.D/B grows with D; they cross near N.L.B = 400 KB.
Below it the latency-optimal trees win, above it the ring: "trees below, rings above", which is
what NCCL's tuner decides per message size.

Here the timed executor runs mpicoll's own schedules -- ring, recursive doubling and binomial
all-reduce -- on the ``flat`` fabric with the seed's numbers (one non-blocking switch, 2 us,
25 GB/s), for D = 1 KB .. 4 GB. It prints the ring's critical path split into latency and
transfer (the seed's two terms), each algorithm's time, and the smallest size from which the
ring beats both trees. ``--measure`` also runs ``jobs/experiments/crossover.py`` on this machine
(``mpiexec -n 4``, the shipped cost profile) and prints its measured crossover beside the
model's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from lab_common import claim, crossover, mpiexec, parser, save_figure, write_json

from mpicoll.simulators import fabric, timed

N, L, B = 8, 2e-6, 25e9
TREES = ("recursive_doubling", "binomial")
SIZES = [1000 * 4 ** k for k in range(12)]          # 1 KB .. 4 GB


def measure(root: Path) -> dict | None:
    """jobs/experiments/crossover.py on this machine, mpiexec -n 4; its crossover.json, or None."""
    launcher = mpiexec()
    if not launcher:
        print("# no mpiexec: --measure skipped", file=sys.stderr)
        return None
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(
            [launcher, "-n", "4", sys.executable, "-m", "mpi4py",
             str(root / "jobs/experiments/crossover.py"),
             "--outdir", tmp, "--profile", str(root / "mpicoll/profiles/default.json"),
             "-b", "1K", "-e", "4M", "-f", "4"], capture_output=True, text=True, timeout=600)
        path = Path(tmp) / "crossover.json"
        if proc.returncode != 0 or not path.exists():
            print(f"# --measure failed: {proc.stderr[-2000:]}", file=sys.stderr)
            return None
        return json.loads(path.read_text())


def main(argv=None) -> int:
    ap = parser(__doc__, png="time against size")
    ap.add_argument("--measure", action="store_true",
                    help="also measure this machine (mpiexec -n 4 jobs/experiments/crossover.py)")
    args = ap.parse_args(argv)
    fab = fabric.preset("flat", 1, N, alpha=L, bandwidth=B)
    print(f"# fabric: {fab.describe()}; N = {N}")
    times = {a: [] for a in ("ring",) + TREES}
    terms = []
    print("#          D   ring latency   ring transfer   regime        ring (us)  "
          "rec.doubling   binomial")
    for D in SIZES:
        for a in times:
            r = timed.simulate("allreduce", a, fab, D, itemsize=1)
            times[a].append(r.time)
            if a == "ring":
                lat, xfer = r.critical["latency"], r.critical["transfer"]
                terms.append({"D": D, "latency_s": lat, "transfer_s": xfer})
        regime = "latency" if lat > xfer else "bandwidth"
        print(f"# {D:>10.0e} {lat * 1e6:>12.1f}us {xfer * 1e6:>13.1f}us   {regime:<9}-bound "
              f"{times['ring'][-1] * 1e6:>10.1f} {times['recursive_doubling'][-1] * 1e6:>12.1f} "
              f"{times['binomial'][-1] * 1e6:>10.1f}")
    x = crossover(SIZES, times["ring"], [times[t] for t in TREES])
    fine = [int(1e5 * 1.02 ** k) for k in range(0, 120)]          # 100 KB .. ~1 MB, 2 % apart
    runs = {a: [timed.simulate("allreduce", a, fab, D, itemsize=1) for D in fine]
            for a in ("ring",) + TREES}
    equal = next(D for D, r in zip(fine, runs["ring"])
                 if r.critical["transfer"] >= r.critical["latency"])
    fine_x = crossover(fine, [r.time for r in runs["ring"]],
                       [[r.time for r in runs[t]] for t in TREES])
    print(f"crossover ~ N.L.B = {N * L * B:.3g} B   [seed: ~4e5 B, trees below, rings above]")
    print(f"on a 2 % grid: the ring's bandwidth term overtakes its latency term at {equal:.3g} B;"
          f" the ring beats both trees from {fine_x:.3g} B (on the grid above: from {x:.0e} B)")
    measured = measure(Path(__file__).resolve().parents[2]) if args.measure else None
    def size(b) -> str:
        return "not reached up to 4 MiB" if b is None else f"{b:.0f} B"

    if measured:
        print(f"this machine ({measured['nranks']} ranks on {measured['nodes']} node(s), "
              f"jobs/experiments/crossover.py, 1 KiB .. 4 MiB): measured crossover "
              f"{size(measured.get('measured_crossover'))}; cost model "
              f"{size(measured.get('model_crossover'))}; N.alpha/beta "
              f"{size(measured.get('n_alpha_over_beta'))}")
    write_json(args.json, {"N": N, "L": L, "B": B, "sizes": SIZES,
                           "times_s": times, "ring_terms": terms, "crossover_grid": x,
                           "crossover_fine": fine_x, "terms_equal": equal, "NLB": N * L * B,
                           "measured": measured and {k: measured.get(k) for k in (
                               "nranks", "nodes", "measured_crossover", "model_crossover",
                               "n_alpha_over_beta")}})

    def draw(plt):
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for a in times:
            ax.plot(SIZES, [t * 1e6 for t in times[a]], "o-", ms=3, label=f"{a} (simulated)")
        ax.plot(SIZES, [t["latency_s"] * 1e6 for t in terms], "k:", lw=1,
                label="ring latency term")
        ax.plot(SIZES, [t["transfer_s"] * 1e6 for t in terms], "k--", lw=1,
                label="ring bandwidth term")
        ax.axvline(N * L * B, color="red", ls="-.", lw=1, label="N.L.B = 400 KB")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("all-reduce size D (bytes)")
        ax.set_ylabel("time (us)")
        ax.set_title("N = 8, L = 2 us, B = 25 GB/s (flat fabric, timed executor)", fontsize=9)
        ax.legend(fontsize=7)
        return fig
    save_figure(args.png, draw)
    claim("lab_crossover", "ring latency 28 us flat, crossover ~ N.L.B = 400 KB",
          f"ring latency {terms[0]['latency_s'] * 1e6:.0f} us, its two terms equal at "
          f"{equal / 1e3:.0f} KB, ring beats both trees from "
          f"{fine_x / 1e3:.0f} KB (simulated)"
          + (f"; this machine (N={measured['nranks']}) measured: "
             f"{size(measured.get('measured_crossover'))}" if measured else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
