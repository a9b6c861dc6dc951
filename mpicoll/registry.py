"""Every algorithm of every collective, declared once: the one list the API, the executors, the
tests, the benchmark and the cost model iterate over (as MPICH's ``coll_algorithms.txt``).

An ``Algorithm`` declares:

* ``restrictions``: tokens saying what the algorithm needs or does (``TOKENS`` explains each);
  code asks ``algo.has("node-layout")``, never the algorithm's name;
* ``options``: its extra parameters, each with the environment variable that sets its default,
  the default itself, the allowed values and one line of doc;
* ``aliases``: other names it answers to (MPICH's, e.g. ``reduce_scatter_allgather``);
* ``library``: it is the MPI library's own collective (``mpi``, the reference), with no schedule.

Adding an algorithm is one module in ``algorithms/`` plus one entry here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable

from . import settings, topology
from .algorithms import (allgather_recursive_doubling, allgather_ring, allreduce_binomial,
                         allreduce_double_binary_tree, allreduce_hierarchical,
                         allreduce_naive, allreduce_recursive_doubling,
                         allreduce_recursive_halving, allreduce_ring, allreduce_shm,
                         bcast_binomial,
                         bcast_scatter_ring_allgather, reduce_scatter_recursive_halving,
                         reduce_scatter_ring)

__all__ = ["Option", "Algorithm", "TOKENS", "ALLREDUCE", "REDUCE_SCATTER_BLOCK", "ALLGATHER",
           "BCAST", "COLLECTIVES", "lookup", "per_collective", "algorithm_for", "bus_factor"]

TOKENS = {
    "any-size": "any number of ranks, any count",
    "commutative": "reduces in an order other than rank order: needs a commutative op",
    "pof2-fold": "a non-power-of-two size folds 2*rem ranks onto their neighbours (whole vector)",
    "node-layout": "runs on the node layout (which ranks share a node); schedule(..., nodes=)",
    "node-phases": "node-local phases on the intra-node link around an inter-node phase: "
                   "cost(..., ranks_per_node=, alpha_intra=, beta_intra=); on one node only "
                   "its node phase runs",
    "equal-nodes": "some of its options need the same number of ranks on every node",
    "root": "one rank is the root; schedule(..., root=)",
    "library": "the MPI library's own collective: no schedule, no cost formula",
    "shared-memory": "reduces in a shared-memory window (mpicoll.shm), not by messages: every "
                     "rank on one node (the MPI library's COMM_TYPE_SHARED split); a request "
                     "runs it whole in the progress engine; no schedule (nothing to simulate or "
                     "trace), a cost formula for one node",
    "cost-approximate": "cost() approximates the schedule's time (a pipeline's fill and drain); "
                        "its round count is exact",
    "baseline": "a teaching baseline: p-1 messages each way in one step, each charged its "
                "latency by cost() (one port sends them one after another); auto never "
                "chooses it",
}


@dataclass(frozen=True)
class Option:
    """An extra parameter of an algorithm: ``schedule(..., name=value)``."""

    name: str
    env: str | None                 # the setting that gives its default (mpicoll.settings)
    default: Any                    # a value, or a function of the node layout
    choices: tuple
    doc: str
    mpi_only: tuple = ()            # choices with no schedule: only the MPI path runs them

    @property
    def scheduled_choices(self) -> tuple:
        """The choices a schedule exists for (what the simulators, traces and tests of
        schedules can run)."""
        return tuple(c for c in self.choices if c not in self.mpi_only)

    def value(self, given, nodes=None):
        """``given``, else the environment's value, else the default; checked."""
        if given is None and self.env:
            given = settings.get(self.env)
        if given is None:
            given = self.default(nodes) if callable(self.default) else self.default
        if given not in self.choices:
            source = f"{self.name}" + (f" (or {self.env})" if self.env else "")
            raise ValueError(f"unknown {source} {given!r}; expected one of {list(self.choices)}")
        return given


