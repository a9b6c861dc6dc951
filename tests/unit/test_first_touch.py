"""``Schedule.first_touch``: out of place, which sends and reductions read the input instead of
a copy of it. The in-process executor runs it as the compiled one does (``run(inputs=...)``),
over buffers full of a value no result holds, and must give the bits of the copy-in run."""

import numpy as np
import pytest

from mpicoll.executors import segments
from mpicoll.simulators import inprocess
from mpicoll.registry import ALLREDUCE, REDUCE_SCATTER_BLOCK
from mpicoll.schedule import Recv, Schedule, Send

GARBAGE = 1e300             # what the buffers hold before an out-of-place run
CASES = [("allreduce", name, {}) for name, algo in ALLREDUCE.items()
         if algo.scheduled and name != "hierarchical"]
CASES += [("allreduce", "hierarchical", {"inner": inner, "outer": outer})
          for inner in ("ring", "recursive_halving", "binomial")
          for outer in ("ring", "recursive_halving", "recursive_doubling", "binomial")]
CASES += [("reduce_scatter_block", name, {}) for name, algo in REDUCE_SCATTER_BLOCK.items()
          if algo.scheduled]


def inputs(size: int, count: int, op: str) -> list:
    """Values whose max and sum bits depend on the order: +-0.0, NaNs with each rank's payload."""
    rng = np.random.default_rng([size, count])
    xs = []
    for rank in range(size):
        x = rng.integers(-4, 4, count).astype(np.float64)
        x[rng.integers(0, 4, count) == 0] = -0.0
        if op == "max":
            nan = np.array([np.nan]).view(np.uint64) | np.uint64(rank + 1)
            x[rng.integers(0, count)] = nan.view(np.float64)[0]
        xs.append(x)
    return xs


@pytest.mark.parametrize("collective,algorithm,options", CASES,
                         ids=[f"{c}-{a}-{'-'.join(o.values())}".rstrip("-")
                              for c, a, o in CASES])
def test_reading_the_input_gives_the_copy_in_bits(collective, algorithm, options):
    for size in range(1, 10):
        kw = dict(options)
        if algorithm == "hierarchical":
            kw["ranks_per_node"] = 3 if size % 3 == 0 else 2 if size % 2 == 0 else 1
        for n in (1, 2, size, size + 1, 7 * size + 3):
            count = n * size if collective == "reduce_scatter_block" else n
            block = count // size
            scheds = inprocess.schedules(collective, algorithm, size, count, **kw)
            kept = [(0, count) if collective == "allreduce" else (r * block, (r + 1) * block)
                    for r in range(size)]
            for op in ("sum", "max"):
                xs = inputs(size, count, op)
                copied = [x.copy() for x in xs]
                inprocess.run(scheds, copied, op)
                work = [np.full(count, GARBAGE) for _ in range(size)]
                given = [x.copy() for x in xs]
                inprocess.run(scheds, work, op, inputs=given, kept=kept)
                for r, (lo, hi) in enumerate(kept):
                    assert work[r][lo:hi].tobytes() == copied[r][lo:hi].tobytes(), \
                        (size, count, op, r)
                    assert given[r].tobytes() == xs[r].tobytes()        # inputs only read
            if size > 1:        # every algorithm writes what it keeps: nothing to copy
                for sched, (lo, hi) in zip(scheds, kept):
                    assert sched.first_touch.copies(lo, hi) == ()
                    if collective == "allreduce":       # (the executor's fast path)
                        assert sched.first_touch.whole == count


def test_one_rank_copies_what_it_keeps():
    touch = Schedule().first_touch
    assert touch.copies(0, 10) == ((0, 10),) and touch.copies(4, 6) == ((4, 6),)
    assert touch.whole == 0
    assert touch.copies(3, 3) == ()


def test_an_operation_on_written_and_unwritten_elements_copies_the_unwritten_part():
    # step 0 copies [0, 2) in; step 1 sends [0, 4), of which [2, 4) was never written: that
    # part is copied before the run, and the send reads the buffer
    sched = Schedule(((Recv(1, 0, 2, reduce=False),), (Send(1, 0, 4), Recv(1, 4, 6, True))))
    touch = sched.first_touch
    assert touch.copied == ((2, 4),)
    assert touch.fresh == ((False,), (False, True))
    assert touch.copies(0, 6) == ((2, 4),)
    assert touch.copies(0, 8) == ((2, 4), (6, 8))
    assert touch.whole == 0             # (a piece is copied: no fast path)


def test_within_a_step_sends_see_the_buffer_before_it_and_receives_each_other():
    # one step sends [0, 4) and reduces two receives into it: the send and the first
    # reduction read the input, the second reduces into what the first wrote
    step = (Recv(1, 0, 4, True), Recv(2, 0, 4, True), Send(1, 0, 4))
    touch = Schedule((step, (Send(2, 0, 4),))).first_touch
    assert touch.fresh == ((True, False, True), (False,))
    # ... and the into_next receive reduces into scratch: the one after it reads the input
    step = (Recv(1, 0, 4, True, into_next=True), Recv(2, 0, 4, True))
    assert Schedule((step,)).first_touch.fresh == ((False, True),)


def test_the_segmented_plan_carries_the_flags():
    sched = inprocess.schedules("allreduce", "ring", 4, 64)[1]
    plan = segments.segmented(sched, 8, segments.SegmentRule(16))      # 2 elements a segment
    column = segments.COLUMNS.index("input")
    step0 = plan.table[plan.table[:, 0] == 0]
    # step 0 of the ring: the rank's own block goes out from the input, the one it receives
    # is reduced from the input
    assert set(step0[:, column]) == {1} and len(step0) == 16
    last = plan.table[plan.table[:, 0] == len(sched) - 1]
    assert set(last[:, column]) == {0}      # the all-gather's last step: written slices
