"""Lab 3 extended: goodput at 25,000 GPUs for checkpoint-restart, in-place shrink and hot spares.

    python jobs/labs/lab_elastic.py [--recovery S] [--spare-recovery S] [--json FILE] [--png FILE]

First the seed's numbers (lab_checkpoint's arithmetic): 25,000 GPUs, a 5-year MTBF each,
lambda = 13.7 failures a day; W = 240 s, R = 900 s, T* = sqrt(2W/lambda) = 29.0 min.

Then goodput, the fraction of the fleet's GPU time that is useful training, 1 / (1 + overhead),
with Daly's exact overhead for exponential failures, e^(R/M).(e^((T+W)/M) - 1).M/T - 1
(M = 1/lambda), at its best interval T, times the share of the fleet that trains:

* **checkpoint-restart**: W = 240 s to disk, R = 900 s to restart the job (the seed's);
* **in-place shrink** (``mpicoll.elastic.run``): W = an in-memory commit of the GPU's state,
  R = the recovery measured on this machine (docs/elastic.md: SIGKILL to the first step on the
  survivors' communicator) + the state's broadcast time at the fabric's bandwidth; a failure
  takes a node (8 GPUs) out until it is repaired (``--repair-hours``), so lambda.H nodes are
  missing on average: the training share is 1 - lambda.H.8 / N;
* **hot spares** (``spares=S``): the same W and R (a spare receives a survivor's state), the
  fleet trains whole, and S spare nodes idle: the share is N / (N + 8S), with S the Poisson
  99.9 % quantile of the failures during one repair time (``--repair-hours``).

The state: the seed's ~500B-parameter model with ~16 bytes/param (8 TB), sharded over the
fleet: 320 MB per GPU, copied in memory at ``--copy-gbs`` (the commit) and sent at 50 GB/s
(one rail, the seed's fabric) to the rank that needs it.
"""

from __future__ import annotations

import math

import numpy as np
from lab_checkpoint import exact, failure_rate, first_order, young
from lab_common import claim, parser, save_figure, write_json

GPUS, MTBF_YEARS, W_DISK, R_RESTART = 25_000, 5.0, 240.0, 900.0
STATE_BYTES = 500e9 * 16                    # the seed's ~500B parameters, ~16 bytes each
FABRIC_BYTES_PER_S = 50e9                   # one rail (the seed's ~50 GB/s)
GPUS_PER_NODE = 8


def best(W: float, R: float, lam: float) -> tuple[float, float]:
    """(T, overhead): the interval between commits with the least exact overhead (a grid of
    1,000 log-spaced intervals around Young's sqrt(2W/lambda))."""
    grid = young(W, lam) * np.logspace(-1.5, 1.5, 1000)
    overhead = exact(grid, W, R, lam)
    i = int(np.argmin(overhead))
    return float(grid[i]), float(overhead[i])


def spares_needed(lam: float, repair_s: float, quantile: float = 0.999) -> int:
    """Spare nodes that cover the failures of one repair time with ``quantile`` probability
    (Poisson with mean lambda.H)."""
    mean = lam * repair_s
    k, term = 0, math.exp(-mean)
    total = term
    while total < quantile:
        k += 1
        term *= mean / k
        total += term
    return k


def strategies(*, recovery_s: float, spare_recovery_s: float, repair_hours: float,
               copy_gbs: float, gpus: int = GPUS, mtbf_years: float = MTBF_YEARS) -> list[dict]:
    """The goodput rows (see the module's doc)."""
    lam = failure_rate(gpus, mtbf_years)
    shard = STATE_BYTES / gpus
    broadcast = shard / FABRIC_BYTES_PER_S
    commit = shard / (copy_gbs * 1e9)
    repair = repair_hours * 3600.0
    missing_nodes = lam * repair
    spares = spares_needed(lam, repair)
    rows = []
    for name, W, R, share in (
            ("checkpoint-restart", W_DISK, R_RESTART, 1.0),
            ("in-place shrink", commit, recovery_s + broadcast,
             1.0 - missing_nodes * GPUS_PER_NODE / gpus),
            ("hot spares", commit, spare_recovery_s + broadcast,
             gpus / (gpus + spares * GPUS_PER_NODE))):
        T, overhead = best(W, R, lam)
        rows.append({"strategy": name, "W_s": W, "R_s": R, "T_s": T, "overhead": overhead,
                     "training_share": share, "goodput": share / (1.0 + overhead),
                     "lost_per_failure_s": T / 2 + R})
    rows[2]["spare_nodes"] = spares
    rows[1]["missing_nodes"] = missing_nodes
    return rows


