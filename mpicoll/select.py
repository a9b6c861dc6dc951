"""Every decision a collective call makes about what runs: one function, ``decide``, and one
decision table, which every form of every collective asks (blocking, nonblocking, persistent,
``Buckets``, ``mpicoll.Comm``, the bench: through ``mpicoll.plan``). Its rows, first that
applies wins:

=====  ============================================  ============================================
row    when                                          then
=====  ============================================  ============================================
shm    ``auto`` all-reduce; every rank on one real   ``shm`` (``shm_wins``: from ``SHM_MIN_BYTES``;
       node; shm reduces the op and dtype; the call  at every size where it reads in place or the
       needs no schedule (no compression)            ranks outnumber the cores, else up to
                                                     ``SHM_MAX_BYTES``; a call in place
                                                     (``sendbuf=MPI.IN_PLACE``) only where it
                                                     copies through its window)
tuned  ``auto``; ``MPICOLL_TUNING``'s table          the measured winner for this N and size
       (``mpicoll tune``; ``profiles/tuning.json``)  (none above the largest measured size),
       has a row for the layout: ``"N"`` on one      with the options it was measured with
       node, ``"N/L"`` across nodes (L ranks on the  (``"options"``; an argument or setting
       largest node; a one-node row never serves a   wins; ``inner="shm"`` only where the node
       call across nodes)                            phases can run)
model  ``auto``; the cost model (``MPICOLL_PROFILE``)  the lowest predicted time, leaving out
       predicts                                      ``naive`` (``baseline``) and ``shm``, with
                                                     hierarchical's ``outer`` of least time
                                                     (``MODELLED_OPTIONS``; a setting wins)
lib    the choice is the MPI library's and it has    MPICH's classic rule (below), which names
       no datatype for the dtype (bfloat16), or the  only mpicoll's own schedules
       call needs a schedule (compression) and the
       choice has none
order  ``auto`` chose a ring, the ranks span nodes,  ``order="node"``: one hop per node boundary
       ``MPICOLL_RING_ORDER`` unset                  leaves a node, whatever the placement
inner  ``hierarchical``; inner neither given nor     ``inner="shm"``: the node phases in a shared
       set (``MPICOLL_HIER_INNER``); equal nodes of  window
       > 1 rank inside real nodes; shm would win on
       one node of that size (``shm_wins``); no
       schedule needed
=====  ============================================  ============================================

MPICH's classic rule (``MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE``): recursive doubling up to
``MPICOLL_SHORT_MSG`` bytes (default 8192) or when count < N, then Rabenseifner on powers of two
and the ring otherwise; it is the ``lib`` row's answer, and the answer when the cost model has
none (a profile that predicts no algorithm).

The shm band, measured on this machine (docs/performance.md, "shm"; interleaved bench runs): at
N = 2 on 2 cores, reading in place, shm was 1.3-1.5x MPI's own from 16 KiB to 512 KiB and
1.0-1.3x at 1-4 MiB, 1.2-3.7x from 8 to 64 MiB; copying through its window it led only up to
64 KiB; with more ranks than cores (N = 3 and 4 on 2 cores) it won at every size from 64 KiB,
1.1-2.8x MPI's own. In place, reading the other rank's memory at N = 2, it was 0.86-1.04x MPI's
own from 16 KiB to 4 MiB, where the ring was 1.00-1.29x (docs/performance.md, "In place at
N = 2"). The decision table and the cost model never choose it.

Every choice is valid for any N and count, and depends only on arguments every rank passes and
on what every rank sees alike (the node layout, the settings): all ranks decide alike, and the
settings that could differ between ranks enter the call's signature (``mpicoll.plan``).
"""

from __future__ import annotations

import functools
import json

from . import model, ops, settings
from .registry import Algorithm, lookup
from .shm import policy
from .shm.policy import SHM_MAX_BYTES, SHM_MIN_BYTES, shm_wins  # noqa: F401 (shm's band, here)

__all__ = ["decide", "auto_ring_order", "choose", "reload", "SHORT_MSG", "SHM_MIN_BYTES", "SHM_MAX_BYTES",
           "DEFAULT_TUNING", "shm_wins"]

SHORT_MSG = 8192
DEFAULT_TUNING = settings.PROFILES / "tuning.json"


