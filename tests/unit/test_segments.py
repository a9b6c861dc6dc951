"""The segment-size rule and the segmented plans of ``executors.segments`` (no MPI): messages
tiled exactly, both ends of every message split alike and posted in the same order, pipelining
where the bits allow it, scratch of two segments per pipelined receive."""

import math

import numpy as np
import pytest

from mpicoll import settings
from mpicoll.executors import segments
from mpicoll.simulators.inprocess import schedules
from mpicoll.executors.segments import MAX_SEGMENT, MIN_SEGMENT, SegmentRule
from mpicoll.registry import COLLECTIVES, lookup
from mpicoll.testing import environment

ALPHA, BETA, GAMMA = 1.67e-6, 8.75e-11, 2.96e-11     # the shipped profile, rounded
MODEL = SegmentRule(None, ALPHA, BETA, GAMMA)
ALGORITHMS = [(c, a) for c, table in COLLECTIVES.items() for a, algo in table.items()
              if algo.scheduled]


def test_a_fixed_segment_size_splits_into_ceil_pieces():
    assert SegmentRule(1000).pieces(1000) == 1
    assert SegmentRule(1000).pieces(1001) == 2
    assert SegmentRule(1000).pieces(10_000) == 10
    assert SegmentRule(1 << 20).pieces(5000) == 1          # a segment larger than the message
    assert SegmentRule(0).pieces(1 << 30) == 1             # 0: never split


