"""Schedules: the steps one rank performs in a collective, as plain data.

A schedule is what an algorithm *is*: a pure function of (rank, size, count) returns one, and an
executor (``mpicoll.executors.python`` over MPI, ``mpicoll.simulators.inprocess`` in-process)
runs it. The vocabulary is closed and small:

* ``Send(peer, lo, hi)``          -- send elements ``buf[lo:hi]`` to ``peer``;
* ``Recv(peer, lo, hi, reduce)``  -- receive ``hi - lo`` elements from ``peer`` and either
  reduce them into ``buf[lo:hi]`` (``acc = op(acc, incoming)``, or ``op(incoming, acc)`` with
  ``left=True``) or copy them there; with ``into_next=True`` the accumulator is instead the
  step's next receive, still in scratch (how ``naive`` folds received vectors together).

A *step* is a tuple of such operations that are started together and finished together (an
``MPI_Sendrecv`` is a step with one Send and one Recv). Received data that is reduced lands in a
scratch buffer first and is reduced once every transfer of the step is complete, so a step may
send a slice that it also reduces into. A copied receive must not overlap a send of the same
step (``check_step`` enforces it in the tests).

Offsets are in elements of the flat buffer. Messages between two ranks match in order, so a
schedule is correct when, for every pair, the k-th Send of one matches the k-th Recv of the
other in length.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Iterable, Sequence, Union

import numpy as np

__all__ = [
    "Send", "Recv", "Schedule", "block_displs", "make_schedule", "check_step",
    "pof2_fold", "fold_real_rank", "virtual_blocks", "check_into_next", "recv_kind",
    "FirstTouch",
]


@dataclass(frozen=True)
class Send:
    """Send ``buf[lo:hi]`` to ``peer``."""

    peer: int
    lo: int
    hi: int

    def __repr__(self) -> str:
        return f"send [{self.lo}:{self.hi}) -> {self.peer}"


@dataclass(frozen=True)
class Recv:
    """Receive ``hi - lo`` elements from ``peer`` into ``buf[lo:hi]``, reducing or copying.

    A reduction computes ``acc = op(acc, incoming)``, or ``op(incoming, acc)`` with ``left``:
    when two ranks reduce the same pair of vectors, both put the same one on the left and so
    get the same bits (MAX of +0.0 and -0.0, or the payload of a NaN, depend on the order).

    ``into_next``: ``acc`` is not ``buf[lo:hi]`` but the vector of the step's next receive
    (which must reduce the same slice), where it waits in scratch before being reduced in its
    turn: so received vectors can be reduced together before they meet the rank's own.
    """

    peer: int
    lo: int
    hi: int
    reduce: bool
    left: bool = False
    into_next: bool = False

    def __repr__(self) -> str:
        how = ("reduce" + (" (as left operand)" if self.left else "")) if self.reduce else "copy"
        return f"recv [{self.lo}:{self.hi}) <- {self.peer} {how}" + (
            " into the next receive" if self.into_next else "")


Op = Union[Send, Recv]
TABLE_KINDS = ("send", "recv copy", "recv reduce", "recv reduce (as left operand)",
               "recv reduce into the next receive",
               "recv reduce (as left operand) into the next receive")
Step = tuple  # tuple[Op, ...]


@dataclass(frozen=True)
class Schedule:
    """The ordered steps of one rank."""

    steps: tuple = ()

    def __add__(self, other: "Schedule") -> "Schedule":
        return Schedule(self.steps + other.steps)

    def __len__(self) -> int:
        return len(self.steps)

    def remap(self, ranks: Sequence[int], offset: int = 0) -> "Schedule":
        """The same schedule run by a group: peer ``i`` becomes ``ranks[i]``, slices move by ``offset``."""
        def move(op: Op) -> Op:
            if isinstance(op, Send):
                return Send(ranks[op.peer], op.lo + offset, op.hi + offset)
            return Recv(ranks[op.peer], op.lo + offset, op.hi + offset, op.reduce, op.left,
                        op.into_next)
        return Schedule(tuple(tuple(move(op) for op in step) for step in self.steps))

    def elements_sent(self) -> int:
        return sum(op.hi - op.lo for step in self.steps for op in step if isinstance(op, Send))

    def elements_received(self) -> int:
        return sum(op.hi - op.lo for step in self.steps for op in step if isinstance(op, Recv))

    def messages_sent(self) -> int:
        return sum(isinstance(op, Send) for step in self.steps for op in step)

    @cached_property
    def scratch_elements(self) -> int:
        """Scratch a rank needs: the largest total of reduced receives in any one step."""
        return max((sum(op.hi - op.lo for op in step if isinstance(op, Recv) and op.reduce)
                    for step in self.steps), default=0)

    @cached_property
    def plan(self) -> tuple:
        """The steps as plain tuples, for executors: per step ``(recvs, sends)`` with
        ``recvs = ((peer, lo, hi, reduce, left, scratch_lo, into), ...)`` (reduced receives land
        in scratch at ``scratch_lo``; ``into``: -1, or for ``into_next`` the next receive's
        ``scratch_lo``, the accumulator) and ``sends = ((peer, lo, hi), ...)``."""
        plan = []
        for step in self.steps:
            check_into_next(step)
            ops = [op for op in step if isinstance(op, Recv)]
            at = [0]                                # each receive's scratch_lo
            for op in ops:
                at.append(at[-1] + ((op.hi - op.lo) if op.reduce else 0))
            recvs = tuple((op.peer, op.lo, op.hi, op.reduce, op.left, at[i],
                           at[i + 1] if op.into_next else -1) for i, op in enumerate(ops))
            sends = tuple((op.peer, op.lo, op.hi) for op in step if isinstance(op, Send))
            plan.append((recvs, sends))
        return tuple(plan)

    @cached_property
    def first_touch(self) -> "FirstTouch":
        """Which sends and reductions can read the input itself, out of place
        (``FirstTouch``)."""
        return FirstTouch(self)

    @cached_property
    def derived(self) -> dict:
        """The compiled executor's segmented plans of this schedule, by item size
        (``executors.segments.plan``)."""
        return {}

    @cached_property
    def totals(self) -> tuple:
        """``(elements_sent, elements_received, messages_sent)`` of the whole schedule."""
        return self.elements_sent(), self.elements_received(), self.messages_sent()

    @cached_property
    def table(self):
        """The plan as one int64 array, for the compiled executor: a row per transfer,
        ``(step, peer, lo, hi, kind, scratch_lo)`` with ``kind`` one of ``TABLE_KINDS``; rows in
        step order, each step's receives before its sends (the order ``plan`` posts them)."""
        rows = []
        for index, (recvs, sends) in enumerate(self.plan):
            for peer, lo, hi, reduce, left, at, into in recvs:
                rows.append((index, peer, lo, hi, recv_kind(reduce, left, into), at))
            rows += [(index, peer, lo, hi, 0, 0) for peer, lo, hi in sends]
        return np.array(rows, np.int64).reshape(-1, 6)

    def __str__(self) -> str:
        return "\n".join(f"step {i}: " + "; ".join(map(repr, step))
                         for i, step in enumerate(self.steps)) or "(no steps)"


