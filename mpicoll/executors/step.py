"""What every executor does at the end of a step: reduce what arrived into the buffer.

A step's reduced receives land in scratch (``Schedule.plan``: ``(peer, lo, hi, reduce, left,
scratch_lo, into)``); once all its transfers are complete, each is reduced in plan order into
``buf[lo:hi]`` -- or, with ``into`` >= 0 (``Recv.into_next``), into the next receive's vector
at ``scratch[into:]`` -- ``acc = op(acc, incoming)`` or, with ``left``, ``op(incoming, acc)``.
"""

from __future__ import annotations

__all__ = ["reduce_received"]


def reduce_received(buf, scratch, recvs, reduce_into) -> None:
    for _, lo, hi, reduce, left, at, into in recvs:
        if not reduce:
            continue
        acc = buf[lo:hi] if into < 0 else scratch[into:into + hi - lo]
        incoming = scratch[at:at + hi - lo]
        if left:                        # acc = op(incoming, acc)
            reduce_into(incoming, acc)
            acc[...] = incoming
        else:                           # acc = op(acc, incoming)
            reduce_into(acc, incoming)
