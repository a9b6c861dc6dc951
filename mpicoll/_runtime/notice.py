"""Notices: a rank whose call failed tells the others of that call at once.

A collective is one call on every rank, so an error on one rank -- its own checks raised (a
``TypeError`` for a list, a bad count, a bad setting), or it gave up on the call -- would leave
the others waiting for its messages until their deadline. Instead the failing rank posts a
*notice* to every other rank: one small nonblocking message on mpicoll's duplicate of the
communicator, with the tag ``MPI_TAG_UB - 2`` that calls never use (``tags.tag_space``), holding

    [call, broken] (int64)  +  "TypeError: sendbuf must be an array, got list"

``call`` is the call's number on the communicator (counted from 1: ``CommState.calls``; the
failing rank takes its number too, so the numbering stays the same on every rank), ``broken``
whether the sender will use the communicator again. A rank waiting in a call looks for notices
while it waits -- not in its first ``watch.LOOK_AFTER`` seconds, so a call that completes at
once pays nothing -- and then decides (``judge``):

* a notice of the call it is in: ``PeerError`` naming the rank and its message (its own
  transfers of that call are in flight: the communicator is broken here);
* of a call it failed itself too (every rank passed a list): dropped;
* of a later call (it is still finishing an earlier one): kept until it gets there;
* of an earlier call it completed (a ``bcast`` root whose sends completed without the failing
  receiver): ``PeerError`` if the sender's communicator is broken (it will not take part in
  later calls), else dropped (the sender raised its own error and goes on with the same
  numbering).

A rank that raises ``PeerError`` with its call under way posts a ``broken`` notice in turn, so
that a rank which completed that call (and so will wait in its next one) learns of it too.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ..errors import ArgumentMismatch, PeerError, ReportedMismatch
from .tags import tag_ub

__all__ = ["notice_tag", "post", "collect", "judge", "register", "lookup", "NOTICE_TAG_OFFSET"]

NOTICE_TAG_OFFSET = 2       # the notices' tag: MPI_TAG_UB - 2
OWN, BROKEN, RELAYED = 0, 1, 2  # the sender's own error before communicating (communicator kept),
                                # its call failed mid-way, it relays a PeerError (both: broken)
_HEAD = 16                  # bytes: call, broken (two int64)

_states: dict = {}          # communicator handle (py2f) -> its CommState (the parent's and the dup's)


def notice_tag() -> int:
    return tag_ub() - NOTICE_TAG_OFFSET


def register(comm: MPI.Comm, state) -> None:
    """Let a ``Watch`` waiting on ``comm`` find ``state`` (for its notices and recent tags)."""
    _states[comm.py2f()] = state


def forget(comm: MPI.Comm) -> None:
    try:
        _states.pop(comm.py2f(), None)
    except MPI.Exception:
        pass


def lookup(comm: MPI.Comm):
    """The ``CommState`` whose parent or duplicate is ``comm``, or None."""
    try:
        return _states.get(comm.py2f())
    except MPI.Exception:
        return None


def post(state, call: int, broken: int, text: str) -> None:
    """Tell every other rank of ``state``'s communicator that call ``call`` failed here
    (``text``: the error); nonblocking (the message is small: it completes eagerly), its
    requests kept alive in ``state.outbox``."""
    comm = state.comm
    me, size = comm.Get_rank(), comm.Get_size()
    msg = np.concatenate([np.array([call, int(broken)], np.int64).view(np.uint8),
                          np.frombuffer(text.encode(errors="replace")[:4000], np.uint8)])
    tag = notice_tag()
    state.sent([(msg, comm.Isend(msg, peer, tag)) for peer in range(size) if peer != me])


def collect(comm: MPI.Comm) -> list:
    """Receive every notice that has arrived on ``comm``: ``[(rank, call, kind, text)]``
    (kind: ``OWN``, ``BROKEN``, ``RELAYED``)."""
    tag, status, got = notice_tag(), MPI.Status(), []
    while comm.Iprobe(MPI.ANY_SOURCE, tag, status):
        msg = np.empty(status.Get_count(MPI.BYTE), np.uint8)
        comm.Recv(msg, status.Get_source(), tag)
        call, broken = (int(v) for v in msg[:_HEAD].view(np.int64))
        got.append((status.Get_source(), call, broken, msg[_HEAD:].tobytes().decode(
            errors="replace")))
    return got


def judge(state, current: int, what: str) -> PeerError | None:
    """Act on ``state``'s notices for a rank in call ``current`` (absolute number): the
    ``PeerError`` to raise, or None (kept or dropped as the module's doc says). Relayed
    notices are named only when no first-hand one is there (the ranks' messages then agree)."""
    keep, fatal = [], []
    for rank, call, broken, text in state.notices:
        if call in state.failed_here:
            continue
        if call == current or (call < current and broken):
            fatal.append((rank, call, broken, text))
        elif call > current:
            keep.append((rank, call, broken, text))
    state.keep_notices(keep)
    if not fatal:
        return None
    first_hand = [n for n in fatal if n[2] != RELAYED]
    if first_hand:                  # a rank that only relays another's error: not named
        fatal = first_hand
    errors = {}
    for rank, call, broken, text in fatal:
        errors.setdefault(rank, (call, broken, text))
    first = min(call for _, call, _, _ in fatal)
    parts = []
    for rank, (call, broken, text) in sorted(errors.items()):
        where = "this call" if call == current else f"an earlier call (#{call}, which completed here)"
        parts.append(f"rank {rank} failed in {where}: {text}")
    mismatch = all(text.startswith(ArgumentMismatch.__name__ + ":")
                   for _, _, text in errors.values())
    kind = ReportedMismatch if mismatch else PeerError     # (the call's own kind, everywhere)
    return kind(f"{what}: " + "; ".join(parts) + " -- so this call cannot complete",
                errors, {r: t for r, (_, _, t) in errors.items()}, first)
