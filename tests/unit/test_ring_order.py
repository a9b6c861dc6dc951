"""The ring's rank order (``order="rank"|"node"|"rail"``): the permutation itself, and the ring
collectives run with it in-process at P = 1..17 on several node layouts."""

import numpy as np
import pytest

from mpicoll.simulators import inprocess
from mpicoll.simulators import inprocess
from mpicoll.topology import ORDERS, ring_order, virtual_nodes


def cyclic_nodes(size, nnodes):
    """``srun --distribution=cyclic``: rank r on node r % nnodes."""
    return tuple(tuple(range(j, size, nnodes)) for j in range(min(nnodes, size)))


def layouts(p):
    """Block nodes of k ranks, cyclic placements, and one uneven shuffled layout."""
    seen = []
    for k in (1, 2, 3, 4, p):
        seen.append(virtual_nodes(p, k))
    for m in (2, 3):
        seen.append(cyclic_nodes(p, m))
    if p >= 4:
        perm = np.random.default_rng(p).permutation(p).tolist()
        seen.append((tuple(sorted(perm[:1])), tuple(sorted(perm[1:p // 2])),
                     tuple(sorted(perm[p // 2:]))))
    return list(dict.fromkeys(seen))


def node_of(nodes):
    return {r: j for j, members in enumerate(nodes) for r in members}


def hops(ring):
    return list(zip(ring, ring[1:] + ring[:1]))


def test_seed_rail_ring():
    """The seed's lab 2: 2 nodes x 8, NCCL's ring 0..7, 15..8; every inter-node hop on one rail."""
    nodes = virtual_nodes(16, 8)
    assert ring_order(nodes, "rail") == tuple(range(8)) + tuple(range(15, 7, -1))
    assert ring_order(nodes, "node") == ring_order(nodes, "rank") == tuple(range(16))


@pytest.mark.parametrize("p", range(1, 18))
def test_orders_are_permutations_with_few_node_crossings(p):
    for nodes in layouts(p):
        where = node_of(nodes)
        local = {r: sorted(members).index(r) for members in nodes for r in members}
        for order in ORDERS:
            ring = ring_order(nodes, order)
            assert sorted(ring) == list(range(p)), (nodes, order, ring)
            crossings = sum(where[a] != where[b] for a, b in hops(list(ring)))
            if order != "rank":     # one hop out of each node, whatever the placement
                assert crossings == (len(nodes) if len(nodes) > 1 else 0), (nodes, order, ring)
        sizes = {len(m) for m in nodes}
        L, M = min(sizes), len(nodes)
        if M > 1 and len(sizes) == 1 and (M % 2 == 0 and L >= 2 or L >= 3):
            ring = list(ring_order(nodes, "rail"))
            cross_rail = [(a, b) for a, b in hops(ring) if where[a] != where[b]
                          and local[a] != local[b]]
            assert cross_rail == [], (nodes, ring)


def test_cyclic_placement_rank_ring_crosses_every_hop():
    nodes = cyclic_nodes(8, 2)
    where = node_of(nodes)
    for order, expected in (("rank", 8), ("node", 2), ("rail", 2)):
        ring = list(ring_order(nodes, order))
        assert sum(where[a] != where[b] for a, b in hops(ring)) == expected, order


def test_bad_order_and_bad_nodes():
    with pytest.raises(ValueError, match="unknown ring order 'zigzag'"):
        ring_order(((0, 1),), "zigzag")
    with pytest.raises(ValueError, match=r"do not hold each rank 0..3 once"):
        ring_order(((0, 1), (1, 3)), "node")
    with pytest.raises(ValueError, match="unknown order"):
        inprocess.allreduce([np.ones(3)] * 2, algorithm="ring", order="zigzag")


def inputs(p, n, seed):
    rng = np.random.default_rng([seed, p, n])
    return [rng.standard_normal(n) for _ in range(p)]


@pytest.mark.parametrize("p", range(1, 18))
def test_allreduce_every_order_and_layout(p):
    for nodes in layouts(p):
        for order in ORDERS:
            for n in sorted({0, 1, p - 1, p, p + 1, 13, 101}):
                label = f"P={p} nodes={nodes} order={order} n={n}"
                ints = [np.arange(n, dtype=np.int64) * (r + 1) + r for r in range(p)]
                out = inprocess.allreduce(ints, "sum", "ring", nodes=nodes, order=order)
                want = np.sum(np.stack(ints), axis=0) if n else np.zeros(0, np.int64)
                assert all(np.array_equal(o, want) for o in out), label
                floats = inputs(p, n, 1)
                out = inprocess.allreduce(floats, "sum", "ring", nodes=nodes, order=order)
                assert all(o.tobytes() == out[0].tobytes() for o in out), label + " bits differ"
                if n:
                    assert np.allclose(out[0], np.sum(np.stack(floats), axis=0)), label


@pytest.mark.parametrize("p", range(1, 18))
def test_reduce_scatter_and_allgather_every_order(p):
    n = 5
    for nodes in layouts(p):
        for order in ORDERS:
            label = f"P={p} nodes={nodes} order={order}"
            bufs = [np.arange(p * n, dtype=np.int64) * (r + 1) for r in range(p)]
            total = np.sum(np.stack(bufs), axis=0)
            scheds = inprocess.schedules("reduce_scatter_block", "ring", p, p * n, nodes=nodes,
                                         order=order)
            inprocess.run(scheds, bufs, "sum")
            for r in range(p):      # rank r owns block r, whatever the order
                assert np.array_equal(bufs[r][r * n:(r + 1) * n], total[r * n:(r + 1) * n]), label
            bufs = [np.zeros(p * n, np.int64) for _ in range(p)]
            for r in range(p):
                bufs[r][r * n:(r + 1) * n] = np.arange(n) + 100 * r
            want = np.concatenate([np.arange(n) + 100 * r for r in range(p)])
            scheds = inprocess.schedules("allgather", "ring", p, p * n, nodes=nodes, order=order)
            inprocess.run(scheds, bufs, "sum")
            assert all(np.array_equal(b, want) for b in bufs), label


def internode_elements(scheds, nodes):
    where = node_of(nodes)
    return sum(hi - lo for rank, s in enumerate(scheds) for _, sends in s.plan
               for peer, lo, hi in sends if where[peer] != where[rank])


def test_node_order_sends_fewer_bytes_across_nodes():
    """Cyclic placement on 2 nodes: every hop of the rank-order ring leaves the node, only 2 of
    the node-order ring's do; the bytes counted the way the MPI executor counts them."""
    p, n = 8, 8 * 1000
    nodes = cyclic_nodes(p, 2)
    counted = {order: internode_elements(inprocess.schedules("allreduce", "ring", p, n,
                                                             nodes=nodes, order=order), nodes)
               for order in ORDERS}
    # each rank sends 2(p-1) blocks of n/p; rank order: all of them cross, node order: 2 of 8 ranks'
    assert counted["rank"] == p * 2 * (p - 1) * (n // p)
    assert counted["node"] == counted["rail"] == 2 * 2 * (p - 1) * (n // p)


def test_auto_runs_node_order_across_nodes(monkeypatch):
    """``select.decide``'s order row: auto's ring in node order when the ranks span nodes."""
    from mpicoll import select
    from mpicoll.testing import NodeLayout, environment
    monkeypatch.setattr(select, "_from_table", lambda *args: "ring")

    def order(nodes, algorithm="auto"):
        algo, extra = select.decide("allgather", algorithm, nbytes=1 << 20, count=1 << 17,
                                    size=4, dtype=np.dtype(np.float64), op=None,
                                    st=NodeLayout(nodes), given={})
        assert algo.name == "ring"
        return extra.get("order")
    with environment(MPICOLL_RING_ORDER=None):
        assert order(virtual_nodes(4, 2)) == "node"
        assert order(virtual_nodes(4, 4)) is None           # one node
        assert order(virtual_nodes(4, 2), "ring") is None   # an explicit ring keeps its order
    with environment(MPICOLL_RING_ORDER="rail"):
        assert order(virtual_nodes(4, 2)) is None           # the variable decides