def main(argv=None) -> int:
    ap = parser(__doc__, png="goodput against the interval between commits")
    ap.add_argument("--recovery", type=float, default=1.08, metavar="S",
                    help="seconds from a death to the first step on the survivors (default "
                         "1.08: mpicoll.torch.elastic, N = 4 -> 3, docs/elastic.md)")
    ap.add_argument("--spare-recovery", type=float, default=1.31, metavar="S",
                    help="the same when a spare joins (default 1.31, docs/elastic.md)")
    ap.add_argument("--repair-hours", type=float, default=24.0,
                    help="hours until a failed node is back (default 24)")
    ap.add_argument("--copy-gbs", type=float, default=10.0,
                    help="in-memory commit bandwidth, GB/s (default 10: docs/elastic.md "
                         "measured 3-28 GiB/s)")
    args = ap.parse_args(argv)

    lam = failure_rate(GPUS, MTBF_YEARS)
    t_star = young(W_DISK, lam)
    print(f"lambda = {lam * 86400:.1f} failures/day (one every {1 / lam / 60:.0f} min); "
          f"checkpoint-restart T* = sqrt(2W/lambda) = {t_star / 60:.1f} min   "
          "[seed: 13.7/day, every 105 min, 29.0 min]")
    print(f"first-order overhead W/T + lambda(T/2 + R) at T = 30 min: "
          f"{first_order(1800.0, W_DISK, R_RESTART, lam) * 100:.2f} %   [seed: 41.87 %]; "
          f"below, Daly's exact overhead (failures during writes and restarts counted)")
    rows = strategies(recovery_s=args.recovery, spare_recovery_s=args.spare_recovery,
                      repair_hours=args.repair_hours, copy_gbs=args.copy_gbs)
    print("| strategy | W (s) | R (s) | best T | overhead | training share | goodput |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        T = f"{r['T_s'] / 60:.1f} min" if r["T_s"] >= 60 else f"{r['T_s']:.1f} s"
        print(f"| {r['strategy']} | {r['W_s']:.3g} | {r['R_s']:.3g} | {T} | "
              f"{r['overhead'] * 100:.2f} % | {r['training_share'] * 100:.2f} % | "
              f"{r['goodput'] * 100:.2f} % |")
    print(f"# shrink: {rows[1]['missing_nodes']:.1f} nodes missing on average "
          f"({args.repair_hours:g} h repairs); spares: {rows[2]['spare_nodes']} nodes "
          f"(99.9 % of the failures of one repair time)")
    write_json(args.json, {"gpus": GPUS, "mtbf_years": MTBF_YEARS,
                           "failures_per_day": lam * 86400, "T_star_s": t_star,
                           "args": vars(args) | {"json": None, "png": None}, "rows": rows})

    def draw(plt):
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for r in rows:
            grid = r["T_s"] * np.logspace(-1.5, 1.5, 300)
            ax.plot(grid / 60, r["training_share"] / (1 + exact(grid, r["W_s"], r["R_s"], lam))
                    * 100, label=f"{r['strategy']}: best {r['goodput'] * 100:.1f} %")
        ax.axvline(t_star / 60, ls="--", color="gray", lw=1, label=f"T* = {t_star / 60:.1f} min")
        ax.set_xscale("log")
        ax.set_ylim(50, 100)
        ax.set_xlabel("interval between checkpoints / commits (min)")
        ax.set_ylabel("goodput (% of the fleet's GPU time)")
        ax.set_title("25,000 GPUs, 5-year MTBF: 13.7 failures a day")
        ax.legend(fontsize=7, loc="lower left")
        return fig
    save_figure(args.png, draw)
    claim("lab_elastic", "13.7 failures/day, T* = 29.0 min (checkpoint-restart)",
          f"{lam * 86400:.1f} failures/day, T* = {t_star / 60:.1f} min; goodput "
          + ", ".join(f"{r['strategy']} {r['goodput'] * 100:.1f} %" for r in rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