@functools.lru_cache(maxsize=1)
def _table() -> dict:
    path = settings.get("MPICOLL_TUNING")
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"MPICOLL_TUNING={path}: not a decision table: {e}") from None
    if not isinstance(table, dict):
        raise ValueError(f"MPICOLL_TUNING={path}: not a decision table (expected a JSON object "
                         "written by `mpicoll tune`)")
    return table


def _table_entry(collective: str, nbytes: int, size: int, ranks_per_node=None) -> dict | None:
    """The tuned row's range for this call: the table's key is ``"N"`` on one node and
    ``"N/L"`` across nodes (L: ranks of the largest node; ``mpicoll tune`` writes it for sweeps
    across nodes). A one-node row is never read across nodes: it was measured over shared
    memory, and says nothing about a network."""
    key = str(size) if ranks_per_node is None or ranks_per_node >= size \
        else f"{size}/{ranks_per_node}"
    ranges = _table().get(collective, {}).get(key)
    if not ranges:
        return None
    for entry in ranges:                  # sorted by max_bytes (null: no upper end)
        if entry["max_bytes"] is None or nbytes <= entry["max_bytes"]:
            return entry
    return None


def _from_table(collective: str, nbytes: int, size: int, ranks_per_node=None) -> str | None:
    entry = _table_entry(collective, nbytes, size, ranks_per_node)
    return entry["algorithm"] if entry else None


def _from_model(collective: str, nbytes: int, size: int, ranks_per_node) -> str | None:
    choice = _model_choice(collective, nbytes, size, ranks_per_node)
    return choice[0] if choice else None


# the options the model row chooses too, each over its choices: hierarchical's inter-node
# all-reduce (on 4 nodes x 2 an outer ring sends 1.5n through a node's link, the default
# recursive doubling 2n: 1.12x faster at 1 Gbit/s, docs/fabric.md)
MODELLED_OPTIONS = ("outer",)


@functools.lru_cache(maxsize=4096)
def _model_choice(collective: str, nbytes: int, size: int, ranks_per_node) -> tuple | None:
    """The model row's (algorithm, options): the lowest predicted time of every algorithm,
    and of each choice of its ``MODELLED_OPTIONS`` that no setting fixes, leaving out teaching
    baselines and ``shm`` (see the module doc); None if the model predicts none."""
    profile = model.default_profile()
    predicted = {}
    for name, t in model.predict_all(size, nbytes, profile, collective=collective,
                                     ranks_per_node=ranks_per_node).items():
        algo = lookup(collective, name)
        if algo.has("baseline") or algo.has("shared-memory"):
            continue
        predicted[name, ()] = t
        for option in algo.options:
            if option.name not in MODELLED_OPTIONS or (option.env and settings.given(option.env)):
                continue
            for value in option.choices:
                predicted[name, ((option.name, value),)] = model.predict(
                    name, size, nbytes, profile, collective=collective,
                    ranks_per_node=ranks_per_node, **{option.name: value})
    return min(predicted, key=predicted.get) if predicted else None


def _pof2(size: int) -> bool:
    return size & (size - 1) == 0


def _classic(collective: str, nbytes: int, size: int, count: int) -> str:
    short = nbytes <= settings.get("MPICOLL_SHORT_MSG")
    if collective == "allreduce":
        if short or count < size:
            return "recursive_doubling"
        return "recursive_halving" if _pof2(size) else "ring"
    if collective == "reduce_scatter_block":
        return "recursive_halving" if short else "ring"
    if collective == "allgather":
        return "recursive_doubling" if short else "ring"
    return "binomial" if short or size < 4 else "ring"


@functools.lru_cache(maxsize=4096)
def choose(collective: str, nbytes: int, size: int, count: int,
           ranks_per_node: int | None = None) -> str:
    """The algorithm ``auto`` runs for ``nbytes`` (the whole vector) on ``size`` ranks.

    Decisions are cached, and the environment is read when first needed: after changing
    ``MPICOLL_TUNING``, ``MPICOLL_PROFILE`` or ``MPICOLL_SHORT_MSG`` call ``reload()`` (or
    ``mpicoll.settings.reload()``, which calls it).
    """
    return (_from_table(collective, nbytes, size, ranks_per_node)
            or _from_model(collective, nbytes, size, ranks_per_node)
            or _classic(collective, nbytes, size, count))


@settings.on_reload
def reload() -> None:
    """Forget cached decisions, tables and profiles (after changing the environment)."""
    for cached in (choose, _model_choice, _table, model.default_profile):
        cached.cache_clear()


