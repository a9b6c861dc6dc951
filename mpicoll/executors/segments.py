"""Segmented, pipelined steps: how the compiled executor runs large messages.

A step posts its transfers, waits for all of them, then reduces what it received. For a large
message the reduction waits for the whole transfer, and the transfer for nothing: the two are
serial. Split every message into segments and the step into *rounds* -- round j moves the j-th
segment of every message -- and the executor can post round j + 1 before it reduces round j, so
that the reduction of segment j overlaps the transfer of segment j + 1 (and reads a segment that
has just arrived, still in cache). Received segments land in two scratch halves used in turn
(round j in half j % 2): the scratch a pipelined step needs is two segments per reduced
receive, not the whole message.

Cost. A step moving and reducing m bytes in K segments of s = m / K bytes is a two-stage
pipeline: stage one transfers a segment (alpha + s.beta), stage two reduces it (s.gamma). With
the slower stage repeated K times, the first stage of the first segment and the second stage of
the last one in front of and behind it,

    T(K) ~ K.alpha + m.max(beta, gamma) + m.min(beta, gamma) / K

against alpha + m.(beta + gamma) unsegmented: the faster stage is hidden but for one segment,
and every segment pays a message's alpha. dT/dK = 0 at

    K* = sqrt(m.min(beta, gamma) / alpha),    s* = m / K* = sqrt(alpha.m / min(beta, gamma)),

where T(K*) = m.max(beta, gamma) + 2.sqrt(alpha.m.min(beta, gamma)) (+ alpha). ``SegmentRule``
takes K = round(K*) from the cost model's profile (``mpicoll.model``: intra-node alpha, beta,
gamma), bounded so that a segment stays between ``MIN_SEGMENT`` and ``MAX_SEGMENT`` bytes; with
K < 2 (in particular below 2 MiB) a message is not split, so small messages run exactly as
before. The lower bound is measured, not modelled: on a loaded machine a round costs more than
alpha (docs/performance.md). ``MPICOLL_SEGMENT_BYTES`` overrides the rule: segments of at most
that many bytes (0: never split).

Matching. Messages between two ranks match in order, so both ends must split a message alike:
how a message is split depends only on its length in bytes (and the rule, the same on every
rank: the same ``MPICOLL_SEGMENT_BYTES`` and profile), never on what the receiver does with it.
Within a step, the segments to (or from) one peer are posted in message order: round j takes
the j-th segment of each peer's *stream* (that peer's messages of the step, one after another,
in plan order), so the k-th segment sent to a peer is always the k-th it receives.

Bits. Pipelining must not change the order in which any element is touched: every send reads
the buffer as it was before the step, and reduced receives into one element are applied in plan
order. Each step gets one of three modes (``_step``):

* sends up front -- where no send overlaps a receive (ring, recursive halving): every send is
  posted when the step starts and waited for with its last round, so a receiver's round j waits
  for its own copy of segment j, never for the sender to reach round j (with rounds in
  lockstep, every round was a handshake between the two ranks: about 0.5 ms each on the loaded
  test machine);
* lockstep -- where a step sends the slice it reduces (recursive doubling): round j's sends go
  with round j's receives; allowed only if no segment is reduced before a send of a later round
  reads it, no two reduced receives into one element run in the other order, and no copied
  receive overlaps another transfer (``_keeps_order``); a receive reduced into the next one
  (``Recv.into_next``, naive) needs that one's segment j in its own segment j's round;
* one round -- otherwise, and in steps that reduce nothing: the segments are posted together,
  which is the unsegmented step with more messages.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass

import numpy as np

from .. import settings
from ..model import default_profile
from ..schedule import Recv, Schedule, Send, block_displs, recv_kind

__all__ = ["MIN_SEGMENT", "MAX_SEGMENT", "SegmentRule", "rule", "SegmentTable", "plan",
           "COLUMNS"]

MIN_SEGMENT = 1 << 20       # bytes: a smaller segment costs more per round than it saves (measured)
MAX_SEGMENT = 4 << 20       # bytes: a larger one keeps too much of the step unpipelined

# the columns of SegmentTable.table: Schedule.table's six, then the round of the step whose wait
# completes the row, its request slot, when it is posted (``_Piece``), where a reduced
# segment is reduced into: -1 the buffer, else the scratch of the next receive's same segment
# (``Recv.into_next``; kinds 4 and 5), and whether the row may read the input, out of place
# (1: a send or reduction into a slice no step wrote yet, ``Schedule.first_touch``)
COLUMNS = ("step", "peer", "lo", "hi", "kind", "scratch_lo", "round", "slot", "post", "into",
           "input")
SEND, COPY = 0, 1           # kinds (schedule.TABLE_KINDS); 2 to 5 are reduced receives


@dataclass(frozen=True)
class SegmentRule:
    """How many segments a message is split into: ``fixed`` bytes per segment at most (0: never
    split), or, with ``fixed`` None, the cost model's optimum K* (module docstring)."""

    fixed: int | None
    alpha: float = 0.0
    beta: float = 0.0
    gamma: float = 0.0

    def pieces(self, nbytes: int) -> int:
        """The number of segments of a message of ``nbytes`` bytes (1: not split)."""
        if self.fixed is not None:
            return 1 if self.fixed == 0 else max(1, -(-nbytes // self.fixed))
        slower = min(self.beta, self.gamma)
        if self.alpha <= 0 or slower <= 0:
            return 1
        k = round(math.sqrt(nbytes * slower / self.alpha))
        k = min(max(k, -(-nbytes // MAX_SEGMENT)), nbytes // MIN_SEGMENT)
        return k if k >= 2 else 1


_rule: SegmentRule | None = None


def rule() -> SegmentRule:
    """The rule in force: ``MPICOLL_SEGMENT_BYTES``, else the cost model's profile (read once;
    ``settings.reload`` forgets it)."""
    global _rule
    if _rule is None:
        fixed = settings.get("MPICOLL_SEGMENT_BYTES")
        if fixed is not None:
            _rule = SegmentRule(fixed)
        else:
            profile = default_profile()
            _rule = SegmentRule(None, profile.alpha, profile.beta, profile.gamma)
    return _rule


@settings.on_reload
def _forget_rule() -> None:
    global _rule
    _rule = None


@dataclass(frozen=True)
class SegmentTable:
    """A schedule split into segments for one item size: ``table`` (int64, a row per segment,
    ``COLUMNS``), the scratch elements it needs, the request slots (``requests``) and the most
    rows posted or waited for at once (``width``, the statuses needed)."""

    table: np.ndarray
    scratch: int
    requests: int
    width: int


def plan(schedule: Schedule, itemsize: int) -> SegmentTable:
    """``schedule`` split by the rule in force for elements of ``itemsize`` bytes (cached on the
    schedule until the rule changes: two lookups per call)."""
    cached = schedule.derived.get(itemsize)
    if cached is not None and cached[0] is _rule:
        return cached[1]
    current = rule()
    cached = schedule.derived[itemsize] = (current, segmented(schedule, itemsize, current))
    return cached[1]


def segmented(schedule: Schedule, itemsize: int, rule: SegmentRule) -> SegmentTable:
    """The segmented plan of ``schedule`` (not cached: ``plan`` caches)."""
    steps = [_step(recvs, sends, itemsize, rule, _fresh(step, fresh))
             for (recvs, sends), step, fresh in zip(schedule.plan, schedule.steps,
                                                    schedule.first_touch.fresh)]
    # request slots: the rows a round waits for take turns in two sets of ``width`` slots (set
    # A right-aligned, set B left-aligned), with the step's sends posted up front in between,
    # so that the last round's rows and those sends are contiguous (one MPI_Waitall)
    width = max((sum(1 for piece in pieces if piece.round == r and not piece.early)
                 for pieces in steps for r in {piece.round for piece in pieces}), default=0)
    rows, scratch, requests, statuses = [], 0, width, 0
    for index, pieces in enumerate(steps):
        early = [piece for piece in pieces if piece.early]
        per_round: dict = {}
        for piece in pieces:
            if not piece.early:
                per_round.setdefault(piece.round, []).append(piece)
        slot = {}
        for r, group in per_round.items():
            start = width - len(group) if r % 2 == 0 else width + len(early)
            for k, piece in enumerate(group):
                slot[id(piece)] = start + k
        for k, piece in enumerate(early):
            slot[id(piece)] = width + k
        requests = max(requests, width * (2 if len(per_round) > 1 else 1) + len(early))
        need, offsets = _scratch_layout(pieces)
        scratch = max(scratch, need)
        where = {(piece.message, piece.lo): offsets[k] for k, piece in enumerate(pieces)}
        step_rows = [(index, piece.peer, piece.lo, piece.hi, piece.kind, offsets[k], piece.round,
                      slot[id(piece)], piece.post,
                      where[piece.message + 1, piece.lo] if piece.kind >= 4 else -1,
                      int(piece.input))
                     for k, piece in enumerate(pieces)]
        step_rows.sort(key=lambda row: (row[6], row[7]))        # by round, then slot
        for r in per_round:
            statuses = max(statuses, sum(1 for row in step_rows if row[6] == r))
        rows += step_rows
    table = np.array(rows, np.int64).reshape(-1, len(COLUMNS))
    return SegmentTable(table, scratch, requests, statuses)


@dataclass(frozen=True)
class _Piece:
    """One segment of a step: waited for in ``round``, posted when the loop reaches ``post``
    (0: when the step starts; r >= 1: with round r - 1); ``early``: a send posted up front."""

    round: int
    post: int
    message: int
    lo: int
    hi: int
    peer: int
    kind: int
    early: bool = False
    input: bool = False


def _fresh(step, fresh: tuple) -> list:
    """``Schedule.first_touch``'s flags of a step's operations in plan order (its receives,
    then its sends)."""
    return [flag for op, flag in zip(step, fresh) if isinstance(op, Recv)] + \
        [flag for op, flag in zip(step, fresh) if isinstance(op, Send)]


def _step(recvs, sends, itemsize: int, rule: SegmentRule, fresh: list) -> list:
    """The segments of one step of ``Schedule.plan``, in plan order, with their rounds;
    ``fresh``: whether each message may read the input (``_fresh``)."""
    messages = [(peer, lo, hi, recv_kind(reduce, left, into))
                for peer, lo, hi, reduce, left, _, into in recvs]
    messages += [(peer, lo, hi, SEND) for peer, lo, hi in sends]
    splits = [_displs(lo, hi, rule.pieces((hi - lo) * itemsize)) for _, lo, hi, _ in messages]
    base, streams = [], {}              # the stream index of each message's first segment
    for (peer, _, _, kind), displs in zip(messages, splits):
        stream = (peer, kind == SEND)
        base.append(streams.get(stream, 0))
        streams[stream] = base[-1] + len(displs) - 1
    rounds = max((n for (_, send), n in streams.items() if not send), default=1)
    mode = "one round"
    split = any(len(displs) > 2 for displs in splits)     # else: exactly the unsegmented step
    # an into_next receive's segment j is reduced into segment j of the next receive (the same
    # slice, so split alike): both must move in the same round
    aligned = all(base[m] == base[m + 1] for m, (*_, kind) in enumerate(messages) if kind >= 4)
    if split and rounds > 1 and aligned and any(kind >= 2 for *_, kind in messages):
        if _sends_apart(messages) and _keeps_order(messages, splits, base, sends=False):
            mode = "sends up front"
        elif _keeps_order(messages, splits, base):
            mode = "lockstep"
    pieces = []
    for m, ((peer, _, _, kind), displs) in enumerate(zip(messages, splits)):
        for j in range(len(displs) - 1):
            r = base[m] + j
            if mode == "one round":
                piece = _Piece(0, 0, m, displs[j], displs[j + 1], peer, kind, False, fresh[m])
            elif mode == "sends up front" and kind == SEND:
                piece = _Piece(rounds - 1, 0, m, displs[j], displs[j + 1], peer, kind, True,
                               fresh[m])
            else:
                piece = _Piece(r, r, m, displs[j], displs[j + 1], peer, kind, False, fresh[m])
            pieces.append(piece)
    return pieces


def _displs(lo: int, hi: int, pieces: int) -> list[int]:
    """The boundaries of ``buf[lo:hi]`` split into ``pieces`` segments as even as possible."""
    pieces = max(1, min(pieces, hi - lo))
    return [lo + d for d in block_displs(hi - lo, pieces)]


def _round_at(displs: list[int], base: int, element: int) -> int:
    """The round in which the segment holding ``element`` moves."""
    return base + bisect_right(displs, element) - 1


def _sends_apart(messages) -> bool:
    """Whether no send overlaps a receive and no copied receive overlaps a reduced one: then the
    sends can all be posted when the step starts and complete when it ends."""
    for a, (_, alo, ahi, akind) in enumerate(messages):
        for _, blo, bhi, bkind in messages[a + 1:]:
            if max(alo, blo) < min(ahi, bhi) and (akind == SEND) != (bkind == SEND):
                return False
            if max(alo, blo) < min(ahi, bhi) and COPY in (akind, bkind) and akind != bkind:
                return False
    return True


def _keeps_order(messages, splits, base, sends: bool = True) -> bool:
    """Whether rounds in lockstep (each round's sends waited for with its receives) leave every
    element's operations in plan order (module docstring): checked at every segment edge inside
    each overlap of two messages. ``sends=False``: only the receives' order (the sends are
    posted up front, apart from every receive: ``_sends_apart``) -- two reduced receives into
    one element, e.g. from a tree's two children, must be applied in plan order."""
    for a, (_, alo, ahi, akind) in enumerate(messages):
        for b in range(a + 1, len(messages)):
            _, blo, bhi, bkind = messages[b]
            lo, hi = max(alo, blo), min(ahi, bhi)
            if lo >= hi or (akind == SEND and bkind == SEND):
                continue
            if not sends and SEND in (akind, bkind):
                continue
            if akind == COPY or bkind == COPY:
                return False
            edges = {lo} | {d for d in splits[a] + splits[b] if lo < d < hi}
            for e in edges:         # a is a reduced receive (receives come first)
                ra, rb = _round_at(splits[a], base[a], e), _round_at(splits[b], base[b], e)
                if bkind == SEND and rb > ra:       # reduced before a later round sends it
                    return False
                if bkind != SEND and ra > rb:       # reduced after b, which follows it
                    return False
    return True


def _scratch_layout(pieces) -> tuple[int, list[int]]:
    """Where each reduced segment lands in scratch, and the scratch the step needs: rounds take
    turns in two halves when that is smaller than the step's whole reduced receive (it is from
    three rounds on), else every segment has its own place."""
    per_round: dict = {}
    for piece in pieces:
        if piece.kind >= 2:
            per_round[piece.round] = per_round.get(piece.round, 0) + piece.hi - piece.lo
    total, half = sum(per_round.values()), max(per_round.values(), default=0)
    double = len(per_round) > 1 and 2 * half < total
    offsets, used, at = [], {}, 0
    for piece in pieces:
        if piece.kind < 2:
            offsets.append(0)
        elif double:
            offsets.append((piece.round % 2) * half + used.get(piece.round, 0))
            used[piece.round] = used.get(piece.round, 0) + piece.hi - piece.lo
        else:
            offsets.append(at)
            at += piece.hi - piece.lo
    return (2 * half if double else total), offsets