@dataclass(frozen=True, eq=False)     # each is declared once: compared and hashed by identity
class Algorithm:
    name: str
    module: ModuleType | None       # None: the MPI library's own collective
    restrictions: tuple = ("any-size",)
    options: tuple = ()
    aliases: tuple = ()
    check: Callable | None = None   # check(nodes, **options): raises ValueError
    pick: Callable | None = None    # pick(size, count, nodes, alpha, beta, gamma) -> keywords
                                    # the cost model chooses (e.g. a pipeline's chunk count)

    @property
    def library(self) -> bool:
        """The MPI library's own collective (``mpi``): no schedule."""
        return self.module is None

    @property
    def scheduled(self) -> bool:
        """It has a schedule (``schedule()``): neither the library's collective nor code that
        runs in shared memory."""
        return not self.library and not self.has("shared-memory")

    def has(self, token: str) -> bool:
        return token in self.restrictions

    @property
    def deferred(self) -> bool:
        """Its nonblocking form only defers it: the progress engine runs the whole collective
        at once (``shared-memory``), so nothing overlaps the caller's work; a caller that may
        choose (the torch backend) runs it blocking."""
        return self.has("shared-memory")

    @property
    def schedule(self):
        return self.module.schedule

    @property
    def cost(self):
        return self.module.cost

    def resolve(self, given: dict | None = None, nodes=None) -> dict:
        """Every declared option's value (given, else from the environment, else the default),
        checked, in declaration order; raises ``ValueError`` naming a bad or unknown option."""
        given = given or {}
        unknown = [k for k, v in given.items()
                   if v is not None and k not in {o.name for o in self.options}]
        if unknown:
            table = next(t for t in COLLECTIVES.values() if self in t.values())
            owners = [a for a in table.values() if set(unknown) <= {o.name for o in a.options}]
            names = [k for k in given if any(k in {o.name for o in a.options} for a in owners)]
            names = names or unknown
            raise ValueError(f"{'/'.join(names)} appl{'ies' if len(names) == 1 else 'y'} to "
                             + " or ".join(f"algorithm={a.name!r}" for a in owners)
                             + f", not {self.name!r}")
        values = {o.name: o.value(given.get(o.name), nodes) for o in self.options}
        if self.check is not None:
            self.check(nodes, **values)
        return values

    def describe(self) -> str:
        return ", ".join(self.restrictions) + "".join(
            f"; {o.name}: {'/'.join(o.choices)}" for o in self.options)


def _table(*algorithms: Algorithm) -> dict[str, Algorithm]:
    return {a.name: a for a in algorithms}


_HIERARCHICAL_OPTIONS = (
    Option("inner", "MPICOLL_HIER_INNER", allreduce_hierarchical.default_inner,
           allreduce_hierarchical.INNERS,
           "node-local algorithm: ring/recursive_halving (shard, equal nodes), binomial "
           "(leader) or shm (shard, the node phases in a shared-memory window: MPI path only)",
           mpi_only=(allreduce_hierarchical.SHM,)),
    Option("outer", "MPICOLL_HIER_OUTER", "recursive_doubling",
           tuple(allreduce_hierarchical.OUTER), "the inter-node all-reduce"),
)

_RING_OPTIONS = (
    Option("order", "MPICOLL_RING_ORDER", "rank", topology.ORDERS,
           "the order the ring visits the ranks: rank, node (node by node: one hop per node "
           "boundary leaves a node) or rail (node by node, nodes joined on the same local index)"),
)

ALLREDUCE = _table(
    Algorithm("ring", allreduce_ring, ("any-size", "commutative", "node-layout"),
              options=_RING_OPTIONS),
    Algorithm("recursive_halving", allreduce_recursive_halving,
              ("any-size", "commutative", "pof2-fold"), aliases=("reduce_scatter_allgather",
                                                                 "rabenseifner")),
    Algorithm("recursive_doubling", allreduce_recursive_doubling,
              ("any-size", "commutative", "pof2-fold")),
    Algorithm("binomial", allreduce_binomial, ("any-size", "commutative"),
              aliases=("reduce_bcast",)),
    Algorithm("hierarchical", allreduce_hierarchical,
              ("any-size", "commutative", "node-layout", "node-phases", "equal-nodes"),
              options=_HIERARCHICAL_OPTIONS, aliases=("smp",),
              check=allreduce_hierarchical.check_options),
    Algorithm("double_binary_tree", allreduce_double_binary_tree,
              ("any-size", "commutative", "node-layout", "node-phases", "cost-approximate"),
              aliases=("dtree",),
              pick=allreduce_double_binary_tree.pick),
    Algorithm("naive", allreduce_naive, ("any-size", "baseline")),
    Algorithm("shm", allreduce_shm, ("any-size", "shared-memory")),
    Algorithm("mpi", None, ("library",)),
)
REDUCE_SCATTER_BLOCK = _table(
    Algorithm("ring", reduce_scatter_ring, ("any-size", "commutative", "node-layout"),
              options=_RING_OPTIONS),
    Algorithm("recursive_halving", reduce_scatter_recursive_halving,
              ("any-size", "commutative", "pof2-fold")),
    Algorithm("mpi", None, ("library",)),
)
ALLGATHER = _table(
    Algorithm("ring", allgather_ring, ("any-size", "node-layout"), options=_RING_OPTIONS),
    Algorithm("recursive_doubling", allgather_recursive_doubling, ("any-size", "pof2-fold")),
    Algorithm("mpi", None, ("library",)),
)
BCAST = _table(
    Algorithm("binomial", bcast_binomial, ("any-size", "root")),
    Algorithm("ring", bcast_scatter_ring_allgather, ("any-size", "root"),
              aliases=("scatter_ring_allgather",)),
    Algorithm("mpi", None, ("library", "root")),
)
COLLECTIVES = {
    "allreduce": ALLREDUCE,
    "reduce_scatter_block": REDUCE_SCATTER_BLOCK,
    "allgather": ALLGATHER,
    "bcast": BCAST,
}
_ALIASES = {(c, alias): a.name for c, table in COLLECTIVES.items() for a in table.values()
            for alias in a.aliases}


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests' bus bandwidth factor (its doc/PERFORMANCE.md): busbw = algbw x this, the
    fraction of the data each rank's link must carry whatever the algorithm."""
    if collective == "allreduce":
        return 2 * (n - 1) / n
    if collective in ("reduce_scatter_block", "allgather"):
        return (n - 1) / n
    return 1.0


