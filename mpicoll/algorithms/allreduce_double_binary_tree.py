"""Double binary tree all-reduce, as NCCL builds its tree: a chain inside each node, two
complementary binary trees across the nodes, each carrying half of the vector, pipelined.

The trees. Over the M nodes, tree 0 is the in-order binary tree rooted at node 0 (``btree``:
node j with lowest set bit b has children j - b/2 and j + b/2, or the largest j + b/2^i that
exists; the root has the one child 2^(ceil(lg M) - 1)), in which every odd node is a leaf. Tree 1
is the same tree mirrored (node j -> M-1-j) when M is even, shifted by one (j -> j+1 mod M) when
M is odd, so that the nodes that are leaves in tree 0 are interior in tree 1: each node's
links carry the full load of only one tree. Inside every node the ranks form a chain hanging
from the node's head: in tree 0 the chain runs local 0 -> 1 -> ... -> L-1 with local 0 the head
(the rank that talks to other nodes), in tree 1 it runs backwards from local L-1, so the two
trees leave a node through different ranks (different NICs, on rails L-1 and 0).

The data. Tree t carries half t of the vector (``block_displs(count, 2)``), cut into k chunks.
Phase 1 (reduce, up the tree): a rank adds the chunk of each of its children into its own and
sends the sum to its parent. Phase 2 (broadcast, down the tree): the root's finished chunk is
copied down to every rank. Every element is reduced once, along one tree, and then copied, so
all ranks end with the same bits.

The pipeline, as global rounds (the step index before ``make_schedule`` drops empty ones).
With h(x) the height of x in its tree (0 for a leaf), d(x) its depth (0 for the root) and H the
tree's height: x sends chunk c to its parent in round c + h(x) (its children, lower, sent theirs
earlier); the root, complete after round c + H - 1, starts chunk c down in round c + H, and x
receives it in round c + H + d(x) - 1, so phase 2 overlaps phase 1 (NCCL's "tree up-down").
Both ends of every transfer put it in the same round, so the schedule cannot deadlock; a copy
lands on a chunk already sent up (it is always older than the chunk going up). Both trees run in
the same rounds. There are k + 2H - 1 rounds.

The chunk count is the cost model's (``chunks``): the k that minimises ``cost`` below with the
profile ``auto`` uses (``MPICOLL_PROFILE``, else the shipped one; alpha and beta between nodes
when there are several): k* = sqrt((2H.Y - X)/alpha) with X, Y below, at most ``MAX_CHUNKS``
and no more than the elements of half the vector. A schedule sees elements, not bytes: it takes
8-byte elements; ``schedule(..., chunks=k)`` chooses. The chunk count changes no result bit.

Source: Sanders, Speck & Traeff, "Two-tree algorithms for full bandwidth broadcast, reduction
and scan", Parallel Computing 35(12), 2009; NCCL 2.4 (``ncclGetBtree``/``ncclGetDtree`` in
``src/graph/trees.cc``, the intra-node chain in ``src/graph/connect.cc``).

Cost, n bytes, M nodes of L ranks, k chunks of c = n/(2k) bytes per tree, H = ceil(lg M) + L - 1
the height of a tree. In full flow (k - 1 rounds) the busiest rank moves w chunks each way per
round and reduces r (w = 4, r = 2 when L = 1: in its interior tree two children up, its parent
down, and its parent in the other tree; with chains w = 5, r = 3); the 2H rounds that fill and
drain the pipeline move at most 2 chunks each way and reduce one on average. Every round runs at
the pace of the slowest link (alpha, beta between nodes):
    T = (k + 2H - 1).alpha + (k - 1).(w.beta + r.gamma).c + 2H.(2.beta + gamma).c
      = (k + 2H - 1).alpha + X + (2H.Y - X)/k,   X = (w.beta + r.gamma).n/2, Y = (2.beta + gamma).n/2
      -> (w/2).n.beta + (r/2).n.gamma + (k + 2H - 1).alpha for many chunks (L = 1: 2nβ + nγ).
It bounds the in-process alpha-beta-gamma clock from above: 0.56-1.00 of it at P = 5..32,
L = 1..8, k = 1..64 (the fill rounds of the chains move one chunk, not two).
Bytes each rank sends: n/2 per tree to its parent (not at the root) plus n/2 per child, which
is 2n(p-1)/p on average, as the ring -- but up to 2n on an interior rank (n to the root).
"""

from __future__ import annotations

import functools
import math

from .. import settings
from ..schedule import Recv, Schedule, Send, block_displs, make_schedule
from ..topology import virtual_nodes

MAX_CHUNKS = 256


def btree(j: int, m: int) -> tuple:
    """``(parent, children)`` of node j in the in-order binary tree on 0..m-1 rooted at 0
    (parent None at the root)."""
    if j == 0:
        return None, ((1 << (m - 1).bit_length() >> 1,) if m > 1 else ())
    bit = j & -j
    parent = (j ^ bit) | (bit << 1)
    if parent >= m:
        parent = j ^ bit
    half = bit >> 1
    if not half:
        return parent, ()
    right = half
    while j + right >= m and right:
        right >>= 1
    return parent, (j - half,) + ((j + right,) if right else ())


def dtree(j: int, m: int, t: int) -> tuple:
    """``(parent, children)`` of node j in tree t (0: btree; 1: mirrored or shifted by one)."""
    if t == 0:
        return btree(j, m)
    if m % 2:
        to, back = (lambda x: (x - 1) % m), (lambda x: (x + 1) % m)
    else:
        to = back = (lambda x: m - 1 - x)
    parent, children = btree(to(j), m)
    return (None if parent is None else back(parent)), tuple(back(c) for c in children)


