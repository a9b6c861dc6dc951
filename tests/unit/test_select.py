"""``select``: the one decision table every form asks (``select.decide``), row by row."""

import os

import numpy as np
import pytest

from mpicoll import kernels, select
from mpicoll.shm import policy, probe
from mpicoll.testing import NodeLayout, environment
from mpicoll.topology import virtual_nodes

F64 = np.dtype(np.float64)


def decide(collective="allreduce", algorithm="auto", *, nbytes, size, st, dtype=F64, op="sum",
           given=None, scheduled=False, in_place=False):
    algo, extra = select.decide(collective, algorithm, nbytes=nbytes,
                                count=nbytes // dtype.itemsize, size=size, dtype=dtype, op=op,
                                st=st, given=given or {}, scheduled=scheduled,
                                in_place=in_place)
    return algo.name, extra


def test_shm_wins_from_min_bytes_and_past_max_bytes_only_oversubscribed():
    lo, hi = select.SHM_MIN_BYTES, select.SHM_MAX_BYTES
    assert not select.shm_wins(lo - 1, 2, 2)
    assert select.shm_wins(lo, 2, 2) and select.shm_wins(hi, 2, 2)
    assert not select.shm_wins(hi + 1, 2, 2)           # a core per rank: the ring from here
    assert select.shm_wins(hi + 1, 3, 2) and select.shm_wins(1 << 30, 8, 2)
    assert not select.shm_wins(1 << 20, 1, 1)          # one rank: nothing to share
    with environment(MPICOLL_SHM_SINGLE_COPY="off"):
        name, _ = decide(nbytes=hi + 1, size=4, st=NodeLayout([range(4)]))
        assert name == ("shm" if 4 > (os.cpu_count() or 1) else
                        select.choose("allreduce", hi + 1, 4, (hi + 1) // 8))


def test_shm_in_place_only_where_it_copies_through_its_window():
    """In place, shm reading the other ranks' memory lost to the ring at every size measured
    (N = 2, docs/performance.md): the row leaves it out there, and only there -- copying
    through the window (more ranks than cores, or the single copy off) it still runs."""
    lo, hi = select.SHM_MIN_BYTES, select.SHM_MAX_BYTES
    for nbytes in (lo, hi, hi + 1, 1 << 30):
        assert select.shm_wins(nbytes, 2, 2, single_copy=True)
        assert not select.shm_wins(nbytes, 2, 2, single_copy=True, in_place=True)
        assert select.shm_wins(nbytes, 3, 2, in_place=True)         # ranks outnumber cores
    assert select.shm_wins(hi, 2, 2, in_place=True)                 # the window, a core each
    assert not select.shm_wins(lo - 1, 3, 2, in_place=True)
    one_node = NodeLayout([range(2)])
    for setting in ("on", "off"):
        with environment(MPICOLL_SHM_SINGLE_COPY=setting):
            copies = policy.single_copy_expected(2)     # (on: where libc can read)
            assert copies == (setting == "on" and probe.HAVE_READV)
            for nbytes in (lo, hi):
                assert decide(nbytes=nbytes, size=2, st=one_node)[0] == "shm"
                name, _ = decide(nbytes=nbytes, size=2, st=one_node, in_place=True)
                assert (name == "shm") == (not copies), (setting, nbytes, name)
                if copies:
                    assert name == select.choose("allreduce", nbytes, 2, nbytes // 8)


def test_the_shm_row_needs_one_real_node_an_op_shm_reduces_and_no_schedule():
    with environment(MPICOLL_SHM_SINGLE_COPY="off"):
        one_node = NodeLayout([range(4)])
        assert decide(nbytes=64 << 10, size=4, st=one_node)[0] == "shm"
        assert decide(nbytes=64 << 10, size=4, st=one_node, scheduled=True)[0] != "shm"
        two_nodes = NodeLayout(virtual_nodes(4, 2), real_nodes=virtual_nodes(4, 2))
        assert decide(nbytes=64 << 10, size=4, st=two_nodes)[0] != "shm"
        assert decide(nbytes=1 << 10, size=4, st=one_node)[0] != "shm"     # below the band


def test_shm_wins_at_every_size_when_it_reads_in_place():
    from mpicoll.algorithms import allreduce_shm
    lo = select.SHM_MIN_BYTES
    assert not select.shm_wins(lo - 1, 2, 2, single_copy=True)
    assert all(select.shm_wins(n, 2, 2, single_copy=True) for n in (lo, 1 << 20, 1 << 30))
    with environment(MPICOLL_SHM_SINGLE_COPY="on"):
        name, _ = decide(nbytes=1 << 24, size=2, st=NodeLayout([range(2)]))
        assert (name == "shm") == allreduce_shm.single_copy_expected(2, 2)


def test_the_order_row_runs_auto_rings_in_node_order_across_nodes():
    with environment(MPICOLL_RING_ORDER=None, MPICOLL_TUNING=None):
        spread = NodeLayout(virtual_nodes(8, 2))
        name, extra = decide("allgather", nbytes=1 << 24, size=8, st=spread)
        assert name != "ring" or extra == {"order": "node"}
        name, extra = decide("allgather", "ring", nbytes=1 << 24, size=8, st=spread)
        assert extra == {}                              # only auto's rings
        name, extra = decide("allgather", nbytes=1 << 24, size=8, st=NodeLayout([range(8)]))
        assert "order" not in extra                     # one node
    with environment(MPICOLL_RING_ORDER="rail"):        # the variable decides
        assert "order" not in decide("allgather", nbytes=1 << 24, size=8, st=spread)[1]


def test_the_tuned_row_serves_only_its_layout_with_its_options(tmp_path):
    """A one-node row ("8") never decides a call across nodes; an "N/L" row (``mpicoll tune``
    on a sweep across nodes) decides only for L ranks per node, and its options are run
    unless an argument or setting gives them (inner='shm' only where the phases can run)."""
    import json
    table = {"allreduce": {
        "8": [{"max_bytes": None, "algorithm": "binomial"}],
        "8/2": [{"max_bytes": 8, "algorithm": "mpi"},                  # (tune --with-mpi)
                {"max_bytes": 1024, "algorithm": "ring", "options": {"order": "rank"}},
                {"max_bytes": 1 << 20, "algorithm": "hierarchical", "options": {"inner": "shm"}},
                {"max_bytes": None, "algorithm": "hierarchical",
                 "options": {"inner": "shm", "outer": "ring"}}]}}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(table))
    with environment(MPICOLL_TUNING=str(path), MPICOLL_RING_ORDER=None, MPICOLL_HIER_INNER=None,
                     MPICOLL_HIER_OUTER=None, MPICOLL_SHM_SINGLE_COPY="off"):
        one = NodeLayout([range(8)])
        assert decide(nbytes=1024, size=8, st=one) == ("binomial", {})
        four = NodeLayout(virtual_nodes(8, 2))                  # 4 nodes x 2 (the shaped fabric)
        assert decide(nbytes=1024, size=8, st=four) == ("ring", {"order": "rank"})
        assert decide(nbytes=8, size=8, st=four) == ("mpi", {})
        assert decide(nbytes=1 << 20, size=8, st=four) == ("hierarchical", {"inner": "shm"})
        # an option with a default setting (MPICOLL_HIER_OUTER: recursive_doubling) too
        assert decide(nbytes=1 << 24, size=8, st=four) == ("hierarchical",
                                                           {"inner": "shm", "outer": "ring"})
        assert decide(nbytes=1 << 24, size=8, st=four, op="bogus_op") == ("hierarchical",
                                                                          {"outer": "ring"})
        assert decide(nbytes=1 << 24, size=8, st=four,
                      given={"inner": "ring"}) == ("hierarchical", {"outer": "ring"})
        apart = NodeLayout(virtual_nodes(8, 2), real_nodes=[(r,) for r in range(8)])  # no sharing
        assert decide(nbytes=1 << 24, size=8, st=apart) == ("hierarchical", {"outer": "ring"})
        two = NodeLayout(virtual_nodes(8, 4))                   # "8/4": no row, the model's choice
        assert decide(nbytes=1024, size=8, st=two)[0] == select._from_model("allreduce", 1024,
                                                                            8, 4)
    with environment(MPICOLL_TUNING=str(path), MPICOLL_RING_ORDER="rail"):
        assert decide(nbytes=1024, size=8, st=four) == ("ring", {})   # the setting decides
    with environment(MPICOLL_TUNING=str(path), MPICOLL_HIER_OUTER="recursive_doubling",
                     MPICOLL_HIER_INNER=None, MPICOLL_SHM_SINGLE_COPY="off"):
        assert decide(nbytes=1 << 24, size=8, st=four) == ("hierarchical", {"inner": "shm"})


def test_the_lib_row_keeps_types_the_library_lacks_on_mpicolls_schedules(monkeypatch):
    monkeypatch.setattr(select, "choose", lambda *args, **kwargs: "mpi")
    st = NodeLayout(virtual_nodes(4, 2))
    assert decide(nbytes=4096, size=4, st=st, dtype=F64)[0] == "mpi"
    assert decide(nbytes=4096, size=4, st=st, dtype=kernels.bfloat16)[0] == "recursive_doubling"
    assert decide(nbytes=1 << 20, size=4, st=st, scheduled=True)[0] == "recursive_halving"


def test_the_inner_row_puts_hierarchicals_node_phases_in_shared_memory():
    nodes = virtual_nodes(4, 2)
    real = NodeLayout(nodes, real_nodes=[range(4)])     # two virtual nodes inside one real one
    with environment(MPICOLL_SHM_SINGLE_COPY="off", MPICOLL_HIER_INNER=None):
        assert decide(algorithm="hierarchical", nbytes=64 << 10, size=4, st=real)[1] == {
            "inner": "shm"}
        assert decide(algorithm="hierarchical", nbytes=64 << 10, size=4, st=real,
                      given={"inner": "ring"})[1] == {}
        assert decide(algorithm="hierarchical", nbytes=64 << 10, size=4, st=real,
                      scheduled=True)[1] == {}
        spans = NodeLayout([range(4)], real_nodes=nodes)    # a layout node across real nodes
        assert decide(algorithm="hierarchical", nbytes=64 << 10, size=4, st=spans)[1] == {}
    with environment(MPICOLL_HIER_INNER="ring"):
        assert decide(algorithm="hierarchical", nbytes=64 << 10, size=4, st=real)[1] == {}


@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter_block", "allgather",
                                        "bcast"])
def test_classic_is_reached_when_the_model_predicts_nothing(monkeypatch, collective):
    monkeypatch.setattr(select, "_from_table", lambda *a: None)
    monkeypatch.setattr(select, "_from_model", lambda *a: None)
    select.choose.cache_clear()
    try:
        assert select.choose(collective, 1 << 20, 4, 1 << 18) == select._classic(
            collective, 1 << 20, 4, 1 << 18)
    finally:
        select.choose.cache_clear()


def test_single_copy_expected_follows_the_setting_and_the_cores():
    from mpicoll.algorithms import allreduce_shm
    have = allreduce_shm._HAVE_READV
    with environment(MPICOLL_SHM_SINGLE_COPY="auto"):
        assert allreduce_shm.single_copy_expected(2, 2) == have
        assert not allreduce_shm.single_copy_expected(3, 2)     # ranks take turns on a core
        assert not allreduce_shm.single_copy_expected(1, 2)     # nothing to read
    with environment(MPICOLL_SHM_SINGLE_COPY="on"):
        assert allreduce_shm.single_copy_expected(8, 2) == have
    with environment(MPICOLL_SHM_SINGLE_COPY="off"):
        assert not allreduce_shm.single_copy_expected(2, 2)