def lookup(collective: str, name: str) -> Algorithm:
    """The algorithm ``name`` (or an alias of it) of ``collective``; ``ValueError`` naming the
    choices if there is none."""
    table = COLLECTIVES[collective]
    try:
        return table[_ALIASES.get((collective, name), name)]
    except (KeyError, TypeError):       # TypeError: not hashable, so not a name
        raise ValueError(f"unknown {collective} algorithm {name!r}; expected 'auto' or one of "
                         f"{list(table)}") from None


def per_collective(algorithm, who: str = "algorithm") -> dict[str, str]:
    """``{collective: name}`` for an algorithm setting: the one meaning of ``mpicoll.Comm``'s
    ``algorithm`` and the torch backend's ``Options.algorithm``.

    A name applies to every collective that has an algorithm of that name (or alias), ``auto``
    to the others; a name no collective has is a ``ValueError``. A mapping ``{collective:
    name}`` names some collectives, those left out run ``auto``; a collective that is not one,
    or a name its collective doesn't have, is a ``ValueError``. ``who`` begins the message."""
    return dict(_chosen(algorithm, who))


def algorithm_for(algorithm, collective: str, who: str = "algorithm") -> str:
    """``per_collective(algorithm, who)[collective]``, without the copy (a name's map is made
    once)."""
    return _chosen(algorithm, who)[collective]


_NAMED: dict[str, dict[str, str]] = {}      # a name's per_collective, made once


def _chosen(algorithm, who: str) -> dict[str, str]:
    if isinstance(algorithm, str):
        chosen = _NAMED.get(algorithm)
        if chosen is None:
            chosen = _NAMED[algorithm] = _for_name(algorithm, who)
        return chosen
    if isinstance(algorithm, Mapping):
        unknown = set(algorithm) - set(COLLECTIVES)
        if unknown:
            raise ValueError(f"{who}: algorithm maps {sorted(unknown)}, not collectives; "
                             f"the collectives are {', '.join(COLLECTIVES)}")
        chosen = dict.fromkeys(COLLECTIVES, "auto")
        for collective, name in algorithm.items():
            if name != "auto":
                lookup(collective, name)       # its error names the known ones
            chosen[collective] = name
        return chosen
    raise TypeError(f"{who}: algorithm is a name or a {{collective: name}} mapping, got "
                    f"{type(algorithm).__name__}")


def _for_name(name: str, who: str) -> dict[str, str]:
    if name == "auto":
        return dict.fromkeys(COLLECTIVES, "auto")
    chosen = {}
    for collective in COLLECTIVES:
        try:
            lookup(collective, name)
            chosen[collective] = name
        except ValueError:
            chosen[collective] = "auto"
    if set(chosen.values()) == {"auto"}:
        known = sorted({a.name for t in COLLECTIVES.values() for a in t.values()})
        raise ValueError(f"{who}: unknown algorithm {name!r} (no collective has it); known: "
                         f"auto, {', '.join(known)}")
    return chosen