def rank_tree(nodes, t: int) -> dict:
    """Tree t over ranks: ``rank -> (parent, children)``: the nodes' tree, with a chain inside
    each node hanging from its head (local 0 in tree 0, local L-1 in tree 1)."""
    chains = [sorted(node) if t == 0 else sorted(node, reverse=True) for node in nodes]
    tree = {}
    for j, chain in enumerate(chains):
        up, down = dtree(j, len(chains), t)
        for i, rank in enumerate(chain):
            parent = chain[i - 1] if i else (None if up is None else chains[up][0])
            children = chain[i + 1:i + 2] + ([chains[c][0] for c in down] if i == 0 else [])
            tree[rank] = (parent, tuple(children))
    return tree


def _heights(tree: dict) -> tuple[dict, dict]:
    """Each rank's height (0 for a leaf) and depth (0 for the root) in ``tree``."""
    root = next(r for r, (parent, _) in tree.items() if parent is None)
    depth, order = {root: 0}, [root]
    for r in order:                              # breadth first: parents before children
        for c in tree[r][1]:
            depth[c] = depth[r] + 1
            order.append(c)
    height = {}
    for r in reversed(order):
        height[r] = max((height[c] + 1 for c in tree[r][1]), default=0)
    return height, depth


def schedule(rank: int, size: int, count: int, *, nodes, chunks: int | None = None) -> Schedule:
    """Both trees' transfers of this rank, by global round; in a round tree 0's ops come before
    tree 1's on every rank, so two messages between one pair in one round match in order."""
    if chunks is None:
        chunks = best_chunks(size, count, nodes)
    halves = block_displs(count, 2)
    rounds: dict = {}                            # global round -> ops of this rank
    for t in (0, 1):
        tree = rank_tree(nodes, t)
        height, depth = _heights(tree)
        H = max(height.values())
        lo = halves[t]
        cut = [lo + d for d in block_displs(halves[t + 1] - lo, chunks)]
        parent, children = tree[rank]
        for c in range(chunks):
            chunk = (cut[c], cut[c + 1])
            # Phase 1: reduce up the tree (a child sends chunk c in round c + its height)
            for child in children:
                rounds.setdefault(c + height[child], []).append(Recv(child, *chunk, reduce=True))
            if parent is not None:
                rounds.setdefault(c + height[rank], []).append(Send(parent, *chunk))
            # Phase 2: broadcast down (x receives chunk c in round c + H + depth(x) - 1)
            if parent is not None:
                rounds.setdefault(c + H + depth[rank] - 1, []).append(
                    Recv(parent, *chunk, reduce=False))
            for child in children:
                rounds.setdefault(c + H + depth[child] - 1, []).append(Send(child, *chunk))
    return make_schedule(rounds[r] for r in sorted(rounds))


def shape(p: int, ranks_per_node: int = 1) -> tuple[int, int, int]:
    """``(H, w, r)`` of the cost formula for p ranks on nodes of ``ranks_per_node``."""
    L = max(1, min(ranks_per_node, p))
    M = -(-p // L)
    if p == 1:
        return 0, 0, 0
    return (M - 1).bit_length() + L - 1, (4 if L == 1 else 5), (2 if L == 1 else 3)


def cost(p: int, n: float, alpha: float, beta: float, gamma: float, *, ranks_per_node: int = 1,
         alpha_intra: float | None = None, beta_intra: float | None = None,
         chunks: int | None = None) -> float:
    H, w, r = shape(p, ranks_per_node)
    if p == 1:
        return 0.0
    k = chunks or _argmin_chunks(H, w, r, n, alpha, beta, gamma, MAX_CHUNKS)
    c = n / (2 * k)
    return ((k + 2 * H - 1) * alpha + (k - 1) * (w * beta + r * gamma) * c
            + 2 * H * (2 * beta + gamma) * c)


def _argmin_chunks(H, w, r, n, alpha, beta, gamma, max_chunks):
    """The k of least ``cost``: T = (k + 2H - 1).alpha + X + (2H.Y - X)/k with
    X = (w.beta + r.gamma).n/2 and Y = (2.beta + gamma).n/2, so k* = sqrt((2H.Y - X)/alpha);
    the better of its two integer neighbours within [1, max_chunks]."""
    X, Y = (w * beta + r * gamma) * n / 2, (2 * beta + gamma) * n / 2
    gain = 2 * H * Y - X
    if gain <= 0:
        return 1
    guess = math.sqrt(gain / alpha) if alpha > 0 else max_chunks
    candidates = {max(1, min(max_chunks, int(guess) + d)) for d in (0, 1)}
    return min(candidates, key=lambda k: (k + 2 * H - 1) * alpha + gain / k)


def best_chunks(size: int, count: int, nodes=None) -> int:
    """The chunk count the cost model picks for ``count`` 8-byte elements (at most
    ``MAX_CHUNKS``, and no more than the elements of half the vector)."""
    nodes = nodes or virtual_nodes(size, 1)
    L = max(map(len, nodes))
    alpha, beta, gamma = _link(len(nodes) > 1)
    H, w, r = shape(size, L)
    limit = max(1, min(MAX_CHUNKS, count // 2))
    if size == 1:
        return 1
    return _argmin_chunks(H, w, r, 8 * count, alpha, beta, gamma, max_chunks=limit)


@functools.lru_cache(maxsize=2)
def _link(inter: bool) -> tuple[float, float, float]:
    """(alpha, beta, gamma) of the cost-model profile, between nodes or inside one."""
    from ..model import load_profile          # model -> registry -> this module: import late
    profile = load_profile()
    return profile.link(inter) + (profile.gamma,)


def _forget() -> None:
    _link.cache_clear()


settings.on_reload(_forget)          # settings.reload() forgets the profile
