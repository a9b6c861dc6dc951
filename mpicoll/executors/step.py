"""A step, as the executors run it: what every executor does at the end of one (reduce what
arrived into the buffer, ``reduce_received``), and the progress executor's tables of them
(``posted_steps``).

A step's reduced receives land in scratch (``Schedule.plan``: ``(peer, lo, hi, reduce, left,
scratch_lo, into)``); once all its transfers are complete, each is reduced in plan order into
``buf[lo:hi]`` -- or, with ``into`` >= 0 (``Recv.into_next``), into the next receive's vector
at ``scratch[into:]`` -- ``acc = op(acc, incoming)`` or, with ``left``, ``op(incoming, acc)``.
"""

from __future__ import annotations

import numpy as np

from .. import compression

__all__ = ["reduce_received", "posted_steps"]

_ALIGN = 8                      # wire slots start at multiples of 8 bytes


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


def posted_steps(schedule, buf: np.ndarray, codec=None, cuts=None, owner=None) -> tuple:
    """The progress executor's step tables (``progress.Request``: made once per request, so that
    posting a step makes no view): per step of ``schedule.plan`` over ``buf``, (recvs, sends,
    bytes_sent, bytes_received). ``codec`` (``mpicoll.compression``) and its ``cuts``: the
    wire format; the wire buffers are ``owner``'s (``compression.wire_buffers``).

    recv: (peer, array received into, decode (wire, lo, target) or None,
           reduce (acc, incoming, left) or None; acc is the next receive's scratch for
           ``Recv.into_next``; with a codec, incoming is the wire (``Codec.add``: decoded
           and summed in one pass) unless the receive is an ``into_next`` one's
           accumulator, decoded first into scratch); send: (peer, array sent,
           encode (source slice, lo, wire) or None).
    """
    itemsize = buf.itemsize
    scratch = np.empty(schedule.scratch_elements, buf.dtype)

    def size(lo, n):
        return codec.wire_bytes(lo, n, cuts) if codec else n * itemsize

    def slots(extents):             # byte offsets of aligned slots, and their total
        offsets, total = [], 0
        for lo, n in extents:
            offsets.append(total)
            total += -(-size(lo, n) // _ALIGN) * _ALIGN
        return offsets, total

    wire_in = wire_out = None
    if codec:
        need_in = max((slots([(lo, hi - lo) for _, lo, hi, *_ in recvs])[1]
                       for recvs, _ in schedule.plan), default=0)
        need_out = max((slots([(lo, hi - lo) for _, lo, hi in sends])[1]
                        for _, sends in schedule.plan), default=0)
        wire_in, wire_out = compression.wire_buffers(owner, need_in, need_out)
    steps = []
    for recvs, sends in schedule.plan:
        r_off, _ = slots([(lo, hi - lo) for _, lo, hi, *_ in recvs])
        s_off, _ = slots([(lo, hi - lo) for _, lo, hi in sends])
        step_recvs, step_sends = [], []
        accs = {into for *_, into in recvs}
        for (src, lo, hi, reduce, left, at, into), off in zip(recvs, r_off):
            target = scratch[at:at + hi - lo] if reduce else buf[lo:hi]
            acc = buf[lo:hi] if into < 0 else scratch[into:into + hi - lo]
            red = (acc, target, left) if reduce else None
            if codec:
                wire = wire_in[off:off + size(lo, hi - lo)]
                if reduce and at not in accs:
                    step_recvs.append((src, wire, None, (acc, (wire, lo), left)))
                else:
                    step_recvs.append((src, wire, (wire, lo, target), red))
            else:
                step_recvs.append((src, target, None, red))
        for (dst, lo, hi), off in zip(sends, s_off):
            if codec:
                wire = wire_out[off:off + size(lo, hi - lo)]
                step_sends.append((dst, wire, (buf[lo:hi], lo, wire)))
            else:
                step_sends.append((dst, buf[lo:hi], None))
        steps.append((tuple(step_recvs), tuple(step_sends),
                      sum(size(lo, hi - lo) for _, lo, hi in sends),
                      sum(size(lo, hi - lo) for _, lo, hi, *_ in recvs)))
    return tuple(steps)