def _shm_row(st, op: str | None, dtype, nbytes: int, size: int, in_place: bool) -> bool:
    """The ``shm`` row: every rank on one real node, an op and dtype shm reduces, shm wins
    (``shm.policy``: its band, where it reads the other ranks' memory, in place or not)."""
    return (op is not None and policy.usable(st, op, dtype)
            and shm_wins(nbytes, size, single_copy=policy.single_copy_expected(size),
                         in_place=in_place))


def _inner_row(st, op: str | None, dtype, nbytes: int) -> bool:
    """The ``inner`` row: hierarchical's node phases in shared memory by default
    (``shm.policy.node_phases_by_default``: equal nodes inside real nodes, shm's band)."""
    return op is not None and policy.node_phases_by_default(st, None, op, dtype, nbytes)


def _shm_node_phases_possible(st, op: str | None, dtype) -> bool:
    """Whether the shm node phases (hierarchical's inner) can run: equal nodes of > 1 rank,
    each inside a real node, an op and dtype shm reduces (``shm.policy.check_node_phases``,
    without raising)."""
    if op is None or st is None:
        return False
    nodes = st.nodes()
    return (len({len(n) for n in nodes}) == 1 and len(nodes[0]) > 1
            and not policy.outside_real_nodes(st) and policy.supports(op, dtype))


def auto_ring_order(st) -> str | None:
    """The ``order`` row: the order of ``auto``'s rings on ``st``'s node layout -- ``"node"``
    when the ranks span nodes and ``MPICOLL_RING_ORDER`` is unset, else None (the declared
    default, or the variable, decides)."""
    if settings.get("MPICOLL_RING_ORDER") is None and len(st.nodes()) > 1:
        return "node"
    return None


def decide(collective: str, algorithm: str, *, nbytes: int, count: int, size: int, dtype,
           op: str | None, st, given: dict, scheduled: bool = False,
           in_place: bool = False) -> tuple[Algorithm, dict]:
    """The algorithm a call runs, and the options the table sets (the module's rows): for
    ``algorithm`` (a declared name, or ``"auto"``), ``nbytes`` in ``count`` elements of
    ``dtype`` (the whole vector), on ``size`` ranks whose communicator state is ``st``
    (``CommState``, its node layout known; None when ``size`` is 1), ``given`` the options the
    caller passed (None: not given), ``scheduled``: the call needs a schedule (compression),
    ``in_place``: an all-reduce whose input is its output (``sendbuf=MPI.IN_PLACE``)."""
    auto = algorithm == "auto"
    tuned: dict = {}
    if not auto:
        algo = lookup(collective, algorithm)
    elif collective == "allreduce" and size > 1 and not scheduled and \
            _shm_row(st, op, dtype, nbytes, size, in_place):
        algo = lookup(collective, "shm")
    else:
        rpn = st.ranks_per_node if size > 1 else None
        algo = lookup(collective, choose(collective, nbytes, size, count, rpn))
        if (algo.library and not ops.library_has(dtype)) or (scheduled and not algo.scheduled):
            algo = lookup(collective, _classic(collective, nbytes, size, count))
        else:
            entry = _table_entry(collective, nbytes, size, rpn)
            if entry and entry["algorithm"] == algo.name:
                tuned = entry.get("options") or {}
            elif entry is None:                 # the model row's options, if it decided
                choice = _model_choice(collective, nbytes, size, rpn)
                if choice and choice[0] == algo.name:
                    tuned = dict(choice[1])
    names = {o.name for o in algo.options}
    extra = {}
    order = auto_ring_order(st) if auto and "order" in names and size > 1 else None
    if order is not None and given.get("order") is None:
        extra["order"] = order
    if "inner" in names and size > 1 and not scheduled and given.get("inner") is None and \
            _inner_row(st, op, dtype, nbytes):
        extra["inner"] = "shm"
    for option in algo.options:           # the tuned row's measured variant (tune's "options"),
                                          # or the model row's choice of MODELLED_OPTIONS
        value = tuned.get(option.name)
        if value is None or given.get(option.name) is not None or value not in option.choices \
                or (option.env and settings.given(option.env)):
            continue                      # (an argument or a setting has the last word)
        if value in option.mpi_only and not (extra.get(option.name) == value
                                             or (not scheduled and option.name == "inner"
                                                 and _shm_node_phases_possible(st, op, dtype))):
            continue                      # (shm node phases: only where they can run)
        extra[option.name] = value
    return algo, extra
