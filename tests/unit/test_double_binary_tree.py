"""double_binary_tree: the two trees (NCCL's shapes), the pipelined schedule on node layouts and
chunk counts the registry sweep does not reach, and its cost against the in-process clock."""

import numpy as np
import pytest

from mpicoll.algorithms import allreduce_double_binary_tree as dbt
from mpicoll.simulators import inprocess
from mpicoll.topology import virtual_nodes


def test_btree_is_nccls_illustration():
    """NCCL's trees.cc draws 14 ranks: 0-8, 8-(4, 12), 4-(2, 6), 12-(10, 13), 2-(1, 3), ..."""
    tree = {j: dbt.btree(j, 14) for j in range(14)}
    assert tree[0] == (None, (8,))
    assert tree[8] == (0, (4, 12)) and tree[4] == (8, (2, 6)) and tree[12] == (8, (10, 13))
    assert tree[2] == (4, (1, 3)) and tree[10] == (12, (9, 11)) and tree[13] == (12, ())
    assert all(tree[j][1] == () for j in range(1, 14, 2))              # odd nodes are leaves
    # the second tree: mirrored for even M (3 is the root of 12 ranks), shifted for odd M
    assert dbt.dtree(11, 12, 1) == (None, (3,)) and dbt.dtree(1, 13, 1) == (None, (9,))


@pytest.mark.parametrize("m", range(1, 40))
def test_two_trees_span_the_nodes_and_complement_each_other(m):
    for t in (0, 1):
        tree = {j: dbt.dtree(j, m, t) for j in range(m)}
        roots = [j for j, (parent, _) in tree.items() if parent is None]
        assert len(roots) == 1, (m, t, roots)
        for j, (parent, children) in tree.items():
            assert len(children) <= 2 and all(tree[c][0] == j for c in children), (m, t, j)
        seen, todo = set(), roots[:]               # every node reached once from the root
        while todo:
            j = todo.pop()
            assert j not in seen
            seen.add(j)
            todo += tree[j][1]
        assert seen == set(range(m)), (m, t)
    # interior in one tree, leaf in the other -- but tree 0's root (one child) when M is odd
    both = [j for j in range(m) if dbt.dtree(j, m, 0)[1] and dbt.dtree(j, m, 1)[1]]
    assert both == ([0] if m % 2 and m > 1 else []), (m, both)


def layouts(p):
    return list(dict.fromkeys([virtual_nodes(p, k) for k in (1, 2, 3, 4, p)]
                              + [tuple(tuple(range(j, p, 2)) for j in range(min(2, p)))]))


@pytest.mark.parametrize("p", range(1, 18))
def test_every_layout_and_chunk_count(p):
    for nodes in layouts(p):
        for n in sorted({0, 1, 2, p, 2 * p + 1, 101}):
            # more chunks than elements (empty chunks, an empty message each): 200 on
            # n = 2p + 1 and 101, and on the shortest vectors up to P = 5; 2P + 2 above
            many = 200 if n >= 2 * p + 1 or p <= 5 else 2 * p + 2
            for chunks in (None, 1, 3, many):
                label = f"P={p} nodes={nodes} n={n} chunks={chunks}"
                ints = [np.arange(n, dtype=np.int64) * (r + 1) - 3 * r for r in range(p)]
                want = np.sum(np.stack(ints), axis=0) if n else ints[0].copy()
                scheds = [dbt.schedule(r, p, n, nodes=nodes, chunks=chunks) for r in range(p)]
                inprocess.run(scheds, ints, "sum")
                assert all(np.array_equal(x, want) for x in ints), label
                floats = [np.random.default_rng([p, n, r]).standard_normal(n) for r in range(p)]
                inprocess.run(scheds, floats, "sum")
                assert all(x.tobytes() == floats[0].tobytes() for x in floats), label


@pytest.mark.parametrize("p, L", [(2, 1), (5, 1), (8, 1), (16, 1), (8, 2), (12, 3), (16, 4),
                                  (32, 8)])
def test_rounds_and_cost_against_the_clock(p, L):
    """k + 2H - 1 rounds; cost() bounds the alpha-beta-gamma clock from above, within 2x."""
    alpha, beta, gamma = 2e-6, 1 / 25e9, 1 / 100e9
    nodes = virtual_nodes(p, L)
    H, _, _ = dbt.shape(p, L)
    for n in (1000, 100_000):
        for k in (1, 4, 16):
            scheds = [dbt.schedule(r, p, n, nodes=nodes, chunks=k) for r in range(p)]
            res = inprocess.run(scheds, [np.zeros(n) for _ in range(p)], "sum",
                                clock=(alpha, beta, gamma))
            assert res.rounds == k + 2 * H - 1, (p, L, n, k, res.rounds)
            model = dbt.cost(p, 8 * n, alpha, beta, gamma, ranks_per_node=L, chunks=k)
            assert 0.5 * model <= res.time <= model * (1 + 1e-9), (p, L, n, k, res.time, model)


def test_chunk_count_follows_the_model():
    """More chunks for more data, one when pipelining cannot pay, never more than elements."""
    assert dbt.best_chunks(16, 1) == 1 and dbt.best_chunks(2, 1 << 20) == 1
    few, many = dbt.best_chunks(16, 1 << 12), dbt.best_chunks(16, 1 << 20)
    assert 1 <= few < many <= dbt.MAX_CHUNKS
    H, w, r = dbt.shape(16)
    alpha, beta, gamma = 1e-6, 1e-9, 1e-10
    k = dbt._argmin_chunks(H, w, r, 8e6, alpha, beta, gamma, dbt.MAX_CHUNKS)
    times = {j: dbt.cost(16, 8e6, alpha, beta, gamma, chunks=j) for j in range(1, 257)}
    assert times[k] == pytest.approx(min(times.values()), rel=1e-12), (k, min(times, key=times.get))
