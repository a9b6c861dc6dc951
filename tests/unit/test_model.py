"""The cost model across nodes: each algorithm's bytes priced by what its own schedule puts on a
node's link (``model.nic_load``), hand-checked on the schedules' shapes."""

import math

import numpy as np

import pytest

from mpicoll import model, select
from mpicoll.registry import lookup
from mpicoll.testing import environment
from mpicoll.topology import virtual_nodes

INTRA, INTER = 0.1e-9, 8e-9         # beta inside a node and between nodes (s per byte)


def load(algorithm, p, L, **given):
    options = lookup("allreduce", algorithm).resolve(given, virtual_nodes(p, L))
    return model.nic_load("allreduce", algorithm, p, L, tuple(options.items()))


def profile():
    return model.Profile(alpha=2e-6, beta=INTRA, gamma=1e-11, alpha_inter=100e-6,
                         beta_inter=INTER)


@pytest.mark.parametrize("p, L", [(8, 2), (8, 4), (6, 2), (12, 3)])
def test_the_rank_order_ring_sends_one_flow_out_of_each_node(p, L):
    """Block placement: only a node's last rank sends off the node, one block a step, while
    every rank sends one block a step: the inter-node beta, once, is the ring's beta."""
    ring = load("ring", p, L)
    assert ring.flows == 1.0
    assert math.isclose(ring.beta(INTRA, INTER), INTER)
    assert math.isclose(sum(ring.sent), 2 * (p - 1) / p)


def test_recursive_halving_sends_both_ranks_of_a_node_out_at_once():
    """p = 8 on nodes of 2: the reduce-scatter's steps send n/2, n/4 to the other nodes
    (distances 4, 2) and n/8 inside the node (distance 1), the all-gather the same back; both
    ranks of a node send off it together, so its inter-node bytes cost twice."""
    halving = load("recursive_halving", 8, 2)
    assert halving.flows == 2.0
    out, inside = 2 * (1 / 2 + 1 / 4), 2 * (1 / 8)
    expected = (2 * out * INTER + inside * INTRA) / (2 * (1 / 2 + 1 / 4 + 1 / 8))
    assert math.isclose(halving.beta(INTRA, INTER), expected)


@pytest.mark.parametrize("inner, flows", [("ring", 2), ("shm", 2), ("recursive_halving", 2),
                                          ("binomial", 1)])
def test_hierarchical_shards_share_the_nodes_link_and_its_leaders_do_not(inner, flows):
    assert load("hierarchical", 8, 2, inner=inner).flows == flows
    assert load("hierarchical", 12, 4, inner=inner).flows == (4 if flows == 2 else 1)


def test_predict_prices_the_shared_link_across_nodes_only():
    pr = profile()
    n = 4 << 20
    ring = lookup("allreduce", "ring").cost
    halving = lookup("allreduce", "recursive_halving").cost
    assert math.isclose(model.predict("ring", 8, n, pr, ranks_per_node=2),
                        pr.overhead + ring(8, n, pr.alpha_inter, INTER, pr.gamma))
    beta = load("recursive_halving", 8, 2).beta(INTRA, INTER)
    assert math.isclose(model.predict("recursive_halving", 8, n, pr, ranks_per_node=2),
                        pr.overhead + halving(8, n, pr.alpha_inter, beta, pr.gamma))
    # on one node nothing changes: the formula with the intra-node link
    assert math.isclose(model.predict("recursive_halving", 8, n, pr),
                        pr.overhead + halving(8, n, pr.alpha, INTRA, pr.gamma))
    hier = lookup("allreduce", "hierarchical").cost
    assert math.isclose(
        model.predict("hierarchical", 8, n, pr, ranks_per_node=2, inner="ring", outer="ring"),
        pr.overhead + hier(8, n, pr.alpha_inter, 2 * INTER, pr.gamma, ranks_per_node=2,
                           alpha_intra=pr.alpha, beta_intra=INTRA, inner="ring", outer="ring"))