def test_the_model_rule_is_the_pipelining_optimum_within_bounds():
    """K = round(sqrt(m.min(beta, gamma) / alpha)), segments between the bounds, no split
    below K = 2."""
    for m in (3 << 21, 1 << 24, 1 << 25, 1 << 26):
        k = MODEL.pieces(m)
        assert k == min(round(math.sqrt(m * GAMMA / ALPHA)), m // MIN_SEGMENT), m
        assert k >= 2 and MIN_SEGMENT <= m / k <= MAX_SEGMENT
    for m in (8, 1 << 16, 100_000, 2 * MIN_SEGMENT - 1):
        assert MODEL.pieces(m) == 1                            # small messages: not split
    assert MODEL.pieces(1 << 30) >= (1 << 30) // MAX_SEGMENT    # capped segment size
    cheap_messages = SegmentRule(None, 1e-9, BETA, GAMMA)        # alpha ~ 0: many segments,
    assert (1 << 22) / cheap_messages.pieces(1 << 22) >= MIN_SEGMENT   # but not below the floor
    ks = [MODEL.pieces(m) for m in range(1 << 16, 1 << 26, 1 << 19)]
    assert ks == sorted(ks)                                  # more bytes, never fewer pieces
    assert SegmentRule(None, ALPHA, BETA, 0.0).pieces(1 << 26) == 1   # nothing to overlap


def test_the_rule_comes_from_the_setting_else_the_profile():
    with environment(MPICOLL_SEGMENT_BYTES="4096"):
        assert segments.rule() == SegmentRule(4096)
    with environment(MPICOLL_SEGMENT_BYTES=None):
        rule = segments.rule()
        assert rule.fixed is None and rule.alpha > 0 and rule.gamma > 0
    with environment(MPICOLL_SEGMENT_BYTES="-1"):
        with pytest.raises(ValueError, match="MPICOLL_SEGMENT_BYTES"):
            segments.rule()
    settings.reload()


def posting_order(table: np.ndarray) -> list:
    """The rows in the order the compiled loop posts them (``compiled._loop``)."""
    order = []
    for step in np.unique(table[:, 0]):
        rows = table[table[:, 0] == step]
        for rnd in range(int(rows[:, 6].max()) + 1):
            order += [row for row in rows if row[8] == rnd + 1 or (rnd == 0 and row[8] == 0)]
    return order


@pytest.mark.parametrize("collective,algorithm", ALGORITHMS)
def test_both_ends_split_every_message_alike(collective, algorithm):
    """For every pair of ranks, the segments one posts to the other match, in order and in
    length, the segments the other posts from it; every message is tiled exactly."""
    for size in (2, 3, 4, 5, 6):
        for count, rule in ((1, SegmentRule(8)), (size + 1, SegmentRule(8)),
                            (61, SegmentRule(24)), (997, SegmentRule(1000))):
            if collective == "reduce_scatter_block":
                count *= size
            scheds = schedules(collective, algorithm, size, count, ranks_per_node=2)
            sent, received = {}, {}
            for rank, sched in enumerate(scheds):
                plan = segments.segmented(sched, 8, rule)
                for row in posting_order(plan.table):
                    step, peer, lo, hi, kind = (int(v) for v in row[:5])
                    key = (rank, peer) if kind == 0 else (peer, rank)
                    (sent if kind == 0 else received).setdefault(key, []).append(hi - lo)
                for step in range(len(sched.plan)):
                    for kind in range(6):         # every element covered as often
                        assert (_coverage(plan.table, step, kind, count)
                                == _coverage(sched.table, step, kind, count)).all()
            assert sent == received, (size, count, rule)


def _coverage(table, step, kind, count) -> np.ndarray:
    """How many transfers of ``kind`` in ``step`` cover each element."""
    covered = np.zeros(count + 1, np.int64)
    for row in table[(table[:, 0] == step) & (table[:, 4] == kind)]:
        covered[row[2]] += 1
        covered[row[3]] -= 1
    return np.cumsum(covered)


@pytest.mark.parametrize("algorithm,sends_up_front", [("ring", True),
                                                      ("recursive_halving", True),
                                                      ("recursive_doubling", False)])
def test_ring_and_halving_pipeline_with_sends_up_front(algorithm, sends_up_front):
    """Every reducing step is pipelined; ring and recursive halving (send and reduce disjoint
    slices) post their sends when the step starts, recursive doubling (it sends the slice it
    reduces) posts them round by round."""
    sched = lookup("allreduce", algorithm).schedule(1, 4, 1 << 16)
    plan = segments.segmented(sched, 8, SegmentRule(8 << 10))
    for step, (recvs, _) in enumerate(sched.plan):
        rows = plan.table[plan.table[:, 0] == step]
        if not any(r[3] for r in recvs):
            assert (rows[:, 6] == 0).all()          # copies only: one round
            continue
        assert rows[:, 6].max() >= 3
        sends = rows[rows[:, 4] == 0]
        if sends_up_front:
            assert (sends[:, 8] == 0).all() and (sends[:, 6] == rows[:, 6].max()).all()
        else:
            assert (sends[:, 8] == sends[:, 6]).all()


@pytest.mark.parametrize("collective,algorithm", ALGORITHMS)
def test_scratch_is_two_segments_per_pipelined_receive(collective, algorithm):
    """Never more than the unsegmented step's; for ring and recursive halving two segments."""
    for rank, sched in enumerate(schedules(collective, algorithm, 4, 1 << 15,
                                           ranks_per_node=2)):
        plan = segments.segmented(sched, 8, SegmentRule(8 << 10))
        assert plan.scratch <= sched.scratch_elements
        if collective == "allreduce" and algorithm in ("ring", "recursive_halving"):
            assert plan.scratch <= 2 * 1024 < sched.scratch_elements


def test_small_messages_run_as_before():
    """Below the rule's threshold the plan is the schedule's table, one round per step, all
    posted when the step starts."""
    for algorithm in ("ring", "recursive_halving", "recursive_doubling", "binomial"):
        sched = lookup("allreduce", algorithm).schedule(1, 4, 1000)
        plan = segments.segmented(sched, 8, MODEL)
        assert plan.table.shape[0] == sched.table.shape[0]
        assert (plan.table[:, 6] == 0).all() and (plan.table[:, 8] == 0).all()
        same = [tuple(r) for r in plan.table[:, :5]] == [tuple(r) for r in sched.table[:, :5]]
        assert same or sorted(map(tuple, plan.table[:, :5])) == sorted(
            map(tuple, sched.table[:, :5]))


def _reduce_order(tables, step) -> list:
    """For each table, at every element edge of ``step``'s reduced receives in any of them: the
    peers reduced into it, in the order the compiled loop applies them (table order: by round,
    then slot)."""
    rows = [[tuple(int(v) for v in row[:5]) for row in table if row[0] == step and row[4] >= 2]
            for table in tables]
    edges = sorted({e for some in rows for _, _, lo, hi, _ in some for e in (lo, hi - 1)})
    return [{e: [peer for _, peer, lo, hi, _ in some if lo <= e < hi] for e in edges}
            for some in rows]


@pytest.mark.parametrize("collective,algorithm", ALGORITHMS)
def test_every_element_is_reduced_in_plan_order(collective, algorithm):
    """Segmenting never reorders two reduced receives into one element (a tree's two children,
    say): float results keep the unsegmented bits. (double_binary_tree at N = 4, one rank per
    node, 65537 elements had its children swapped once: the step held two messages from one
    child, which made two rounds of unsplit messages.)"""
    for size in (2, 3, 4, 5, 8):
        for count, rule in ((61, SegmentRule(24)), (997, SegmentRule(1000)),
                            (65537, SegmentRule(0)), (65537, SegmentRule(1 << 15)),
                            (65537, MODEL)):
            if collective == "reduce_scatter_block":
                count *= size
            for per_node in (1, 2):
                for rank, sched in enumerate(schedules(collective, algorithm, size, count,
                                                       ranks_per_node=per_node)):
                    plan = segments.segmented(sched, 8, rule)
                    for step in range(len(sched.plan)):
                        planned, scheduled = _reduce_order((plan.table, sched.table), step)
                        assert planned == scheduled, (size, count, rule, rank, step)


def test_into_next_reduces_into_the_same_segment_of_the_next_receive():
    """naive's receives reduced into the next one (``Recv.into_next``): each segment into the
    next receive's segment of the same elements, in the same round, in lockstep rounds; where
    the two would move in different rounds (another message from the same peer first), the
    step runs as one round."""
    from mpicoll.schedule import Recv, Send, make_schedule
    sched = lookup("allreduce", "naive").schedule(3, 4, 61)
    table = segments.segmented(sched, 8, SegmentRule(24)).table
    assert table[:, 6].max() > 1                      # pipelined: lockstep rounds
    chained = table[table[:, 4] >= 4]
    assert len(chained) == 2 * 21
    for row in chained:
        (target,) = [t for t in table if t[4] >= 2 and t[1] == row[1] + 1 and t[2] == row[2]]
        assert row[9] == target[5] and row[6] == target[6] and target[4] in (3, 5)
    assert (table[table[:, 4] < 4][:, 9] == -1).all()
    odd = make_schedule([[Recv(1, 4, 8, True), Recv(1, 0, 4, True, into_next=True),
                          Recv(2, 0, 4, True), Send(1, 0, 8), Send(2, 0, 8)]])
    table = segments.segmented(odd, 8, SegmentRule(8)).table
    assert (table[:, 6] == 0).all()                   # one round
    for row in table[table[:, 4] >= 4]:
        (target,) = [t for t in table if t[4] >= 2 and t[1] == 2 and t[2] == row[2]]
        assert row[9] == target[5]


def test_into_next_needs_a_next_receive_of_the_same_slice():
    from mpicoll.schedule import Recv, make_schedule
    for step in ([Recv(1, 0, 4, True, into_next=True)],
                 [Recv(1, 0, 4, True, into_next=True), Recv(2, 0, 3, True)],
                 [Recv(1, 0, 4, True, into_next=True), Recv(2, 0, 4, False)],
                 [Recv(1, 0, 4, False, into_next=True), Recv(2, 0, 4, True)]):
        with pytest.raises(ValueError, match="next receive must reduce the same slice"):
            make_schedule([step]).plan
