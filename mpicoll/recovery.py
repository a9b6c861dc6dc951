"""After a rank dies: the survivors' communicator, ULFM's calls, and who keeps the others waiting.

    try:
        mpicoll.allreduce(x, out, comm=comm)
    except mpicoll.ProcessFailed as e:      # every survivor, naming the same e.ranks
        comm = mpicoll.shrink(comm)         # the survivors, in rank order, ready for every algorithm

The failure detector (``_runtime/detector.py``) finds a death within seconds and the survivors
agree on it; ``shrink`` makes a communicator of the others (``MPI_Comm_create_group`` over the
survivors only: it needs no dead rank, unlike ``MPI_Comm_split``, and works where the MPI
library's own ULFM does not -- docs/reliability.md). ``mpicoll.Comm`` offers ULFM's names with
ULFM's meaning on top of these: ``Revoke``, ``Is_revoked``, ``Agree``, ``Shrink``,
``Get_failed``, ``Ack_failed``.

``stats(comm)`` says who kept the others waiting: every rank notes when it enters each call
(``CommState.entered``), and ``stats`` (collective) puts those times on one clock.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np
from mpi4py import MPI

from ._runtime import context, detector, stragglers
from ._runtime.watch import kept
from .errors import CollectiveTimeout

__all__ = ["shrink", "stats", "revoke", "is_revoked", "agree", "get_failed", "ack_failed"]

SHRINK_TAG = 7700           # MPI_Comm_create_group's tag: SHRINK_TAG + how many ranks failed
_ABANDONED: list = []       # the groups of creates left behind on a dead member (never freed),
                            # and agree's collectives left unfinished, with their buffers

stats = stragglers.stats
_mpi = stragglers.communicator
_deadline = stragglers.deadline


def _watched(comm: MPI.Intracomm):
    st = context.known(comm)
    return None if st is None else st.watched


def shrink(comm=None, *, timeout: float | None = None) -> MPI.Intracomm:
    """A new communicator of ``comm``'s living ranks, in rank order (ULFM's ``MPI_Comm_shrink``).

    Called by every survivor. The dead ranks are those the survivors agreed on (the failure
    detector); a rank that dies during the call is found and the survivors start again without
    it. Nothing of ``comm`` carries over: the new communicator's first mpicoll call sets it up
    afresh (duplicate, node layout, shared memory, plans, the hash history). ``comm`` itself
    stays broken: free it when done. Raises ``CollectiveTimeout`` past ``timeout`` (default
    ``MPICOLL_TIMEOUT``)."""
    comm = _mpi(comm)
    w = _watched(comm)
    if w is not None and w.excluded is not None:    # the others went on without this rank
        raise detector.failure(context.known(comm), "shrink")
    end = _deadline(timeout)
    while True:
        failed = detector.settle(w) if w is not None else frozenset()
        group = comm.Get_group()
        survivors = group.Excl(sorted(failed)) if failed else group
        made = _create_group(comm, survivors, SHRINK_TAG + len(failed), w, failed, end)
        if made is None:        # left to a helper still inside MPI_Comm_create_group: its
            _ABANDONED.append((group, survivors))   # groups must outlive it (freed, MPICH asserts)
            continue
        if survivors != group:
            survivors.Free()
        group.Free()
        return made


def _create_group(comm, group, tag: int, w, failed: frozenset, end: float):
    """``comm.Create_group(group, tag)`` -- None if another rank died meanwhile (start again).
    With ``MPI_THREAD_MULTIPLE`` it runs on a helper thread while this one watches for deaths
    (a call stuck on a dead member is left behind); without, it is called here."""
    if w is None or MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        return _create(comm, group, tag)
    box: list = []

    def create() -> None:
        try:
            box.append(_create(comm, group, tag))
        except BaseException as exc:        # noqa: BLE001 - handed to the caller
            box.append(exc)

    helper = threading.Thread(target=create, name="mpicoll-shrink", daemon=True)
    helper.start()
    while not box:
        if w.known - failed:
            return None
        if time.monotonic() > end:
            raise CollectiveTimeout("shrink", "MPI_Comm_create_group over the survivors", 0,
                                    timeout=None)
        helper.join(0.002)
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


def _create(comm, group, tag: int) -> MPI.Intracomm:
    """``comm.Create_group(group, tag)`` -- except where the MPI library runs with its own ULFM
    (Open MPI's ``mpirun --with-ft ulfm``, which sets ``OMPI_MCA_mpi_ft_enable``): it refuses
    that, or not, on a communicator with a dead process (``MPI_ERR_PROC_FAILED`` on one rank
    while another waited in it), so there every survivor calls its ``MPIX_Comm_shrink``, which
    agrees among the survivors as this module does."""
    if _library_ulfm() and hasattr(comm, "Shrink"):
        return comm.Shrink()
    return comm.Create_group(group, tag)


def _library_ulfm() -> bool:
    return os.environ.get("OMPI_MCA_mpi_ft_enable", "").lower() in ("1", "true", "yes")


def revoke(comm) -> None:
    """ULFM's ``MPI_Comm_revoke``: every rank's current and later mpicoll calls on ``comm`` fail
    (``CommunicatorBroken`` naming this rank) -- here at once, elsewhere within a heartbeat."""
    comm = _mpi(comm)
    st = context.attach(comm)
    st.mark_broken(f"Revoked: rank {comm.Get_rank()} revoked the communicator (Comm.Revoke)")
    detector.revoke(st)


def is_revoked(comm) -> bool:
    """ULFM's ``MPI_Comm_is_revoked``: a rank revoked ``comm`` (this one or another)."""
    st = context.known(_mpi(comm))
    return st is not None and bool(st.broken) and (
        st.broken.startswith("Revoked") or (st.watched is not None
                                            and st.watched.revoked_by is not None))


def get_failed(comm) -> MPI.Group:
    """ULFM's ``MPI_Comm_get_failed``: the group of ``comm``'s ranks known dead here."""
    comm = _mpi(comm)
    w = _watched(comm)
    group = comm.Get_group()
    try:
        return group.Incl(sorted(w.known) if w is not None else [])
    finally:
        group.Free()


def ack_failed(comm, num_to_ack: int | None = None) -> int:
    """ULFM's ``MPI_Comm_ack_failed``: acknowledge the first ``num_to_ack`` failures known here
    (all by default; in the order found); returns how many are acknowledged. ``agree`` raises
    ``ProcessFailed`` while a failure is not."""
    w = _watched(_mpi(comm))
    if w is None:
        return 0
    known = sorted(w.known)
    count = len(known) if num_to_ack is None else min(max(num_to_ack, 0), len(known))
    w.acked = max(w.acked, count)
    return w.acked


def agree(comm, flag: int, *, timeout: float | None = None) -> int:
    """ULFM's ``MPI_Comm_agree``: the bitwise AND of ``flag`` over the living ranks, the same on
    each of them although ranks die (a death during it starts it again without that rank). If
    a failure is known that ``ack_failed`` did not acknowledge, raises ``ProcessFailed`` after
    agreeing, with the agreed value as its ``flag``."""
    comm = _mpi(comm)
    w = _watched(comm)
    end = _deadline(timeout)
    while True:
        failed = detector.settle(w) if w is not None else frozenset()
        survivors = shrink(comm, timeout=max(end - time.monotonic(), 1e-3))
        value, result = np.array([int(flag)], np.int64), np.empty(1, np.int64)
        request = survivors.Iallreduce(value, result, op=MPI.BAND)
        while not request.Test():
            if w is not None and w.known - failed:
                break                       # a death meanwhile: again, without it
            if time.monotonic() > end:
                _ABANDONED.append(kept([request], (value, result)))
                raise CollectiveTimeout("agree", "MPI_Iallreduce over the survivors", 0)
            time.sleep(1e-4)
        else:
            survivors.Free()
            break
        _ABANDONED.append(kept([request], (value, result)))     # (MPI may still write them)
    agreed = int(result[0])
    if w is not None and len(w.known) > w.acked:
        error = detector.failure(context.known(comm), "agree")
        error.flag = agreed
        raise error
    return agreed
