"""``algorithm="auto"``: which algorithm to run for a message size and communicator size.

In order, the first that has an answer decides:

1. a measured decision table (``MPICOLL_TUNING=path``, written by ``mpicoll tune`` from a bench
   sweep; the one measured on this project's machine ships as ``profiles/tuning.json``): the
   winner of the measured size range for this N (above the largest measured size the table
   has no answer: nothing was measured there);
2. the cost model (``MPICOLL_PROFILE=path``, else the shipped ``profiles/default.json``): the
   algorithm with the lowest predicted time;
3. MPICH's classic rule (``MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE``): recursive doubling up to
   ``MPICOLL_SHORT_MSG`` bytes (default 8192) or when count < N, then Rabenseifner on powers of
   two and the ring otherwise.

Before all of them, an all-reduce whose ranks all share one node (the caller says so:
``shared_memory=True``, for a blocking or persistent call whose op and dtype ``shm`` reduces)
runs ``shm`` from ``SHM_MIN_BYTES`` on (``shm_wins``): at every size where ``shm`` reads the
other ranks' buffers in place (``single_copy``: ``shm.single_copy_expected``, a core
per rank on Linux) or the node has fewer cores than ranks; else -- copying through its window
with a core per rank -- up to ``SHM_MAX_BYTES``. Measured on this machine (docs/performance.md,
"shm"; interleaved bench runs): at N = 2 on 2 cores, reading in place, shm was 1.3-1.5x MPI's
own from 16 KiB to 512 KiB and 1.0-1.3x at 1-4 MiB in the machine's quick state (the ring and
Rabenseifner 1.1-1.2x, level with it from 2 MiB), 1.2-3.7x from 8 to 64 MiB, and in the
three-run tables the fastest mpicoll all-reduce from 32 KiB to 32 MiB; copying through the window
it led only up to 64 KiB, level with the ring at 128 KiB and behind it from 256 KiB; with more
ranks than cores (N = 3 and 4 on 2 cores) it won at every size from 64 KiB, 1.1-2.8x MPI's own,
where every message-passing step waits for a core. Below 16 KiB recursive doubling did about as
well. The decision table and the cost model never choose it (it runs only on one node, and not
in every form of call).

When the ranks span several nodes and the chosen algorithm is a ring, ``auto`` runs it in node
order (``ring_order``: one hop per node boundary leaves a node, whatever the placement), unless
``MPICOLL_RING_ORDER`` says otherwise.

Every choice is valid for any N and count (each algorithm here is), and all ranks pass the same
arguments, so all ranks choose the same algorithm.
"""

from __future__ import annotations

import functools
import json

from . import model, settings
from .registry import lookup
from .shm.policy import SHM_MAX_BYTES, SHM_MIN_BYTES, shm_wins  # noqa: F401 (shm's band, here)

__all__ = ["allreduce", "reduce_scatter_block", "allgather", "bcast", "choose", "ring_order",
           "without_library", "reload", "SHORT_MSG", "SHM_MIN_BYTES", "SHM_MAX_BYTES",
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


def _from_table(collective: str, nbytes: int, size: int) -> str | None:
    ranges = _table().get(collective, {}).get(str(size))
    if not ranges:
        return None
    for entry in ranges:                  # sorted by max_bytes (null: no upper end)
        if entry["max_bytes"] is None or nbytes <= entry["max_bytes"]:
            return entry["algorithm"]
    return None


def _from_model(collective: str, nbytes: int, size: int, ranks_per_node) -> str | None:
    profile = model.default_profile()
    predicted = model.predict_all(size, nbytes, profile, collective=collective,
                                  ranks_per_node=ranks_per_node)
    predicted = {name: t for name, t in predicted.items()     # auto gives every rank one result
                 if not lookup(collective, name).has("own-rounding")
                 and not lookup(collective, name).has("shared-memory")}    # see the module doc
    return min(predicted, key=predicted.get)


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
    return (_from_table(collective, nbytes, size)
            or _from_model(collective, nbytes, size, ranks_per_node)
            or _classic(collective, nbytes, size, count))


@settings.on_reload
def reload() -> None:
    """Forget cached decisions, tables and profiles (after changing the environment)."""
    for cached in (choose, _table, model.default_profile):
        cached.cache_clear()


def allreduce(nbytes: int, size: int, count: int, ranks_per_node: int | None = None,
              shared_memory: bool = False, single_copy: bool = False) -> str:
    """``shared_memory``: every rank is on one node and the call can run ``shm``;
    ``single_copy``: ``shm`` would read in place there (``shm_wins``)."""
    if shared_memory and shm_wins(nbytes, size, single_copy=single_copy):
        return "shm"
    return choose("allreduce", nbytes, size, count, ranks_per_node)


def reduce_scatter_block(nbytes: int, size: int) -> str:
    return choose("reduce_scatter_block", nbytes, size, nbytes)


def allgather(nbytes: int, size: int) -> str:
    return choose("allgather", nbytes, size, nbytes)


def bcast(nbytes: int, size: int) -> str:
    return choose("bcast", nbytes, size, nbytes)


def without_library(collective: str, nbytes: int, size: int, count: int) -> str:
    """``auto``'s choice where the MPI library can't run the call (a type it has no datatype
    for, e.g. bfloat16): MPICH's classic rule, which names only mpicoll's own algorithms."""
    return _classic(collective, nbytes, size, count)


def ring_order(nodes) -> str | None:
    """The ring order ``auto`` runs on ``nodes``: ``"node"`` when they are several, unless
    ``MPICOLL_RING_ORDER`` is set (None: the declared default, or the variable, decides)."""
    if settings.get("MPICOLL_RING_ORDER") is None and len(nodes) > 1:
        return "node"
    return None
