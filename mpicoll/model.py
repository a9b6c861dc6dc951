"""The alpha-beta-gamma cost model: predicted time of every algorithm, from a measured profile.

A profile holds alpha (seconds per message), beta (seconds per byte sent) and gamma (seconds per
byte reduced), for messages inside a node and, when measured on several nodes, between nodes
(``mpicoll calibrate`` writes one), plus the fixed cost of one call through mpicoll's Python
layer (``overhead``), which every prediction adds once. Each algorithm module's ``cost(p, n, alpha, beta, gamma)``
is the formula of its docstring; ``predict`` feeds it the right link: a flat algorithm on
several nodes pays the inter-node link on its critical path, ``hierarchical`` pays the
intra-node link in its node phases and the inter-node link in between.

    mpicoll model [--profile P.json] -N 4 [-b 8 -e 64M -f 2]   # table + crossovers, no MPI

A profile measured on this project's 2-core machine ships as ``mpicoll/profiles/default.json``;
``MPICOLL_PROFILE`` (or ``--profile``) points elsewhere.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .registry import COLLECTIVES

__all__ = ["Profile", "load_profile", "predict", "predict_all", "crossovers", "main"]

DEFAULT_PROFILE = Path(__file__).with_name("profiles") / "default.json"


@dataclass
class Profile:
    alpha: float                      # s per message, inside a node
    beta: float                       # s per byte, inside a node
    gamma: float                      # s per byte reduced
    alpha_inter: float | None = None  # s per message between nodes (None: as inside)
    beta_inter: float | None = None   # s per byte between nodes
    overhead: float = 0.0             # s per call of mpicoll's Python layer (checks, lookups)
    meta: dict = field(default_factory=dict)

    @classmethod
    def from_json(cls, path) -> "Profile":
        data = json.loads(Path(path).read_text())
        keys = ("alpha", "beta", "gamma", "alpha_inter", "beta_inter")
        return cls(**{k: data.get(k) for k in keys}, overhead=data.get("overhead", 0.0),
                   meta=data.get("meta", {}))

    def to_json(self, path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2) + "\n")

    def link(self, inter: bool) -> tuple[float, float]:
        if inter and self.alpha_inter is not None:
            return self.alpha_inter, self.beta_inter
        return self.alpha, self.beta


def load_profile(path: str | os.PathLike | None = None) -> Profile | None:
    """The profile at ``path``, else ``$MPICOLL_PROFILE``, else the shipped default (or None)."""
    path = path or os.environ.get("MPICOLL_PROFILE") or DEFAULT_PROFILE
    return Profile.from_json(path) if Path(path).exists() else None


def predict(algorithm: str, p: int, nbytes: float, profile: Profile, *,
            collective: str = "allreduce", ranks_per_node: int | None = None,
            **options) -> float | None:
    """Predicted seconds for one call; None for ``mpi`` (the library's algorithm is unknown).

    ``ranks_per_node`` (default: all p ranks on one node) decides which link is paid.
    """
    algo = COLLECTIVES[collective][algorithm]
    if algo.module is None:
        return None
    if p <= 1:
        return 0.0
    L = p if ranks_per_node is None else max(1, min(ranks_per_node, p))
    multi_node = L < p
    if algorithm == "hierarchical":
        a_in, b_in = profile.link(False)
        a_out, b_out = profile.link(multi_node)
        return profile.overhead + algo.cost(p, nbytes, a_out, b_out, profile.gamma,
                                            ranks_per_node=L, alpha_intra=a_in,
                                            beta_intra=b_in, **options)
    alpha, beta = profile.link(multi_node)
    return profile.overhead + algo.cost(p, nbytes, alpha, beta, profile.gamma)


def predict_all(p: int, nbytes: float, profile: Profile, *, collective: str = "allreduce",
                ranks_per_node: int | None = None) -> dict[str, float]:
    """Predicted seconds of every modelled algorithm (hierarchical only across nodes)."""
    out = {}
    for name, algo in COLLECTIVES[collective].items():
        if algo.module is None:
            continue
        if name == "hierarchical" and (ranks_per_node is None or ranks_per_node >= p
                                       or ranks_per_node <= 1):
            continue
        out[name] = predict(name, p, nbytes, profile, collective=collective,
                            ranks_per_node=ranks_per_node)
    return out


def crossovers(sizes, best: list[str]) -> list[tuple[int, str, str]]:
    """Where the best algorithm changes: (first size of the new winner, old, new)."""
    return [(sizes[i], best[i - 1], best[i]) for i in range(1, len(best)) if best[i] != best[i - 1]]


def sizes_from(minbytes: int, maxbytes: int, factor: float) -> list[int]:
    sizes, s = [], max(1, minbytes)
    while s <= maxbytes:
        sizes.append(int(s))
        s = s * factor if factor > 1 else s + 1
    return sizes


def parse_size(text: str) -> int:
    """``8``, ``64K``, ``4M``, ``1G`` (powers of 1024, as in nccl-tests and OSU)."""
    text = text.strip().upper().removesuffix("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text[:-1] if mult > 1 else text) * mult)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="mpicoll model", description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", help="profile JSON (default: $MPICOLL_PROFILE or the shipped one)")
    ap.add_argument("-N", "--nranks", type=int, default=4)
    ap.add_argument("--ranks-per-node", type=int, default=None,
                    help="ranks per node (default: all on one node)")
    ap.add_argument("-b", "--minbytes", default="8")
    ap.add_argument("-e", "--maxbytes", default="64M")
    ap.add_argument("-f", "--stepfactor", type=float, default=4)
    ap.add_argument("--collective", default="allreduce", choices=list(COLLECTIVES))
    args = ap.parse_args(argv)
    profile = load_profile(args.profile)
    if profile is None:
        ap.error("no profile: run `mpicoll calibrate` or pass --profile")
    sizes = sizes_from(parse_size(args.minbytes), parse_size(args.maxbytes), args.stepfactor)
    table = [predict_all(args.nranks, s, profile, collective=args.collective,
                         ranks_per_node=args.ranks_per_node) for s in sizes]
    names = list(table[0])
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
