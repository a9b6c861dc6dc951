"""Whether waits spin (``mpicoll.idle``, ``MPICOLL_YIELD_WHEN_IDLE``): not when this
node's ranks outnumber the process's cores, or when the setting says 1; as on a quiet node
otherwise. And what the answer changes: ``shm``'s ``Patience`` spins 20 us, not 2 ms."""

import os

import pytest
from mpi4py import MPI

from mpicoll import settings
from mpicoll import idle
from mpicoll.shm import window
from mpicoll.testing import environment


@pytest.mark.parametrize("ranks, cores, setting, expected", [
    (4, 2, "auto", True), (3, 2, "auto", True), (2, 2, "auto", False), (1, 8, "auto", False),
    (4, 2, "0", False), (1, 8, "1", True), (2, 2, "1", True), (64, 1, "0", False),
])
def test_oversubscribed_is_ranks_against_cores_unless_set(ranks, cores, setting, expected):
    assert idle.oversubscribed(ranks, cores, setting) is expected


@pytest.fixture
def fresh():
    """No ranks noted (a communicator's layout may have been, in this process), restored after."""
    saved = idle._noted
    idle._noted = 0
    settings.reload()
    yield
    idle._noted = saved
    settings.reload()


def test_crowded_follows_the_launcher_the_layout_and_the_setting(fresh):
    cores = len(os.sched_getaffinity(0))
    unset = {"MPI_LOCALNRANKS": None, "OMPI_COMM_WORLD_LOCAL_SIZE": None}
    with environment(MPICOLL_YIELD_WHEN_IDLE=None, **unset):
        assert idle.ranks_on_node() == 1 and not idle.crowded()
    with environment(MPICOLL_YIELD_WHEN_IDLE=None, **dict(unset, MPI_LOCALNRANKS=str(cores))):
        assert not idle.crowded()
    with environment(MPICOLL_YIELD_WHEN_IDLE=None,
                     **dict(unset, OMPI_COMM_WORLD_LOCAL_SIZE=str(cores + 1))):
        assert idle.ranks_on_node() == cores + 1 and idle.crowded()
    with environment(MPICOLL_YIELD_WHEN_IDLE="0", **dict(unset, MPI_LOCALNRANKS=str(cores + 1))):
        assert not idle.crowded()
    with environment(MPICOLL_YIELD_WHEN_IDLE="1", **unset):
        assert idle.crowded()
    with environment(MPICOLL_YIELD_WHEN_IDLE=None, **unset):
        assert not idle.crowded()
        idle.note(cores + 1)            # a communicator's layout: more ranks here than cores
        assert idle.crowded()
        idle.note(1)                    # (the most seen counts)
        assert idle.crowded()


def test_bad_value_names_the_variable(fresh):
    with environment(MPICOLL_YIELD_WHEN_IDLE="yes"):
        with pytest.raises(ValueError, match="MPICOLL_YIELD_WHEN_IDLE must be 'auto' or '0' "
                                             "or '1', got 'yes'"):
            idle.crowded()


def test_crowded_patience_spins_briefly_then_naps_short(fresh):
    """A crowded wait returns to Python after CROWDED_SPIN_SECONDS (not SPIN_SECONDS), and its
    first nap is CROWDED_NAP_SECONDS."""
    with environment(MPICOLL_YIELD_WHEN_IDLE="1"):
        p = window.Patience()
        assert p.until(0) - MPI.Wtime() <= window.CROWDED_SPIN_SECONDS
        assert p._nap == window.CROWDED_NAP_SECONDS
    with environment(MPICOLL_YIELD_WHEN_IDLE="0"):
        p = window.Patience()
        assert p.until(0) - MPI.Wtime() > window.CROWDED_SPIN_SECONDS
        assert p._nap == window.NAP_SECONDS


class _Clock:
    """A fake ``time`` for ``Watch.wait``: ``sleep`` advances ``monotonic`` and is recorded."""

    def __init__(self):
        self.now, self.sleeps = 1000.0, []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.mark.parametrize("setting", ["1", "0"])
def test_a_crowded_watch_naps_10us_for_2ms_then_doubles(fresh, monkeypatch, setting):
    """MPI moves a library collective only inside a poll of every rank, so a crowded process's
    Watch keeps its sleeps at 10 us for its first 2 ms (they used to double to 1 ms at once:
    ``algorithm="mpi"`` took 4 ms a call at N = 4 on 2 cores), then doubles them as a quiet
    node's does after its 10 ms of yields."""
    from mpicoll._runtime import watch
    clock = _Clock()
    monkeypatch.setattr(watch, "time", clock)
    monkeypatch.setattr(watch.os, "sched_yield", lambda: setattr(clock, "now", clock.now + 1e-6))
    monkeypatch.setattr(watch, "_test", lambda requests: clock.now > 1000.0 + 0.02)
    with environment(MPICOLL_YIELD_WHEN_IDLE=setting):
        watch.Watch(60.0, "test", MPI.COMM_SELF).wait([None], "a step")
    sleeps = clock.sleeps
    if setting == "1":
        naps = [s for s in sleeps if s == 1e-5]
        assert len(naps) >= 0.002 / 1e-5 - 5 and sleeps[:len(naps)] == naps
        assert max(sleeps) == 1e-3          # (then doubled, up to 1 ms)
    else:
        assert sleeps[:3] == [1e-5, 2e-5, 4e-5]     # (after 10 ms of yields)


class _Finished:
    """A fake ``Request._finished``: ``wait`` advances the fake clock and is recorded; set once
    the clock passes ``end``."""

    def __init__(self, clock, end):
        self.clock, self.end, self.waits = clock, end, []

    def is_set(self) -> bool:
        return self.clock.now > self.end

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        self.clock.now += seconds
        return self.is_set()


@pytest.mark.parametrize("setting", ["1", "0"])
def test_a_crowded_caller_naps_between_looks_where_a_quiet_one_yields(fresh, monkeypatch,
                                                                       setting):
    """A caller waiting on a request it moves itself (a kept one: ``Buckets`` on a full node)
    yields between looks on a quiet node, but naps 10 us for ``NAPS_SECONDS`` on a crowded one:
    there a yield hands the core to another job's process for a time slice (``train_dp``'s ring
    buckets at N = 4 beside two CPU-bound processes: 24 ms a step with yields, 12 with naps)."""
    from mpicoll.executors import progress
    clock, yields = _Clock(), []
    monkeypatch.setattr(progress, "time", clock)
    monkeypatch.setattr(progress.os, "sched_yield",
                        lambda: (yields.append(1), setattr(clock, "now", clock.now + 1e-6)))
    req = progress.Request("a kept request")
    req._kept, req._finished = True, _Finished(clock, 1000.0 + 0.01)
    monkeypatch.setattr(req, "drive", lambda: False)
    with environment(MPICOLL_YIELD_WHEN_IDLE=setting):
        req.wait()
    waits = req._finished.waits
    if setting == "1":
        assert not yields and waits[:100] == [progress.SLEEP_MIN] * 100
        assert len([w for w in waits if w == progress.SLEEP_MIN]) >= idle.NAPS_SECONDS / 1e-5 - 5
    else:
        assert len(yields) == progress._WAIT_YIELDS and waits[:3] == [1e-5, 2e-5, 4e-5]