def test_auto_across_nodes_leaves_halving_where_it_doubles_a_nodes_bytes(tmp_path):
    """4 nodes x 2 ranks on 1 Gbit/s links (docs/fabric.md): recursive halving took 2.2x the
    ring's time at 4 MiB, which the model without the shared link had ranked first."""
    profile().to_json(tmp_path / "profile.json")
    with environment(MPICOLL_PROFILE=str(tmp_path / "profile.json")):
        select.reload()
        try:
            predicted = model.predict_all(8, 4 << 20, model.default_profile(), ranks_per_node=2)
            assert predicted["ring"] < predicted["recursive_halving"]
            assert select._from_model("allreduce", 4 << 20, 8, 2) != "recursive_halving"
        finally:
            select.reload()


def test_the_walk_is_bounded_for_large_jobs():
    """Large layouts are walked as at most 8 nodes of at most 8 ranks of the same shape: the ring
    at 1,024 ranks in nodes of 8 still sends one flow out of each node; hierarchical's shards on
    nodes of 64 are 64 flows (scaled back from the walk's 8), its leaders one."""
    assert model.walked_layout(1024, 8) == (64, 8)          # 128 nodes: a power of two
    assert model.walked_layout(1000, 8) == (56, 8)          # 125 nodes: 7, the last one full
    assert model.walked_layout(1003, 8) == (51, 8)          # ... a last node of 3
    assert model.walked_layout(4096, 64) == (64, 8)
    assert model.walked_layout(24, 8) == (24, 8)            # small layouts as they are
    ring = load("ring", 1024, 8)
    assert ring.flows == 1.0 and math.isclose(ring.beta(INTRA, INTER), INTER)
    assert load("hierarchical", 4096, 64, inner="ring").flows == 64.0
    assert load("hierarchical", 4096, 64, inner="binomial").flows == 1.0
    assert load("recursive_halving", 4096, 64).flows == 8.0     # the walk's lower bound


def test_the_model_row_chooses_hierarchicals_outer_unless_a_setting_does(tmp_path):
    """With a link 80x slower between nodes than inside them, 4 nodes x 2 at 16 MiB: an outer
    ring or recursive halving (1.5n through a node's link) beats the default recursive doubling
    (2n) and every flat algorithm, so auto runs hierarchical with that outer;
    MPICOLL_HIER_OUTER set by the user has the last word."""
    from mpicoll.registry import ALLREDUCE
    from mpicoll.testing import NodeLayout
    profile().to_json(tmp_path / "profile.json")
    st = NodeLayout(virtual_nodes(8, 2))
    n = 16 << 20

    def decide():
        algo, extra = select.decide("allreduce", "auto", nbytes=n, count=n // 8, size=8,
                                    dtype=np.dtype(np.float64), op="sum", st=st, given={})
        return algo.name, extra.get("outer")
    with environment(MPICOLL_PROFILE=str(tmp_path / "profile.json")):
        select.reload()
        try:
            pr = model.default_profile()
            outers = next(o for o in ALLREDUCE["hierarchical"].options if o.name == "outer")
            times = {outer: model.predict("hierarchical", 8, n, pr, ranks_per_node=2,
                                          outer=outer) for outer in outers.choices}
            best = min(times, key=times.get)
            assert best in ("ring", "recursive_halving")
            assert times[best] < 0.8 * times["recursive_doubling"]
            assert times[best] < min(model.predict_all(8, n, pr, ranks_per_node=2).values())
            assert decide() == ("hierarchical", best)
            with environment(MPICOLL_HIER_OUTER="recursive_doubling"):
                select.reload()
                assert decide()[1] is None      # the setting's value runs, as resolve gives it
        finally:
            select.reload()


@pytest.mark.parametrize("p, L", [(10, 4), (7, 3), (96, 8)])
def test_every_collective_is_priced_on_uneven_and_large_layouts(p, L):
    """Uneven last nodes (hierarchical then takes its leaders), non-powers of two (the fold's
    steps misalign the lock step) and a large layout walked smaller (12 nodes as 7): a positive
    time each."""
    from mpicoll.registry import COLLECTIVES
    for collective in COLLECTIVES:
        predicted = model.predict_all(p, 1 << 20, profile(), collective=collective,
                                      ranks_per_node=L)
        assert predicted and all(t > 0 for t in predicted.values()), (collective, predicted)
