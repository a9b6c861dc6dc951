"""Lab 3 of the seed: the checkpoint interval, derived from the failure rate -- and simulated.

    python jobs/labs/lab_checkpoint.py [--json FILE] [--png FILE] [--failures 200000] [--seed 1]

The seed (000, "Lab 3") takes 25,000 GPUs with a 5-year MTBF each: lambda = 13.7 failures a day,
one every 105 minutes. With a checkpoint write of W = 240 s and a restart of R = 900 s, the
overhead of checkpointing every T seconds is, to first order, W/T (writing) plus
lambda.(T/2 + R) (per failure: half an interval of work lost, and the restart): 96.65 % at
T = 300 s, 41.87 % at 1800 s, 74.68 % at 7200 s, a U whose floor is T* = sqrt(2W/lambda) =
29.0 min. The seed's quiz 4 asks the same for 40,000 GPUs, a 4-year MTBF, W = 180 s, R = 20 min.

This lab computes those numbers, then checks them against a Monte Carlo of a long job: failures
strike at exponential intervals at any moment -- while computing, while writing a checkpoint,
during a restart (which then starts over). T is the compute time between checkpoints (one
period is T + W); a failure loses the work since the last finished checkpoint. The same failure
times are used for every T (common random numbers), so the measured U is smooth and its minimum
is located by a parabola through the lowest points. Next to it: Daly's higher-order optimum
(J. T. Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps",
FGCS 22(3), 2006) and his complete expression for exponential failures,
overhead(T) = e^(R/M).(e^((T+W)/M) - 1).M/T - 1 with M = 1/lambda, which the Monte Carlo follows.
"""

from __future__ import annotations

import math

import numpy as np
from lab_common import claim, parser, save_figure, write_json

SECONDS_PER_YEAR = 365.0 * 86400.0
SEED_ROWS = {300: 96.65, 1800: 41.87, 7200: 74.68}        # T (s) -> the seed's total overhead %


def failure_rate(gpus: int, mtbf_years: float) -> float:
    """Failures per second of the whole fleet."""
    return gpus / (mtbf_years * SECONDS_PER_YEAR)


def first_order(T, W: float, R: float, lam: float):
    """The seed's overhead: W/T + lambda.(T/2 + R) (a fraction)."""
    return W / T + lam * (T / 2 + R)


def young(W: float, lam: float) -> float:
    """First-order optimum, sqrt(2W/lambda) (Young 1974)."""
    return math.sqrt(2 * W / lam)


def daly(W: float, lam: float) -> float:
    """Daly's higher-order optimum (FGCS 2006); M itself once W >= 2M."""
    M = 1 / lam
    if W >= 2 * M:
        return M
    x = W / (2 * M)
    return math.sqrt(2 * W * M) * (1 + math.sqrt(x) / 3 + x / 9) - W


def exact(T, W: float, R: float, lam: float):
    """Daly's complete expected overhead for exponential failures (a fraction)."""
    M = 1 / lam
    return math.exp(R / M) * np.expm1((np.asarray(T) + W) / M) * M / np.asarray(T) - 1


def monte_carlo(Ts, W: float, R: float, lam: float, failures: int, seed: int):
    """Measured overhead (wall time / useful work - 1) of a job with ``failures`` failures, for
    each compute interval in ``Ts``.

    Failures are a Poisson process in wall-clock time. After failure i the job restarts, which
    takes R; if failure i+1 comes first the restart starts over. Otherwise it computes from
    f_i + R until f_(i+1), committing T seconds of work for every whole period T + W that fits.
    """
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1 / lam, failures)          # gaps[0]: from the start to failure 1
    available = np.where(np.arange(failures) == 0, gaps, gaps - R)
    available = np.clip(available, 0, None)            # a restart cut short: nothing computed
    wall = gaps.sum()
    Ts = np.asarray(Ts, float)
    work = np.array([(np.floor(available / (T + W)) * T).sum() for T in Ts])
    return wall / work - 1, int((available == 0).sum())


def parabola_minimum(Ts, y) -> float:
    """Where a parabola through the lowest point and its two neighbours has its minimum."""
    i = int(np.clip(np.argmin(y), 1, len(Ts) - 2))
    a, b, _ = np.polyfit(Ts[i - 1:i + 2], y[i - 1:i + 2], 2)
    return -b / (2 * a)


