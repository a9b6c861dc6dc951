"""Seed 000's synchrony tax: one slow GPU in 1,000 makes every step of a large job slow.

    python jobs/labs/lab_straggler.py [--samples 200] [--max-n 24576] [--json FILE] [--png FILE]

The seed: give each GPU a 0.1 % chance of a 2x slow step (thermal throttling, congestion). At
N = 25,000 the expected number of stragglers per step is 25, and P(no straggler) =
0.999^25000 = e^-25 = 1e-11: the fleet always runs at the tail, so a per-GPU p99.9 of 2x the
median becomes the fleet's median step. The all-reduce is a barrier in disguise.

Here: the numbers above, then a Monte Carlo over the timed executor. Each sample gives every
rank a compute time of 100 ms, doubled with probability 0.001, passed as the rank's delay before
one 256 MiB all-reduce (mpicoll's hierarchical schedule on the ``dgx-h100-textbook`` fabric, N/8 nodes of
8). The step time is when the last rank finishes. For N = 8 .. 24,576 the lab prints the share
of steps with a straggler (against 1 - 0.999^N) and the p50 and p99 step time, against the
straggler-free step.
"""

from __future__ import annotations

import math

import numpy as np
from lab_common import claim, parser, save_figure, write_json

from mpicoll.simulators import fabric, timed

P_SLOW, COMPUTE, NBYTES = 0.001, 0.100, 256 << 20
ALGORITHM = "hierarchical"


def step_time(n: int, delay) -> float:
    fab = fabric.preset("dgx-h100-textbook", max(1, n // 8), min(n, 8))
    return timed.simulate("allreduce", ALGORITHM, fab, NBYTES, delay=delay).time


def main(argv=None) -> int:
    ap = parser(__doc__, png="step time against N")
    ap.add_argument("--samples", type=int, default=200, help="steps per N (fewer at the top)")
    ap.add_argument("--max-n", type=int, default=24576)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)

    n = 25_000
    print(f"N = {n}: expected stragglers per step {n * P_SLOW:.0f}; P(no straggler) = "
          f"0.999^{n} = {(1 - P_SLOW) ** n:.2e} = e^{n * math.log(1 - P_SLOW):.2f}   "
          "[seed: 25; e^-25 = 1e-11]")
    rows = []
    print("#      N  samples  steps with a straggler (1-0.999^N)   no-straggler step   p50      "
          "p99     p50/no-straggler")
    for N in [8, 64, 512, 4096, 24576]:
        if N > args.max_n:
            break
        samples = args.samples if N <= 4096 else max(20, args.samples // 5)
        rng = np.random.default_rng([args.seed, N])
        base = step_time(N, np.full(N, COMPUTE))
        times, slow = [], 0
        for _ in range(samples):
            delay = np.where(rng.random(N) < P_SLOW, 2 * COMPUTE, COMPUTE)
            slow += bool((delay > COMPUTE).any())
            times.append(step_time(N, delay))
        p50, p99 = np.percentile(times, [50, 99])
        rows.append({"N": N, "samples": samples, "with_straggler": slow / samples,
                     "analytic": 1 - (1 - P_SLOW) ** N, "base_s": base, "p50_s": float(p50),
                     "p99_s": float(p99)})
        print(f"# {N:>6} {samples:>8} {slow / samples:>14.1%} ({1 - (1 - P_SLOW) ** N:>6.1%})"
              f" {base * 1e3:>19.1f} ms {p50 * 1e3:>7.1f} {p99 * 1e3:>7.1f} ms {p50 / base:>9.2f}x")
    write_json(args.json, {"p_slow": P_SLOW, "compute_s": COMPUTE, "nbytes": NBYTES,
                           "algorithm": ALGORITHM, "fabric": "dgx-h100-textbook", "rows": rows,
                           "n25000": {"expected": n * P_SLOW,
                                      "p_none": (1 - P_SLOW) ** n}})

    def draw(plt):
        fig, ax = plt.subplots(figsize=(6.5, 4))
        ns = [r["N"] for r in rows]
        ax.plot(ns, [r["p50_s"] * 1e3 for r in rows], "o-", label="p50 step (Monte Carlo)")
        ax.plot(ns, [r["p99_s"] * 1e3 for r in rows], "s--", label="p99 step")
        ax.plot(ns, [r["base_s"] * 1e3 for r in rows], "k:", label="no straggler")
        ax.plot(ns, [(r["base_s"] + COMPUTE) * 1e3 for r in rows], "r:",
                label="one 2x straggler (per-GPU p99.9)")
        ax.set_xscale("log")
        ax.set_xlabel("N (GPUs)")
        ax.set_ylabel("step time (ms)")
        ax.set_title("0.1 % of GPUs 2x slow: the fleet's median reaches the per-GPU tail",
                     fontsize=9)
        ax.legend(fontsize=8)
        return fig
    save_figure(args.png, draw)
    top = rows[-1]
    claim("lab_straggler", "25 stragglers per step, P(none) = e^-25 = 1e-11 at N = 25,000: the "
          "fleet median is the per-GPU tail (2x)",
          f"25 per step, P(none) = {(1 - P_SLOW) ** n:.1e}; simulated N = {top['N']}: p50 step "
          f"{top['p50_s'] * 1e3:.0f} ms = {top['p50_s'] / top['base_s']:.2f}x the straggler-free "
          f"{top['base_s'] * 1e3:.0f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
