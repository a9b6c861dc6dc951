"""Whether a wait may spin: not when this node's ranks outnumber the cores this process may run
on (``MPICOLL_YIELD_WHEN_IDLE``, named after Open MPI's ``mpi_yield_when_idle``).

Spinning pays on a quiet node with a core per rank: the rank waited for is running, and a flag
or a message is seen within a microsecond of its arrival. On an oversubscribed node (N = 4 on 2
cores) the rank waited for is most often descheduled, waiting for the very core the spinner
holds: every microsecond spun is taken from it. Open MPI then sets its MCA parameter
``mpi_yield_when_idle`` itself (its progress loop, ``opal_progress``, calls ``sched_yield``
when a pass found nothing), MPICH offers ``MPIR_CVAR_POLLS_BEFORE_YIELD``, and UPC++ turns
``UPCXX_OVERSUBSCRIBED`` on when unset and the ranks on the machine outnumber its CPUs
(snake0/upcxx-2020.3.2, docs/oversubscription.md). Here a *crowded*
process's waits spin little or not at all and sleep at once: ``shm``'s flag waits nap on the
window's futex after ``window.CROWDED_SPIN_SECONDS`` (``window.Patience``), the progress thread
sleeps without its yields (``engine._CROWDED_YIELDS``), and ``Request.wait`` looks for up to
``progress._CROWDED_HELP`` (1 ms) sleeping between looks, where it would yield; the blocking
executors' polls hand over to the ``Watch`` after 20 us, whose first 2 ms of sleeps are 10 us
naps (MPI moves a collective only inside this rank's polls: ``NAPS_SECONDS``), as are a
caller's between looks at requests it moves itself (``Buckets`` on a full node; a quiet node's
caller yields ``progress._WAIT_YIELDS`` looks: a crowded one's yield would hand the core to
another job for a time slice, docs/training.md). Every wait
still returns to Python as often as before (deadlines, Ctrl-C, the failure detector).

Beside it, two answers the same facts give: whether the node has no core to spare at all
(``full``: ranks at least the cores, so ``Buckets`` move their requests in the caller's calls),
and who advances nonblocking requests (``progress_mode``, ``MPICOLL_PROGRESS``).

The ranks on this node: the most any communicator's layout has shown (``note``, from each
``CommState``'s ``real_nodes``), or the launcher's count if higher
(MPICH's Hydra: ``MPI_LOCALNRANKS``; Open MPI: ``OMPI_COMM_WORLD_LOCAL_SIZE``).
"""

from __future__ import annotations

import os

from . import settings

__all__ = ["oversubscribed", "crowded", "full", "note", "ranks_on_node", "progress_mode",
           "NAPS_SECONDS", "next_pause"]

NAPS_SECONDS = 2e-3             # a crowded wait on MPI requests sleeps 10 us this long, then
                                # doubles its sleeps (MPI moves only inside this rank's polls)


def next_pause(pause: float, waited: float, naps: bool) -> float:
    """The sleep after one of ``pause`` s in a wait on MPI requests that has lasted ``waited``
    s: the same for ``NAPS_SECONDS`` when ``naps`` (a crowded process), else twice as long, up
    to 1 ms."""
    return pause if naps and waited < NAPS_SECONDS else min(2 * pause, 1e-3)

_LAUNCHER_COUNTS = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE")
_noted = 0                      # the most ranks seen on this node
_crowded = None                 # crowded()'s answer, until a note or settings.reload()


def oversubscribed(ranks_on_node: int, cores: int, setting: str = "auto") -> bool:
    """Whether waits should not spin: ``setting`` ``"1"`` always, ``"0"`` never, ``"auto"``
    when ``ranks_on_node`` outnumber ``cores``."""
    if setting != "auto":
        return setting == "1"
    return ranks_on_node > cores


def ranks_on_node() -> int:
    """The ranks known on this node: the most ``note`` was told, or the launcher's count."""
    launched = 0
    for name in _LAUNCHER_COUNTS:
        try:
            launched = int(os.environ[name])
            break
        except (KeyError, ValueError):
            continue
    return max(_noted, launched, 1)


def note(ranks: int) -> None:
    """A communicator's layout (or a window) has ``ranks`` ranks on this node."""
    global _noted, _crowded
    if ranks > _noted:
        _noted, _crowded = ranks, None


def crowded() -> bool:
    """This process's waits should not spin (``oversubscribed`` on this node; kept)."""
    global _crowded
    if _crowded is None:
        _crowded = oversubscribed(ranks_on_node(), len(os.sched_getaffinity(0)),
                                  settings.get("MPICOLL_YIELD_WHEN_IDLE"))
    return _crowded


def full() -> bool:
    """No core to spare on this node: its ranks at least as many as the cores this process may
    run on (``crowded`` or just full). A progress thread then computes on a core a rank's
    compute needs: ``Buckets`` advance their requests in the caller's own calls instead."""
    return crowded() or ranks_on_node() >= len(os.sched_getaffinity(0))


def progress_mode() -> str:
    """``"thread"`` or ``"caller"``: who advances nonblocking requests (``MPICOLL_PROGRESS``;
    executors/progress.py's doc); ``thread`` needs ``MPI_THREAD_MULTIPLE``."""
    from mpi4py import MPI
    wanted = settings.get("MPICOLL_PROGRESS")
    if wanted == "caller":
        return "caller"
    level = MPI.Query_thread()
    if level < MPI.THREAD_MULTIPLE:
        if wanted == "thread":
            names = {MPI.THREAD_SINGLE: "SINGLE", MPI.THREAD_FUNNELED: "FUNNELED",
                     MPI.THREAD_SERIALIZED: "SERIALIZED"}
            raise RuntimeError(
                f"MPICOLL_PROGRESS=thread needs MPI_THREAD_MULTIPLE, but MPI was initialised "
                f"with MPI_THREAD_{names.get(level, level)}; set mpi4py.rc.thread_level = "
                "'multiple' before importing mpi4py.MPI, or use MPICOLL_PROGRESS=caller")
        return "caller"
    return "thread"


@settings.on_reload
def _forget() -> None:
    global _crowded
    _crowded = None