def main(argv=None) -> int:
    ap = parser(__doc__, png="the U-curve")
    ap.add_argument("--failures", type=int, default=200_000,
                    help="failures in the simulated job (default 200000)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)

    gpus, mtbf, W, R = 25_000, 5.0, 240.0, 900.0
    lam = failure_rate(gpus, mtbf)
    print(f"lambda = {lam:.2e}/s = {lam * 86400:.1f}/day (one failure every {1 / lam / 60:.0f} "
          "min)   [seed: 13.7/day, every 105 min]")
    rows = []
    print("     T   ckpt W/T   loss l(T/2+R)   first order   seed     exact (Daly)   Monte Carlo")
    table_Ts = [300, 600, 900, 1800, 3600, 7200]
    mc_table, restarts_cut = monte_carlo(table_Ts, W, R, lam, args.failures, args.seed)
    for T, mc in zip(table_Ts, mc_table):
        fo, ex = first_order(T, W, R, lam), float(exact(T, W, R, lam))
        seed = SEED_ROWS.get(T)
        rows.append({"T": T, "checkpoint": W / T, "loss": lam * (T / 2 + R), "first_order": fo,
                     "seed": None if seed is None else seed / 100, "exact": ex,
                     "monte_carlo": float(mc)})
        print(f"{T:>6.0f}s {W / T * 100:>9.2f}% {lam * (T / 2 + R) * 100:>14.3f}% "
              f"{fo * 100:>12.2f}% {'' if seed is None else f'{seed:.2f}%':>7} "
              f"{ex * 100:>13.2f}% {mc * 100:>12.2f}%")

    t_young, t_daly = young(W, lam), daly(W, lam)
    grid = np.arange(300.0, 7201.0, 30.0)
    mc_curve, _ = monte_carlo(grid, W, R, lam, args.failures, args.seed)
    t_mc = parabola_minimum(grid, mc_curve)
    t_exact = float(grid[np.argmin(exact(grid, W, R, lam))])
    off = (t_mc - t_young) / t_young
    print(f"optimum T* = sqrt(2W/lambda) = {t_young / 60:.1f} min   [seed: 29.0 min]")
    print(f"Daly's higher-order optimum   = {t_daly / 60:.1f} min   (exact expression's "
          f"minimum on a 30 s grid: {t_exact / 60:.1f} min)")
    print(f"Monte Carlo optimum           = {t_mc / 60:.1f} min  ({off * 100:+.1f} % from T*; "
          f"{args.failures} failures, {restarts_cut} restarts cut short, seed {args.seed})")
    drift = [(float(T), float(first_order(T, W, R, lam)), float(m))
             for T, m in zip(grid, mc_curve)]
    under = [m - f for T, f, m in drift if 900 <= T <= 3600]
    print(f"first order below the Monte Carlo by {min(under) * 100:.1f} to {max(under) * 100:.1f}"
          f" points for T in 15..60 min, {(drift[-1][2] - drift[-1][1]) * 100:.1f} at T = 2 h, "
          f"{(drift[0][2] - drift[0][1]) * 100:.1f} at T = 5 min: it ignores failures during "
          "checkpoints and restarts and a second failure in one interval")

    q_lam = failure_rate(40_000, 4.0)
    qW, qR = 180.0, 1200.0
    q_t = young(qW, q_lam)
    quiz = {"failures_per_day": q_lam * 86400, "mtbf_min": 1 / q_lam / 60, "T_star_s": q_t,
            "daly_s": daly(qW, q_lam), "lost_work_per_failure_s": q_t / 2,
            "lost_wall_per_failure_s": q_t / 2 + qR,
            "overhead_first_order": first_order(q_t, qW, qR, q_lam),
            "overhead_exact": float(exact(q_t, qW, qR, q_lam))}
    print("quiz 4 (40,000 GPUs, 4-year MTBF, W = 180 s, R = 20 min): "
          f"{quiz['failures_per_day']:.1f} failures/day (every {quiz['mtbf_min']:.1f} min); T* = {q_t / 60:.1f} min (Daly "
          f"{quiz['daly_s'] / 60:.1f}); lost per failure T*/2 = {q_t / 2 / 60:.1f} min of work, "
          f"{quiz['lost_wall_per_failure_s'] / 60:.1f} min with the restart; overhead "
          f"{quiz['overhead_first_order'] * 100:.0f} % (first order), "
          f"{quiz['overhead_exact'] * 100:.0f} % (exact)")

    write_json(args.json, {
        "gpus": gpus, "mtbf_years": mtbf, "W": W, "R": R, "lambda_per_s": lam,
        "failures_per_day": lam * 86400, "mtbf_fleet_min": 1 / lam / 60, "rows": rows,
        "T_star_s": t_young, "daly_s": t_daly, "exact_min_s": t_exact,
        "monte_carlo_min_s": t_mc, "monte_carlo_off": off, "failures": args.failures,
        "seed": args.seed, "curve": {"T": grid.tolist(), "monte_carlo": mc_curve.tolist()},
        "quiz4": quiz})

    def draw(plt):
        fig, ax = plt.subplots(figsize=(7, 4.2))
        m = grid / 60
        ax.plot(m, first_order(grid, W, R, lam) * 100, label="first order W/T + λ(T/2+R)")
        ax.plot(m, exact(grid, W, R, lam) * 100, label="Daly, exact for exponential failures")
        ax.plot(m[::4], mc_curve[::4] * 100, "k.", ms=4, label="Monte Carlo")
        ax.plot([t / 60 for t in SEED_ROWS], list(SEED_ROWS.values()), "rx", label="seed's rows")
        for t, style, name in ((t_young, "--", "T* (first order)"), (t_daly, ":", "Daly"),
                               (t_mc, "-.", "Monte Carlo min")):
            ax.axvline(t / 60, ls=style, color="gray", lw=1, label=f"{name}: {t / 60:.1f} min")
        ax.set_xscale("log")
        ax.set_ylim(0, 150)
        ax.set_xlabel("compute time between checkpoints T (min)")
        ax.set_ylabel("overhead (% of useful time)")
        ax.set_title("25,000 GPUs, 5-year MTBF, W = 240 s, R = 900 s")
        ax.legend(fontsize=7, loc="lower left")
        return fig
    save_figure(args.png, draw)

    claim("lab_checkpoint",
          "13.7 failures/day, T* = sqrt(2W/lambda) = 29.0 min",
          f"{lam * 86400:.1f} failures/day, T* = {t_young / 60:.1f} min, Monte Carlo optimum "
          f"{t_mc / 60:.1f} min ({off * 100:+.1f} %), Daly {t_daly / 60:.1f} min")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
