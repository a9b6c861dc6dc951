"""The alpha-beta-gamma cost model: predicted time of every algorithm, from a measured profile.

A profile holds alpha (seconds per message), beta (seconds per byte sent) and gamma (seconds per
byte reduced), for messages inside a node and, when measured on several nodes, between nodes
(``mpicoll calibrate`` writes one), plus the fixed cost of one call through mpicoll's Python
layer (``overhead``), which every prediction adds once. Each algorithm module's
``cost(p, n, alpha, beta, gamma)`` is the formula of its docstring; ``predict`` feeds it the right
link: a flat algorithm on several nodes pays the inter-node link on its critical path, a
node-aware one (``node-phases`` in the registry) pays the intra-node link in its node phases and
the inter-node link in between.

Ranks on one node share its network link (its NIC). The formulas count one rank's bytes, so
across nodes ``predict`` prices each algorithm's bytes by what its own schedule does to the
node's link (``nic_load``): the steps are walked in lock step on nodes of L consecutive ranks,
and a step costs the busiest node's bytes leaving it at the inter-node beta, or the busiest
rank's bytes inside its node at the intra-node beta, whichever is longer. A flat algorithm's
beta is that time per byte of its critical path (the rank-order ring sends one flow out of each
node, so it pays the inter-node beta once; recursive halving with two ranks per node sends two
at once on its inter-node steps, so twice, and its intra-node steps at the intra-node beta); a
node-aware one's inter-node beta is multiplied by the flows its node sends side by side (L for
hierarchical's shards, one for its leaders).

A profile measured on this project's 2-core machine ships as ``mpicoll/profiles/default.json``;
``MPICOLL_PROFILE`` points elsewhere. ``mpicoll model`` (``mpicoll.tools.model``) prints the
predictions as a table.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import settings
from .registry import COLLECTIVES, lookup
from .topology import virtual_nodes

__all__ = ["Profile", "ProfileError", "load_profile", "default_profile", "predict", "predict_all",
           "crossovers", "nic_load", "walked_layout"]

DEFAULT_PROFILE = settings.PROFILES / "default.json"


class ProfileError(ValueError):
    """A profile file that is not a cost-model profile."""


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
        """The profile in a JSON file; ``ProfileError`` naming the file if it is not one."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise ProfileError(f"{path}: cannot read a profile: {e}") from None
        if not isinstance(data, dict):
            raise ProfileError(f"{path}: not a profile (expected a JSON object)")
        missing = [k for k in ("alpha", "beta", "gamma")
                   if not isinstance(data.get(k), (int, float)) or isinstance(data.get(k), bool)
                   or data[k] < 0]
        if missing:
            raise ProfileError(f"{path}: not a profile: {', '.join(missing)} missing or not a "
                               "number >= 0 (write one with `mpicoll calibrate`)")
        keys = ("alpha", "beta", "gamma", "alpha_inter", "beta_inter")
        return cls(**{k: data.get(k) for k in keys}, overhead=data.get("overhead", 0.0),
                   meta=data.get("meta", {}))

    def to_json(self, path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2) + "\n")

    def link(self, inter: bool) -> tuple[float, float]:
        if inter and self.alpha_inter is not None:
            return self.alpha_inter, self.beta_inter
        return self.alpha, self.beta


def load_profile(path: str | os.PathLike | None = None) -> Profile:
    """The profile at ``path``, else ``$MPICOLL_PROFILE``, else the shipped default.

    Raises ``ProfileError`` if the file is missing or not a profile."""
    if path is not None and not Path(path).is_file():
        raise ProfileError(f"{path}: no such profile file")
    return Profile.from_json(path or settings.get("MPICOLL_PROFILE"))


@functools.lru_cache(maxsize=1)
def default_profile() -> Profile:
    """``load_profile()``, read once (``settings.reload`` forgets it)."""
    return load_profile()


settings.on_reload(default_profile.cache_clear)


def predict(algorithm: str, p: int, nbytes: float, profile: Profile, *,
            collective: str = "allreduce", ranks_per_node: int | None = None,
            **options) -> float | None:
    """Predicted seconds for one call; None for ``mpi`` (the library's algorithm is unknown).

    ``ranks_per_node`` (default: all p ranks on one node) decides which link is paid.
    """
    algo = lookup(collective, algorithm)
    if algo.library:
        return None
    if p <= 1:
        return 0.0
    L = p if ranks_per_node is None else max(1, min(ranks_per_node, p))
    multi_node = L < p
    a_in, b_in = profile.link(False)
    a_out, b_out = profile.link(multi_node)
    if algo.has("node-phases"):
        options = algo.resolve(options, virtual_nodes(p, L))   # defaults for these nodes
        if multi_node:
            b_out *= nic_load(collective, algorithm, p, L, tuple(options.items())).flows
        return profile.overhead + algo.cost(p, nbytes, a_out, b_out, profile.gamma,
                                            ranks_per_node=L, alpha_intra=a_in,
                                            beta_intra=b_in, **options)
    if multi_node and algo.scheduled:
        options = algo.resolve(options, virtual_nodes(p, L)) if algo.options else {}
        b_out = nic_load(collective, algorithm, p, L, tuple(options.items())).beta(b_in, b_out)
    return profile.overhead + algo.cost(p, nbytes, a_out, b_out, profile.gamma)


