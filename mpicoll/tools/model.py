"""``mpicoll model``: predicted times of every algorithm and the crossovers, from a cost-model
profile, for any N (no MPI needed).

    mpicoll model [--profile P.json] -N 4 [-b 8 -e 64M -f 2] [--ranks-per-node 2]
"""

from __future__ import annotations

from ..model import ProfileError, crossovers, load_profile, predict_all
from ..registry import COLLECTIVES
from .cli import Parser, positive_int, step_factor
from .sizes import size_arg, sizes_from, too_many_sizes

__all__ = ["main"]


def main(argv=None) -> int:
    ap = Parser("mpicoll model", __doc__)
    ap.add_argument("--profile", help="profile JSON (default: $MPICOLL_PROFILE, else the one "
                                      "shipped in mpicoll/profiles/default.json)")
    ap.add_argument("-N", "--nranks", type=positive_int, default=4,
                    help="number of ranks (default 4)")
    ap.add_argument("--ranks-per-node", type=positive_int, default=None,
                    help="ranks per node (default: all ranks on one node, as mpicoll trace "
                         "assumes; node-aware algorithms are modelled only across nodes)")
    ap.add_argument("-b", "--minbytes", type=size_arg, default="8",
                    help="smallest size (default 8)")
    ap.add_argument("-e", "--maxbytes", type=size_arg, default="64M",
                    help="largest size (default 64M)")
    ap.add_argument("-f", "--stepfactor", type=step_factor, default=4,
                    help="size factor between steps (default 4)")
    ap.add_argument("--collective", default="allreduce", choices=list(COLLECTIVES),
                    help="which collective (default allreduce)")
    args = ap.parse_args(argv)
    try:
        profile = load_profile(args.profile)
    except (ProfileError, ValueError) as e:
        ap.error(str(e))
    crowded = too_many_sizes(args.minbytes, args.maxbytes, args.stepfactor)
    if crowded:
        ap.error(crowded)
    sizes = sizes_from(args.minbytes, args.maxbytes, args.stepfactor)
    if not sizes:
        ap.error(f"empty size range: -b {args.minbytes} is above -e {args.maxbytes}")
    table = [predict_all(args.nranks, s, profile, collective=args.collective,
                         ranks_per_node=args.ranks_per_node) for s in sizes]
    names = list(table[0])
    for reason in profile.meta.get("unreliable", []):
        print(f"# warning: the profile's beta is unreliable (mpicoll calibrate said: {reason})")
    print(f"# predicted {args.collective} time (us), N={args.nranks}, "
          f"alpha={profile.alpha * 1e6:.2f}us beta={profile.beta * 1e9:.4f}ns/B "
          f"gamma={profile.gamma * 1e9:.4f}ns/B overhead={profile.overhead * 1e6:.2f}us"
          + (f" alpha_inter={profile.alpha_inter * 1e6:.2f}us "
             f"beta_inter={profile.beta_inter * 1e9:.4f}ns/B" if profile.alpha_inter else ""))
    print(f"{'size(B)':>12} " + " ".join(f"{n:>19}" for n in names) + "  best")
    best = []
    for s, row in zip(sizes, table):
        best.append(min(row, key=row.get))
        print(f"{s:>12} " + " ".join(f"{row[n] * 1e6:>19.2f}" for n in names) + f"  {best[-1]}")
    for size, old, new in crossovers(sizes, best):
        print(f"# crossover: {new} overtakes {old} at {size} B")
    a, b = profile.link(bool(args.ranks_per_node and args.ranks_per_node < args.nranks))
    print(f"# latency/bandwidth balance point N.alpha/beta = {args.nranks * a / b:.0f} B")
    return 0