class FirstTouch:
    """Out of place, which operations can read the input instead of a copy of it in the buffer.

    An executor runs a schedule on one buffer, which out of place must first hold the input:
    a copy of the whole vector before the first step. But a slice that no step has written yet
    still holds exactly the input, so the copy can be skipped where the executor reads the
    input itself: a send of such a slice sends it from the input, and a reduction into it
    computes ``buf = op(input, incoming)`` (or ``op(incoming, input)`` as left operand) in the
    pass that would have reduced into the copy -- the same bits, one pass over the slice
    fewer. What it can't do this way is copied before the run:

    * ``fresh[s][i]``: operation ``i`` of step ``s`` (a send, or a receive reduced into the
      buffer) touches only elements no earlier step wrote, nor the copy before the run: it reads
      the input;
    * ``copied``: the ``(lo, hi)`` pieces copied in before the run -- those of an operation
      that touches written and unwritten elements both (none in the registered algorithms);
    * ``copies(lo, hi)``: ``copied`` and the elements of ``[lo, hi)`` -- the part of the buffer
      the call keeps -- that no step writes (for an all-reduce, none at two ranks or more).

    Within a step the sends read the buffer as it was before the step, and its receives write
    it in plan order (``executors.python``'s semantics, which segmenting keeps). Copied
    receives and reductions into the next receive write the buffer without reading it.
    """

    def __init__(self, schedule: "Schedule"):
        copied: list = []
        while True:
            fresh, written, partial = self._walk(schedule, copied)
            if not partial:
                break
            copied = _union(copied + partial)
        self.fresh, self.copied, self.written = fresh, tuple(copied), tuple(written)
        # the elements [0, whole) need no copy, whatever the call keeps of them (the fast path
        # of a call keeping the whole buffer: an all-reduce)
        self.whole = written[0][1] if written and written[0][0] == 0 and not copied else 0
        self._copies: dict = {}

    @staticmethod
    def _walk(schedule, copied: list) -> tuple:
        written, fresh, partial = list(copied), [], []
        for step in schedule.steps:
            before, flags = written, []
            for op in step:
                # a send reads the buffer as it was before the step; a reduction, as the
                # step's receives before it in plan order left it
                reads = isinstance(op, Send) or (op.reduce and not op.into_next)
                unwritten = _minus([(op.lo, op.hi)], before if isinstance(op, Send) else
                                   written) if reads else []
                flags.append(unwritten == [(op.lo, op.hi)])
                if unwritten and not flags[-1]:
                    partial += unwritten
                if isinstance(op, Recv) and not op.into_next:
                    written = _union(written + [(op.lo, op.hi)])
            fresh.append(tuple(flags))
        return tuple(fresh), written, partial

    def copies(self, lo: int, hi: int) -> tuple:
        """The ``(lo, hi)`` pieces to copy from the input before the run when the call keeps
        ``[lo, hi)`` of the buffer (cached)."""
        found = self._copies.get((lo, hi))
        if found is None:
            unwritten = _minus([(lo, hi)], list(self.written)) if hi > lo else []
            found = self._copies[lo, hi] = tuple(_union(list(self.copied) + unwritten))
        return found