@dataclass(frozen=True)
class NicLoad:
    """What an algorithm's schedule puts on the nodes' links, per element of its vector, step by
    step (steps in lock step; the busiest node and rank of each step): ``out`` the elements
    leaving a node, ``inside`` one rank's elements to its own node, ``sent`` one rank's
    elements, and ``alone`` one rank's elements leaving its node."""
    out: tuple
    inside: tuple
    sent: tuple
    alone: tuple
    flow_scale: float = 1.0     # walked on fewer ranks per node: flows - 1 grows by this

    def beta(self, beta_intra: float, beta_inter: float) -> float:
        """A flat algorithm's beta per byte of its critical path (what its formula counts)."""
        total = sum(self.sent)
        if not total:
            return beta_inter
        return sum(max(o * beta_inter, i * beta_intra)
                   for o, i in zip(self.out, self.inside)) / total

    @property
    def flows(self) -> float:
        """The flows a node sends out side by side: its bytes out per byte of its busiest rank's
        (on the steps that leave a node; 1 if none do)."""
        alone = sum(self.alone)
        return 1.0 + (sum(self.out) / alone - 1.0) * self.flow_scale if alone else 1.0


# more nodes than this are walked as this many (7 when their number is not a power of two, so
# that the layout keeps its kind), with the same last node, and nodes of more ranks as nodes
# of this many: building the ring's schedule takes 0.14 s per rank at 4,096 ranks, and a
# node-aware one's grows with the ranks per node
_WALK_NODES = 8
_WALK_RANKS_PER_NODE = 8


def walked_layout(p: int, L: int) -> tuple[int, int]:
    """The (ranks, ranks per node) ``nic_load`` walks for ``p`` ranks in nodes of ``L``: the same
    up to ``_WALK_NODES`` nodes of up to ``_WALK_RANKS_PER_NODE`` ranks, else a layout of that
    size and the same shape (a power of two of nodes stays one; the last node keeps its size, up
    to the cap). The loads are ratios:
    - the rank-order ring's doesn't change with the layout;
    - recursive halving's and doubling's intra-node steps carry at most L/p of the bytes, which
      the smaller layout overstates a little;
    - a flat algorithm whose node's ranks all send out at once (recursive halving and doubling,
      binomial, naive) shows 8 flows instead of L: a lower bound, still 8 times the ring's one;
    - a node-aware algorithm's flows are scaled back to L (``NicLoad.flow_scale``): its shards
      grow with L, its one leader doesn't."""
    M = -(-p // L)
    last = p - (M - 1) * L
    if L > _WALK_RANKS_PER_NODE:
        L, last = _WALK_RANKS_PER_NODE, min(last, _WALK_RANKS_PER_NODE)
    if M > _WALK_NODES:
        M = _WALK_NODES if M & (M - 1) == 0 else _WALK_NODES - 1
    return (M - 1) * L + last, L


@functools.lru_cache(maxsize=512)
def nic_load(collective: str, algorithm: str, p: int, L: int, options: tuple = ()) -> NicLoad:
    """``NicLoad`` of ``algorithm`` on ``p`` ranks in nodes of ``L`` consecutive ranks, with its
    resolved ``options`` (hierarchical's ``inner="shm"`` is walked as ``"ring"``: the same
    inter-node phase, and no schedule of its own), walked on ``walked_layout``'s layout."""
    algo = lookup(collective, algorithm)
    walked, L_walked = walked_layout(p, L)
    flow_scale = (L - 1) / (L_walked - 1) if algo.has("node-phases") and L > L_walked else 1.0
    p, L = walked, L_walked
    nodes = virtual_nodes(p, L)
    node_of = [j for j, members in enumerate(nodes) for _ in members]
    kwargs = dict(options)
    if kwargs.get("inner") == "shm":
        kwargs["inner"] = "ring"
    if algo.has("node-layout"):
        kwargs["nodes"] = nodes
    if algo.has("root"):
        kwargs.setdefault("root", 0)
    count = p * L * 64              # whole blocks and shards: the ratios, not a size
    out, inside, sent, alone = [], [], [], []
    for members in nodes:                   # (at most 64 ranks: walked_layout)
        for rank in members:
            for s, (_, sends) in enumerate(algo.schedule(rank, p, count, **kwargs).plan):
                if s == len(out):
                    out.append({}), inside.append(0), sent.append(0), alone.append(0)
                mine = {True: 0, False: 0}
                for peer, lo, hi in sends:
                    mine[node_of[peer] != node_of[rank]] += hi - lo
                node = node_of[rank]
                out[s][node] = out[s].get(node, 0) + mine[True]
                inside[s] = max(inside[s], mine[False])
                sent[s] = max(sent[s], mine[True] + mine[False])
                alone[s] = max(alone[s], mine[True])
    return NicLoad(tuple(max(step.values(), default=0) / count for step in out),
                   tuple(x / count for x in inside), tuple(x / count for x in sent),
                   tuple(x / count for x in alone), flow_scale)


def predict_all(p: int, nbytes: float, profile: Profile, *, collective: str = "allreduce",
                ranks_per_node: int | None = None) -> dict[str, float]:
    """Predicted seconds of every modelled algorithm (node-aware ones only across nodes)."""
    out = {}
    for name, algo in COLLECTIVES[collective].items():
        if algo.library:
            continue
        if algo.has("node-phases") and (ranks_per_node is None or ranks_per_node >= p
                                        or ranks_per_node <= 1):
            continue
        if algo.has("shared-memory") and ranks_per_node is not None and ranks_per_node < p:
            continue                    # one node only
        out[name] = predict(name, p, nbytes, profile, collective=collective,
                            ranks_per_node=ranks_per_node)
    return out


def crossovers(sizes, best: list[str]) -> list[tuple[int, str, str]]:
    """Where the best algorithm changes: (first size of the new winner, old, new)."""
    return [(sizes[i], best[i - 1], best[i]) for i in range(1, len(best)) if best[i] != best[i - 1]]
