"""Compression on the wire: fp32 values sent as bf16, fp16 or int8, reduced in fp32 at each hop.

    mpicoll.allreduce(grad, compress="bf16")                          # half the bytes
    ef = mpicoll.ErrorFeedback(grad.size)
    mpicoll.allreduce(grad, compress="int8", error_feedback=ef)       # a quarter, plus scales

A codec is a *rounding* ``R`` of fp32 values plus its wire format. The progress executor
(``mpicoll.executors.progress``) applies it in three places, each one pass over the slice:

1. on every send of a schedule, ``Codec.send`` encodes the slice into a wire buffer and rounds
   the sender's own copy in the same pass (so the sender keeps exactly the value it sent);
2. the receiver decodes and reduces in fp32 in one pass (``Codec.add``; only a receive that is
   an ``Recv.into_next`` accumulator is decoded into scratch first), or decodes a copy
   straight into its buffer;
3. when the collective ends, every rank rounds what it may still hold unrounded, ``buf =
   R(buf)`` on the slices ``unrounded`` names: a reduction wrote them (or nothing touched
   them) after the rank last sent or received them. The ring leaves none.

Why every rank then ends with the same bits: ``R`` acts piece by piece on fixed pieces of the
flat buffer (bf16, fp16: each element; int8: the pieces below) and is idempotent,
``R(R(x)) == R(x)``, also on any sub-slice. In the blocking executor two ranks end with the
same bits because one copied the other's value, or both computed the same reduction in the same
operand order (``Recv.left``). With (1) a copy is ``R(v)`` at both ends; twins that computed the
same ``v`` may differ only in that one of them has since sent it (``R(v)``) and the other not
(``v``) -- recursive doubling's fold of a non-power-of-two size does exactly that -- and (3)
maps both to ``R(v)``: the one that sent it holds ``R(v)`` already, and ``R`` would not change
it (which is why (3) may skip every slice sent or copied since its last reduction). So the
result is the rounded final sum, identical everywhere. On one rank nothing is sent, so nothing is rounded: the
result is the input, and error feedback's residual stays as it was.

What a call moves through memory (bf16, ring at 2 ranks, per rank, in units of the fp32
buffer's size: a read and a write of it are 2): ``Codec.send`` of each half reads it and writes
half as much wire (and the rounded value, unless already rounded), ``Codec.add`` reads the wire
and reads and writes its half, the copy's decode reads wire and writes its half, and MPI moves
the wire, half the uncompressed call's bytes: about as much as the uncompressed call (read,
write and reduce scratch), not less. Error feedback adds its residual, read and written once
(2 more), by riding on those first passes (``first_touches``). A request's wire buffers are
reused from requests gone before (``wire_buffers``): fresh ones cost a page fault per 4 KiB at
the first encode, more than the encode. So on one node, where memory is the wire, compression
saves no time; it pays where the link is slower than memory (docs/training.md).

* ``bf16``: the top 16 bits of the fp32, rounded to nearest, ties to even (NaN stays a quiet
  NaN); 2 bytes per element. Same exponent range as fp32: no overflow.
* ``fp16``: IEEE half, round to nearest even, as ``numpy.float16`` (subnormals, overflow to
  infinity); 2 bytes per element. Gradients above 65504 become infinity: scale them first.
* ``int8``: each *piece* sends one fp32 scale, a power of two ``s >= max|x| / 127``, and
  ``round(x / s)`` as int8 (ties to even). The pieces are fixed per collective: the flat buffer
  cut at every multiple of ``CHUNK`` and at every slice edge of every rank's schedule
  (``schedule_cuts``), so every slice a schedule sends is a union of whole pieces and a piece
  always gets the same scale from the same values. A power-of-two scale makes ``x / s`` and
  ``q * s`` exact, so re-rounding a rounded piece, or any part of it, changes nothing.
  1 byte per element plus 4 per piece (about n/CHUNK + the schedule's slices: <= 1/4 + ~1/64
  of fp32's bytes). Inputs must be finite: a piece holding a NaN or infinity decodes as NaN.

``ErrorFeedback`` (Seide et al. 2014 1-bit SGD; Stich et al. 2018): before a compressed call the
rank's input becomes ``x = g + e`` (``e`` the residual kept from the previous call), is rounded
to ``R(x)`` -- which is then exactly what its first send carries -- and ``e = x - R(x)`` is kept.
So the rank's own rounding error is not lost, only delayed. Rounding of partial sums at later
hops is not fed back (no rank owns it). The progress executor does this in the pass that first
touches each slice -- the send that encodes it, or the reduction that adds into it (``fed=`` of
``Codec.send``/``add``) -- and before the run only where another op comes first
(``first_touches``): each element still gets ``R(x)`` from the input it was given, so the bits
are those of ``ErrorFeedback.apply`` on the whole buffer first (``Codec.feedback``), which a
test checks for every scheduled algorithm.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np

from . import kernels
from .codec_kernels import (CHUNK, bf16_encode, bf16_decode, bf16_round, bf16_send, bf16_add,
                            bf16_feedback, bf16_send_fed, bf16_add_fed, fp16_encode, fp16_decode,
                            fp16_round, fp16_send, fp16_add, fp16_feedback, fp16_send_fed,
                            fp16_add_fed, int8_encode, int8_decode, int8_round, int8_send, int8_add,
                            int8_feedback, int8_send_fed, int8_add_fed)

__all__ = ["CODECS", "CHUNK", "Codec", "codec", "check_feedback", "cuts", "schedule_cuts",
           "unrounded", "first_touches", "wire_buffers", "failed", "ErrorFeedback",
           "bf16_encode", "bf16_decode", "fp16_encode", "fp16_decode",
           "int8_encode", "int8_decode", "int8_round"]



def cuts(count: int, boundaries=()) -> np.ndarray:
    """int8's pieces of a buffer of ``count`` elements: cut at every multiple of ``CHUNK`` and
    at ``boundaries`` (every slice edge of every rank's schedule), as sorted absolute offsets
    ending at ``count``."""
    edges = set(range(CHUNK, count, CHUNK))
    edges.update(b for b in boundaries if 0 < b < count)
    edges.add(max(count, 1))
    return np.array(sorted(edges), np.int64)


def schedule_cuts(count: int, schedules) -> np.ndarray:
    """``cuts`` for the slice edges of ``schedules`` (those of every rank of one collective)."""
    return cuts(count, {e for sched in schedules for step in sched.steps
                        for op in step for e in (op.lo, op.hi)})


def unrounded(count: int, plan) -> list:
    """The slices ``(lo, hi)`` of a rank's buffer that may not be rounded when its schedule's
    ``plan`` (``Schedule.plan``) ends, compressed: its input, less every slice it sent since
    (rounded as sent) or received as a copy (decoded), plus every slice a reduction wrote since
    (a fresh fp32 sum). Only these need the final ``R`` (``R`` is idempotent)."""
    edges, at = _edges(count, plan)
    dirty = np.ones(len(edges) - 1, bool)
    for recvs, sends in plan:
        for _, lo, hi in sends:
            dirty[at[lo]:at[hi]] = False
        for _, lo, hi, reduce, _, _, into in recvs:
            if into < 0:                # (into_next: the sum waits in scratch)
                dirty[at[lo]:at[hi]] = reduce
    return _merged([(edges[i], edges[i + 1]) for i in np.flatnonzero(dirty)])


def first_touches(count: int, plan) -> tuple:
    """Where error feedback rides on a schedule's first pass over its input: ``(steps,
    before)``. ``steps[s] = (sends, recvs)`` says, per send and receive of step ``s``
    (``Schedule.plan``'s order), whether it is the first op of the run to touch every element
    of its slice and can add the residual in the same pass: a send (``Codec.send``), or a
    reduction into the buffer (``Codec.add``: not an ``into_next`` one's accumulator, which
    is decoded into scratch first). ``before``: the slices ``(lo, hi)`` no such op touches
    first, where the residual is added before the run (``Codec.feedback``). Either way each
    element gets ``R(x / d + e)`` from the input it was given, as if fed back whole first."""
    edges, at = _edges(count, plan)
    toucher = np.full(len(edges) - 1, -1)       # per piece between edges: the first op's id
    ops = []                                    # per op id: (its pieces, whether it can feed)
    for recvs, sends in plan:
        accs = {into for *_, into in recvs}
        step = [(lo, hi, True) for _, lo, hi in sends]
        step += [(lo, hi, reduce and scratch_at not in accs) if into < 0 else (lo, lo, False)
                 for _, lo, hi, reduce, _, scratch_at, into in recvs]   # (into_next: scratch)
        for lo, hi, can in step:
            pieces = toucher[at[lo]:at[hi]]
            pieces[pieces < 0] = len(ops)
            ops.append((at[lo], at[hi], can))
    fed = [can and bool((toucher[a:b] == k).all()) for k, (a, b, can) in enumerate(ops)]
    steps, k = [], 0
    for recvs, sends in plan:
        steps.append((tuple(fed[k:k + len(sends)]),
                      tuple(fed[k + len(sends):k + len(sends) + len(recvs)])))
        k += len(sends) + len(recvs)
    before = [(edges[i], edges[i + 1]) for i in range(len(edges) - 1)
              if toucher[i] < 0 or not fed[toucher[i]]]
    return tuple(steps), _merged(before)


def _edges(count: int, plan) -> tuple:
    """Every slice edge of ``plan``'s sends and receives, with 0 and ``count``, sorted; and
    each edge's index: the pieces between them are what ``unrounded`` and ``first_touches``
    follow."""
    edges = sorted({0, count} | {e for recvs, sends in plan for op in recvs + sends
                                 for e in op[1:3]})
    return edges, {e: i for i, e in enumerate(edges)}


def _merged(slices: list) -> list:
    """Sorted slices, the adjacent ones joined."""
    out = []
    for lo, hi in slices:
        if out and out[-1][1] == lo:
            out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


def _pieces(lo: int, n: int, cuts: np.ndarray) -> int:
    if n == 0:
        return 0
    return int(np.searchsorted(cuts, lo + n, "left") - np.searchsorted(cuts, lo, "right")) + 1


# ----------------------------------------------------------------------------- codecs

class Codec:
    """One compression mode: wire size, encode, decode, round -- over fp32 slices.

    ``encode(x, lo, wire, cuts)`` writes the slice ``x`` (absolute offset ``lo`` in the flat
    buffer) into the uint8 array ``wire`` of ``wire_bytes(lo, x.size, cuts)`` bytes;
    ``decode(wire, lo, out, cuts)`` is its inverse; ``round(x, lo, cuts)`` is
    ``decode(encode(x))`` in place. ``cuts`` (int8 only; see ``cuts``) fixes the pieces that
    share a scale; None cuts at the multiples of ``CHUNK`` only.
    """

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"Codec({self.name!r})"

    def wire_bytes(self, lo: int, n: int, cuts=None) -> int:
        if self.name == "int8":
            return 4 * _pieces(lo, n, _default(cuts, lo + n)) + n
        return 2 * n

    def encode(self, x: np.ndarray, lo: int, wire: np.ndarray, cuts=None) -> None:
        if self.name == "int8":
            cuts = _default(cuts, lo + x.size)
            c = 4 * _pieces(lo, x.size, cuts)
            int8_encode(x, lo, cuts, wire[:c].view(np.float32), wire[c:].view(np.int8))
        elif self.name == "bf16":
            bf16_encode(x.view(np.uint32), wire.view(np.uint16))
        else:
            fp16_encode(x.view(np.uint32), wire.view(np.uint16))

    def decode(self, wire: np.ndarray, lo: int, out: np.ndarray, cuts=None) -> None:
        if self.name == "int8":
            cuts = _default(cuts, lo + out.size)
            c = 4 * _pieces(lo, out.size, cuts)
            int8_decode(wire[:c].view(np.float32), wire[c:].view(np.int8), lo, cuts, out)
        elif self.name == "bf16":
            bf16_decode(wire.view(np.uint16), out.view(np.uint32))
        else:
            fp16_decode(wire.view(np.uint16), out.view(np.uint32))

    def round(self, x: np.ndarray, lo: int = 0, cuts=None) -> None:
        if self.name == "int8":
            int8_round(x, lo, _default(cuts, lo + x.size))
        elif self.name == "bf16":
            bf16_round(x.view(np.uint32))
        else:
            fp16_round(x.view(np.uint32))

    def send(self, x: np.ndarray, lo: int, wire: np.ndarray, cuts=None, fed=None) -> None:
        """``encode`` and ``round`` in one pass: the sender keeps exactly what it sends.
        ``fed=(e, divide)``: ``feedback`` on the slice first, in the same pass (``e``: the
        slice's residual)."""
        if self.name == "int8":
            cuts = _default(cuts, lo + x.size)
            c = 4 * _pieces(lo, x.size, cuts)
            scales, q = wire[:c].view(np.float32), wire[c:].view(np.int8)
            if fed is None:
                int8_send(x, lo, cuts, scales, q)
            else:
                int8_send_fed(x, lo, cuts, scales, q, fed[0], np.float32(fed[1]))
        elif fed is not None:
            (bf16_send_fed if self.name == "bf16" else fp16_send_fed)(
                x, wire.view(np.uint16), fed[0], np.float32(fed[1]))
        else:
            (bf16_send if self.name == "bf16" else fp16_send)(x.view(np.uint32),
                                                              wire.view(np.uint16))

    def add(self, wire: np.ndarray, lo: int, acc: np.ndarray, left: bool, cuts=None,
            fed=None) -> None:
        """``decode`` and the fp32 sum into ``acc`` in one pass, no scratch: ``acc =
        decoded + acc`` if ``left`` else ``acc + decoded`` (``Recv.left``'s order).
        ``fed=(e, divide)``: ``feedback`` on ``acc`` first, in the same pass."""
        if self.name == "int8":
            cuts = _default(cuts, lo + acc.size)
            c = 4 * _pieces(lo, acc.size, cuts)
            scales, q = wire[:c].view(np.float32), wire[c:].view(np.int8)
            if fed is None:
                int8_add(scales, q, lo, cuts, acc, left)
            else:
                int8_add_fed(scales, q, lo, cuts, acc, left, fed[0], np.float32(fed[1]))
        elif fed is not None:
            (bf16_add_fed if self.name == "bf16" else fp16_add_fed)(
                wire.view(np.uint16), acc, left, fed[0], np.float32(fed[1]))
        else:
            (bf16_add if self.name == "bf16" else fp16_add)(wire.view(np.uint16), acc, left)

    def feedback(self, x: np.ndarray, e: np.ndarray, cuts=None, divide=1, lo: int = 0) -> None:
        """Error feedback in one pass over the slice ``x`` (offset ``lo``) and its residual
        ``e``: ``v = x / divide + e``, ``x = R(v)``, ``e = v - R(v)`` (fp32 arithmetic)."""
        d = np.float32(divide)
        if self.name == "int8":
            int8_feedback(x, lo, e, d, _default(cuts, lo + x.size))
        else:
            (bf16_feedback if self.name == "bf16" else fp16_feedback)(x, e, d)


def _default(given, count: int) -> np.ndarray:
    return cuts(count) if given is None else given


CODECS = {name: Codec(name) for name in ("bf16", "fp16", "int8")}


def codec(compress) -> Codec | None:
    """The codec named ``compress`` (None: no compression); ValueError for another name."""
    if compress is None:
        return None
    if compress not in CODECS:
        raise ValueError(f"compress must be None or one of {sorted(CODECS)}, got {compress!r}")
    return CODECS[compress]


def check_feedback(error_feedback, compress, count: int) -> None:
    """A call's ``error_feedback`` argument: None, or an ``ErrorFeedback`` of ``count``
    elements beside a ``compress`` mode; else the error naming what is wrong."""
    if error_feedback is None:
        return
    if not isinstance(error_feedback, ErrorFeedback):
        raise TypeError(f"error_feedback must be an mpicoll.ErrorFeedback, got "
                        f"{type(error_feedback).__name__}")
    if compress is None:
        raise ValueError("error_feedback needs a compress= mode (it keeps the rounding error)")
    codec(compress)
    if error_feedback.residual.size != count:
        raise ValueError(f"error_feedback holds {error_feedback.residual.size} elements, "
                         f"the buffer has {count}")


_warm = False


def warmup() -> None:
    """Compile (or load from numba's disk cache) the codec kernels, once per process, under
    ``kernels.file_lock`` (which says so in one line if numba compiles them)."""
    global _warm
    if _warm:
        return
    x, e, wire = np.ones(4, np.float32), np.zeros(4, np.float32), np.zeros(32, np.uint8)
    with kernels.file_lock("the compression codecs' kernels"):
        for c in CODECS.values():
            w = wire[:c.wire_bytes(0, 4)]
            c.encode(x, 0, w)
            c.decode(w, 0, x)
            c.round(x, 0)
            for fed in (None, (e, 1)):
                c.send(x, 0, w, None, fed)
                for left in (False, True):
                    c.add(w, 0, x, left, None, fed)
            c.feedback(x, e)
    _warm = True


# ----------------------------------------------------------------------------- wire buffers

_spare: dict = {}           # bytes -> wire buffers whose requests are gone, newest size last
_spare_lock = threading.RLock()          # (a finalizer may run inside wire_buffers)
SPARE_EACH, SPARE_BYTES = 4, 256 << 20  # kept: at most 4 of a size, 256 MiB in all


def wire_buffers(owner, *sizes: int) -> list:
    """uint8 buffers of ``sizes`` bytes for ``owner`` (a request, which uses them until it is
    gone), reused from requests gone before: a fresh buffer costs a page fault per 4 KiB the
    first encode writes, more than the encode itself. ``failed(owner)`` keeps a request's
    buffers from being reused (an MPI send may still read them)."""
    bufs = []
    with _spare_lock:
        for n in sizes:
            kept = _spare.get(n)
            bufs.append(kept.pop() if kept else np.empty(n, np.uint8))
    owner._wires_reusable = reusable = [True]
    weakref.finalize(owner, _spare_again, bufs, reusable)
    return bufs


def failed(owner) -> None:
    """``owner``'s wire buffers are not reused (``wire_buffers``)."""
    getattr(owner, "_wires_reusable", [False])[0] = False


def _spare_again(bufs: list, reusable: list) -> None:
    if not reusable[0]:
        return
    with _spare_lock:
        for b in bufs:
            kept = _spare.pop(b.size, [])
            _spare[b.size] = kept                   # (now the newest size)
            if len(kept) < SPARE_EACH:
                kept.append(b)
        while sum(n * len(kept) for n, kept in _spare.items()) > SPARE_BYTES:
            del _spare[next(iter(_spare))]          # the oldest size goes first


# ----------------------------------------------------------------------------- error feedback

class ErrorFeedback:
    """The residual ``g - R(g)`` of a rank's last compressed call, added into its next one.

    ``ErrorFeedback(n)`` keeps ``n`` fp32 zeros; pass it as ``error_feedback=`` to a compressed
    all-reduce of ``n`` elements (one object per buffer: the residual belongs to that buffer).
    ``divide=d`` divides each call's input by ``d`` first, in the same pass (a mean taken
    before the sum, as torch's DDP hooks take it: ``mpicoll.torch.compress_hook``); the
    residual is then kept in the divided units.
    """

    def __init__(self, size: int, *, divide=1):
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 0:
            raise ValueError(f"ErrorFeedback needs an element count >= 0, got {size!r}")
        if isinstance(divide, bool) or not isinstance(divide, (int, float, np.integer,
                                                                np.floating)) \
                or not 0 < divide < np.inf:
            raise ValueError(f"ErrorFeedback: divide must be a finite number > 0, got "
                             f"{divide!r}")
        self.residual = np.zeros(int(size), np.float32)
        self.divide = divide

    def __repr__(self) -> str:
        shown = f", divide={self.divide!r}" if self.divide != 1 else ""
        return (f"ErrorFeedback({self.residual.size}{shown}, "
                f"|residual|={np.linalg.norm(self.residual):.3g})")

    def apply(self, codec: Codec, x: np.ndarray, cuts=None) -> None:
        """In place, with ``v = x / divide + e``: ``x = R(v)`` and ``e = v - R(v)`` (``cuts``:
        the collective's int8 pieces, so that its first sends carry ``R(v)`` unchanged)."""
        self.check(x)
        codec.feedback(x, self.residual, cuts, self.divide)

    def check(self, x: np.ndarray) -> None:
        """Raise ``ValueError`` unless ``x`` is an fp32 buffer of the residual's size."""
        if x.size != self.residual.size or x.dtype != np.float32:
            raise ValueError(f"ErrorFeedback holds {self.residual.size} fp32 elements, the "
                             f"buffer has {x.size} {x.dtype}")

    def reset(self) -> None:
        self.residual[...] = 0