def _union(pieces: list) -> list:
    """Sorted, merged ``(lo, hi)`` pieces."""
    merged: list = []
    for lo, hi in sorted(p for p in pieces if p[1] > p[0]):
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def _minus(pieces: list, removed: list) -> list:
    """The parts of ``pieces`` outside every piece of ``removed`` (sorted, merged)."""
    left = _union(pieces)
    for rlo, rhi in _union(removed):
        left = [part for lo, hi in left
                for part in ((lo, min(hi, rlo)), (max(lo, rhi), hi)) if part[1] > part[0]]
    return left


def make_schedule(steps: Iterable[Iterable[Op]]) -> Schedule:
    """Build a schedule, dropping empty transfers and then empty steps.

    Both ends of a transfer compute the same slice, so dropping the empty ones on both sides
    keeps the schedules matched; it is what makes count < size work everywhere.
    """
    kept = (tuple(op for op in step if op.hi > op.lo) for step in steps)
    return Schedule(tuple(step for step in kept if step))


def block_displs(count: int, nblocks: int) -> list[int]:
    """Offsets of ``nblocks`` blocks as even as possible: the first ``count % nblocks`` get one more.

    Block ``b`` is ``[displs[b], displs[b + 1])``; the list has ``nblocks + 1`` entries.
    """
    base, extra = divmod(count, nblocks)
    displs = [0]
    for b in range(nblocks):
        displs.append(displs[-1] + base + (1 if b < extra else 0))
    return displs


def pof2_fold(rank: int, size: int) -> tuple[int, int, int]:
    """MPICH's fold of a non-power-of-two group onto ``pof2`` ranks: ``(pof2, rem, newrank)``.

    ``pof2`` is the largest power of two <= size and ``rem = size - pof2``. Among the first
    ``2*rem`` ranks the even ones hand their data to ``rank + 1`` and sit out (``newrank = -1``);
    the odd ones become ``newrank = rank // 2``. The rest become ``newrank = rank - rem``.
    """
    pof2 = 1 << (size.bit_length() - 1)
    rem = size - pof2
    if rank < 2 * rem:
        newrank = -1 if rank % 2 == 0 else rank // 2
    else:
        newrank = rank - rem
    return pof2, rem, newrank


def virtual_blocks(lo: int, width: int, rem: int) -> int:
    """Blocks owned by virtual ranks ``lo .. lo+width-1`` of ``pof2_fold``: one each, two for
    those below ``rem`` (they stand for an even and an odd real rank)."""
    return width + max(0, min(rem - lo, width))


def fold_real_rank(newrank: int, rem: int) -> int:
    """The real rank behind a ``newrank`` of ``pof2_fold``."""
    return newrank * 2 + 1 if newrank < rem else newrank + rem


def recv_kind(reduce: bool, left: bool, into: int) -> int:
    """A receive's kind in ``Schedule.table`` (the index of its name in ``TABLE_KINDS``), from
    its ``Schedule.plan`` fields."""
    return (2 + left + (2 if into >= 0 else 0)) if reduce else 1


def check_into_next(step: Step) -> None:
    """Raise unless every ``into_next`` receive reduces, and the step's next receive reduces
    the same slice."""
    recvs = [op for op in step if isinstance(op, Recv)]
    for r, following in zip(recvs, recvs[1:] + [None]):
        if r.into_next and not (r.reduce and following is not None and following.reduce
                                and (following.lo, following.hi) == (r.lo, r.hi)):
            raise ValueError(f"{r!r}: the step's next receive must reduce the same slice, "
                             f"got {following!r}")


def check_step(step: Step) -> None:
    """Raise if a copied receive overlaps a send or another receive of the same step, or an
    ``into_next`` receive has no next receive of its slice (``check_into_next``)."""
    check_into_next(step)
    recvs = [op for op in step if isinstance(op, Recv)]
    for r in recvs:
        if r.reduce:
            continue
        for op in step:
            if op is not r and op.lo < r.hi and r.lo < op.hi:
                raise AssertionError(f"copied receive {r!r} overlaps {op!r} in one step")
