"""Every rank's schedule at once, as *waves*: the form the timed executor replays.

A wave is one step of each rank that takes part, as arrays over its messages (``src``, ``dst``,
``elements``, the receiver's ``reduce``, ``left`` and ``into_next``, and where the message sits
in each buffer).
Both ends of every message are in the same wave, each rank has at most one step per wave, and a
rank's steps come in wave order; so rank ``r``'s schedule is, wave by wave, the Sends it makes
and the Recvs it gets (``to_steps`` rebuilds it, and the tests check it against
``schedule(rank, size, count)`` for every rank).

``from_schedules`` makes the waves of any schedules (each rank's step j goes to the logical round
in which it completes, as in the in-process executor's clock). At scale that is too slow (a ring
at 16,384 ranks has 537 million operations), so two algorithms also have a direct all-ranks form:

* ``ring_waves`` -- the ring all-reduce, one wave per ring step, arrays built from the block
  offsets; when every block has the same size all waves of a phase share their arrays, and the
  timed executor evaluates the step once;
* ``node_layout_waves`` -- the node-layout all-reduce, composed the way its schedule is: the
  node-local phase of one node replicated on every node, the inter-node all-reduce of one shard
  (over the node count) replicated on every local rank (an outer ring built directly), and the
  node-local phase back; a generator;
* ``tree_waves`` -- the double binary tree all-reduce, one wave per global round of its
  pipeline, from per-rank arrays (parent, height, depth in each tree); a generator.

``waves(..., channels=C)`` splits a call into C parts run in lockstep, each on a permutation of
the ranks (``ring_channel_order``: NCCL-like rail-aligned rings; ``rotate_channel``).

``waves(..., pipeline=k)`` cuts ``hierarchical`` into k chunks whose node and network phases
overlap (``pipeline_waves``: the same lockstep merge, each chunk started later).

``waves(algo, size, count, **kwargs)`` picks the direct form when there is one for the
algorithm and its options, else ``from_schedules``.
"""

from __future__ import annotations

import hashlib
from itertools import chain, repeat, zip_longest
from typing import Iterable

import numpy as np

from ..algorithms import allreduce_double_binary_tree, allreduce_hierarchical, allreduce_ring
from ..schedule import Recv, Send, block_displs

__all__ = ["Wave", "from_schedules", "to_steps", "ring_waves", "node_layout_waves", "waves",
           "has_direct_form", "tree_waves", "pipeline_waves", "ring_channel_order",
           "rotate_channel", "channel_waves", "lanes_of"]


class Wave:
    """One step of every rank taking part, as arrays over its messages.

    ``elements``, ``reduce``, ``left`` and ``into_next`` are an array or one value for all
    messages (the timed executor reads ``elements`` and ``reduce``); ``key``
    is set when the same wave shape (src, dst, elements) repeats, so it is evaluated once;
    ``route`` when the same (src, dst) repeats with other sizes, so it is routed once.
    ``slices()`` gives each message's offset in the sender's and the receiver's buffer.
    """

    __slots__ = ("src", "dst", "elements", "reduce", "left", "key", "route", "_slices",
                 "into_next", "lane")

    def __init__(self, src, dst, elements, reduce, left, slices, key=None, route=None,
                 into_next=False, lane=None):
        self.src, self.dst, self.elements = src, dst, elements
        self.reduce, self.left, self._slices, self.key = reduce, left, slices, key
        self.route = route              # set when the same (src, dst) repeats
        self.into_next = into_next
        self.lane = lane                # each message's data flow: its sender's and its
        #                                 receiver's lane (one array if alike, or a pair)

    def slices(self) -> tuple[np.ndarray, np.ndarray]:
        lo = self._slices() if callable(self._slices) else self._slices
        return lo if isinstance(lo, tuple) else (lo, lo)

    def __len__(self) -> int:
        return len(self.src)


def _full(value, n):
    return np.broadcast_to(np.asarray(value), (n,))


def from_schedules(scheds) -> list[Wave]:
    """The waves of one schedule per rank (checked as the in-process executor checks them)."""
    from .inprocess import _link
    size = len(scheds)
    links = _link(scheds)            # raises ScheduleMismatch naming the message
    nsteps = [len(s.steps) for s in scheds]
    entry = [[0] * (n + 1) for n in nsteps]     # logical round each step is entered
    done = [[0] * n for n in nsteps]
    pc = [0] * size
    progress = True
    while progress:
        progress = False
        for r in range(size):
            s = pc[r]
            if s == nsteps[r]:
                continue
            peers = [links[(r, s, i)][1:] for i in range(len(scheds[r].steps[s]))]
            if any(pc[p] < ps for p, ps in peers):
                continue
            done[r][s] = 1 + max([entry[r][s]] + [entry[p][ps] for p, ps in peers])
            entry[r][s + 1] = done[r][s]
            pc[r] += 1
            progress = True
    stuck = [r for r in range(size) if pc[r] < nsteps[r]]
    if stuck:
        from .inprocess import Deadlock
        raise Deadlock(f"no rank can progress: ranks {stuck[:8]} wait forever")
    recv_of = {links[(r, s, i)][0]: op for r, sched in enumerate(scheds)
               for s, step in enumerate(sched.steps) for i, op in enumerate(step)
               if isinstance(op, Recv)}
    rows: dict[int, list] = {}
    for r, sched in enumerate(scheds):
        for s, step in enumerate(sched.steps):
            for i, op in enumerate(step):
                if not isinstance(op, Send):
                    continue
                key, b, bs = links[(r, s, i)]
                if done[r][s] != done[b][bs]:
                    raise ValueError(f"rank {r}'s step {s} and rank {b}'s step {bs} exchange a "
                                     f"message but complete in different rounds "
                                     f"({done[r][s]} and {done[b][bs]}): not wave-aligned")
                recv = recv_of[key]
                rows.setdefault(done[r][s], []).append(
                    (r, b, op.hi - op.lo, recv.reduce, recv.left, op.lo, recv.lo,
                     recv.into_next))
    out = []
    for k in sorted(rows):
        a = np.array(rows[k], dtype=np.int64).T
        out.append(Wave(a[0], a[1], a[2], a[3].astype(bool), a[4].astype(bool), (a[5], a[6]),
                        into_next=a[7].astype(bool)))
    return out


def to_steps(waves: Iterable[Wave], size: int) -> list[list[tuple]]:
    """Each rank's steps, rebuilt from waves; each step's operations in a canonical order."""
    steps: list[list[tuple]] = [[] for _ in range(size)]
    for w in waves:
        n = len(w)
        lo_s, lo_r = w.slices()
        el, red, left = _full(w.elements, n), _full(w.reduce, n), _full(w.left, n)
        into_next = _full(w.into_next, n)
        lo_s, lo_r = _full(lo_s, n), _full(lo_r, n)
        ops: dict[int, list] = {}
        for f in range(n):
            a, b, k = int(w.src[f]), int(w.dst[f]), int(el[f])
            ops.setdefault(a, []).append(Send(b, int(lo_s[f]), int(lo_s[f]) + k))
            ops.setdefault(b, []).append(Recv(a, int(lo_r[f]), int(lo_r[f]) + k, bool(red[f]),
                                              bool(left[f]), bool(into_next[f])))
        for r, o in ops.items():
            steps[r].append(canonical(o))
    return steps


def canonical(ops) -> tuple:
    """A step's operations in one order (they are posted together, so order is no part of it)."""
    return tuple(sorted(ops, key=repr))


# ----------------------------------------------------------------------------- direct forms

def ring_waves(size: int, count: int) -> Iterable[Wave]:
    """The ring all-reduce (``allreduce_ring``: ring reduce-scatter, then ring all-gather).

    Step s of the reduce-scatter: rank r sends block r-s-1 to r+1, which reduces it; step s of
    the all-gather: rank r sends block r-s to r+1, which copies it (blocks mod size).
    """
    if size < 2:
        return
    displs = np.array(block_displs(count, size))
    sizes = np.diff(displs)
    ranks = np.arange(size)
    right = (ranks + 1) % size
    even = bool((sizes == sizes[0]).all()) and sizes[0] > 0
    full = bool((sizes > 0).all())
    for phase, (shift, reduce) in enumerate(((1, True), (0, False))):   # RS, then AG
        for s in range(size - 1):
            if even:           # every wave alike but for its offsets, computed when asked
                yield Wave(ranks, right, int(sizes[0]), reduce, False,
                           lambda s=s, shift=shift: displs[(ranks - s - shift) % size],
                           key=("ring", size, int(sizes[0])), route=("ring", size))
                continue
            block = (ranks - s - shift) % size
            el = sizes[block]
            if full:           # every rank sends: the same route, other sizes
                yield Wave(ranks, right, el, reduce, False, lambda b=block: displs[b],
                           route=("ring", size))
                continue
            keep = el > 0
            b = block[keep]
            yield Wave(ranks[keep], right[keep], el[keep], reduce, False,
                       lambda b=b: displs[b])


def _remap(w: Wave, ranks: np.ndarray, offset) -> tuple:
    """Wave ``w`` of a group run by ``ranks`` (group rank i is ``ranks[:, i]`` for each row),
    its slices moved by ``offset`` (one per row): the arrays, row after row."""
    rows = ranks.shape[0]
    n = len(w)
    lo_s, lo_r = w.slices()
    off = np.asarray(offset).reshape(-1, 1)
    return (ranks[:, w.src].ravel(), ranks[:, w.dst].ravel(),
            np.tile(_full(w.elements, n), rows), np.tile(_full(w.reduce, n), rows),
            np.tile(_full(w.left, n), rows), (_full(lo_s, n) + off).ravel(),
            (_full(lo_r, n) + off).ravel(), np.tile(_full(w.into_next, n), rows))


def _merge(parts: list[tuple], key=None) -> Wave:
    cols = [np.concatenate([p[i] for p in parts]) for i in range(8)]
    return Wave(cols[0], cols[1], cols[2], cols[3], cols[4], (cols[5], cols[6]), key=key,
                into_next=cols[7])


def _group_waves(module, size: int, count: int) -> list[Wave]:
    if module is allreduce_ring:
        return list(ring_waves(size, count))
    return from_schedules([module.schedule(r, size, count) for r in range(size)])


def node_layout_waves(size: int, count: int, *, nodes, inner: str, outer: str):
    """The node-layout all-reduce (``allreduce_hierarchical``) on nodes of equal size, wave by
    wave (a generator: the waves of 24,576 ranks are never all in memory).

    Phase 1 and 3: the node-local schedules of L ranks, the same on every node. Phase 2 (shard):
    local rank i of every node runs the outer all-reduce on shard i; (leader): the nodes' first
    ranks run it on the whole vector. An outer ring is built directly (``ring_waves``'s
    arithmetic on every shard at once), other outers from their schedules over the M nodes.
    """
    members = np.array(nodes, dtype=np.int64)          # (M nodes, L ranks)
    M, L = members.shape
    first, last = allreduce_hierarchical.INNER[inner]
    outer_module = allreduce_hierarchical.OUTER[outer]
    zero = np.zeros(M, dtype=np.int64)
    tag = ("node-layout", M, L, inner, outer, count)
    for k, w in enumerate(_group_waves(first, L, count)):
        yield _merge([_remap(w, members, zero)], key=tag + (1, k))
    if inner == "binomial":
        leaders = members[:, :1].T                     # one row: the leaders
        for k, w in enumerate(_group_waves(outer_module, M, count)):
            yield _merge([_remap(w, leaders, [0])], key=tag + (2, k))
    elif outer_module is allreduce_ring:
        yield from _sharded_ring_waves(members, count)
    else:
        shard = block_displs(count, L)
        per_count: dict[int, list[Wave]] = {}
        rows: list[list[tuple]] = []
        for i in range(L):
            c = shard[i + 1] - shard[i]
            if c not in per_count:
                per_count[c] = _group_waves(outer_module, M, c)
            for k, w in enumerate(per_count[c]):
                if len(rows) <= k:
                    rows.append([])
                rows[k].append(_remap(w, members[:, i:i + 1].T, [shard[i]]))
        for k, parts in enumerate(rows):
            yield _merge(parts, key=tag + (2, k))
    for k, w in enumerate(_group_waves(last, L, count)):
        yield _merge([_remap(w, members, zero)], key=tag + (3, k))


def _sharded_ring_waves(members: np.ndarray, count: int):
    """Local rank i of every node runs the ring all-reduce of shard i over the M nodes: each
    wave is every shard's ring step at once (messages shard-major, node-minor)."""
    M, L = members.shape
    if M < 2:
        return
    shard = np.array(block_displs(count, L))
    sd = [np.array(block_displs(int(shard[i + 1] - shard[i]), M)) for i in range(L)]
    sizes = np.array([np.diff(d) for d in sd])            # (L, M): block sizes per shard
    nodes = np.arange(M)
    src = members.T.ravel()                                 # shard i, node n -> members[n, i]
    dst = members[(nodes + 1) % M].T.ravel()
    even = bool((sizes == sizes[0, 0]).all()) and sizes[0, 0] > 0
    full = bool((sizes > 0).all())
    route = ("sharded-ring", M, L)
    for shift, reduce in ((1, True), (0, False)):
        for s in range(M - 1):
            block = (nodes - s - shift) % M

            def slices(block=block):
                return (shard[:-1, None] + np.stack([d[block] for d in sd])).ravel()

            if even:
                yield Wave(src, dst, int(sizes[0, 0]), reduce, False, slices,
                           key=route + (int(sizes[0, 0]),), route=route)
                continue
            el = sizes[:, block].ravel()
            if full:
                yield Wave(src, dst, el, reduce, False, slices, route=route)
                continue
            keep = el > 0
            yield Wave(src[keep], dst[keep], el[keep], reduce, False,
                       lambda slices=slices, keep=keep: slices()[keep])


def tree_waves(size: int, count: int, *, nodes, chunks: int | None = None):
    """The double binary tree all-reduce (``allreduce_double_binary_tree``), wave by wave: wave
    g is the schedule's global round g on every rank at once (a generator). Each message's
    ``lane`` is its data flow: 2t going up tree t, 2t + 1 coming down, so that on an
    event-driven fabric a chunk goes up as soon as its children's have arrived, whatever comes
    down meanwhile (the root sends down from its up lane: after the reduction).

    Per tree t, rank x with parent: it sends chunk c up in round c + h(x) (its parent reduces
    it) and receives chunk c down in round c + H + d(x) - 1 (copied), so round g holds, per
    tree, the ranks with 0 <= g - h(x) < k going up and 0 <= g - H - d(x) + 1 < k going down.
    A wave's ``route`` and ``key`` are digests of its arrays, so the pipeline's full-flow
    rounds (the same ranks, the same chunk sizes) are routed and timed once.
    """
    dbt = allreduce_double_binary_tree
    if size < 2:
        return
    if chunks is None:
        chunks = dbt.best_chunks(size, count, nodes)
    halves = block_displs(count, 2)
    flows = []          # per tree and direction, sorted by the key that says when x sends
    H = 0
    for t in (0, 1):
        tree = dbt.rank_tree(nodes, t)
        height, depth = dbt._heights(tree)
        child = np.array([r for r in range(size) if tree[r][0] is not None], dtype=np.int64)
        parent = np.array([tree[r][0] for r in child], dtype=np.int64)
        h = np.array([height[r] for r in child], dtype=np.int64)
        d = np.array([depth[r] for r in child], dtype=np.int64)
        lo = halves[t]
        cut = lo + np.array(block_displs(halves[t + 1] - lo, chunks), dtype=np.int64)
        Ht = max(height.values())
        H = max(H, Ht)
        up, down = np.argsort(h, kind="stable"), np.argsort(d, kind="stable")
        lane = np.full(len(child), 2 * t)
        # up: chunk g - h(x) from x to its parent; down: chunk g - Ht - d(x) + 1 from the
        # parent (the root sends from its up lane: after its reduction)
        flows.append((child[up], parent[up], h[up], 0, True, lane, lane, cut))
        flows.append((parent[down], child[down], d[down], Ht - 1, False,
                      np.where(d[down] == 1, 2 * t, 2 * t + 1), lane + 1, cut))
    for g in range(chunks + 2 * H - 1):
        cols: list[list] = [[], [], [], [], [], [], []]  # src, dst, lo, elements, reduce, lanes
        for a, b, key, shift, up, slane, dlane, cut in flows:
            # chunk c = g - shift - key, 0 <= c < chunks: a run of the sorted keys
            i = np.searchsorted(key, g - shift - chunks + 1, "left")
            j = np.searchsorted(key, g - shift, "right")
            if i >= j:
                continue
            cc = g - shift - key[i:j]
            for col, v in zip(cols, (a[i:j], b[i:j], cut[cc], cut[cc + 1] - cut[cc],
                                     np.full(j - i, up), slane[i:j], dlane[i:j])):
                col.append(v)
        if not cols[0]:
            continue
        src, dst, lo, el, red, slane, dlane = (np.concatenate(c) for c in cols)
        keep = el > 0
        if not keep.all():
            src, dst, lo, el, red, slane, dlane = (x[keep] for x in (src, dst, lo, el, red,
                                                                      slane, dlane))
        if not len(src):
            continue
        route = ("tree", size, hashlib.blake2b(src.tobytes() + dst.tobytes() + slane.tobytes()
                                               + dlane.tobytes()).hexdigest())
        key = route + (hashlib.blake2b(el.tobytes() + red.tobytes()).hexdigest(),)
        yield Wave(src, dst, el, red, False, (lo, lo), key=key, route=route,
                   lane=(slane, dlane))


# ----------------------------------------------------------------------------- channels

def ring_channel_order(nodes: int, per_node: int, channel: int) -> np.ndarray:
    """Channel ``channel``'s ring over ``nodes`` x ``per_node`` ranks (block placement), as
    NCCL builds its rings: position -> rank. Each node is entered on one rail and left on
    another, and the hop between nodes stays on one rail (same NIC index both ends); over the
    ``per_node`` channels every NIC sends for exactly one channel and receives for one.

    Node n is entered at local rank (channel + s_n) % g and left at (channel + s_{n+1}) % g,
    with s = 0, 1, 0, 1, ... (an odd node count ends ..., 1, 2; with 2 ranks per node it keeps
    one cross-rail hop).
    """
    g, M = per_node, nodes
    if M == 1 or g == 1:
        return np.array([(i + channel) % g + n * g for n in range(M) for i in range(g)])
    s = [n % 2 for n in range(M)]
    if M % 2 and g >= 3:
        s[-1] = 2
    out = []
    for n in range(M):
        e, x = (channel + s[n]) % g, (channel + s[(n + 1) % M]) % g
        rest = [(e + j) % g for j in range(1, g) if (e + j) % g != x]
        path = [e] + rest + ([x] if x != e else [])
        out.extend(n * g + i for i in path)
    return np.array(out, dtype=np.int64)


def rotate_channel(size: int, per_node: int, channel: int) -> np.ndarray:
    """Logical rank -> rank for channel ``channel`` of a non-ring algorithm: local ranks rotated
    by the channel, so its node leaders (and their NICs) differ from channel to channel."""
    r = np.arange(size)
    return r // per_node * per_node + (r % per_node + channel) % per_node


def channel_waves(parts: list, perms: list, offsets: list, lags=None, lanes: int = 0):
    """Channels run in lockstep: wave k of every channel's waves (``parts``, on logical ranks
    mapped by ``perms``, slices moved by ``offsets``) make wave k of the call; with ``lags``,
    part i's wave k makes wave k + lags[i] (a pipeline's later chunks start later). With
    ``lanes`` (the lanes of one part's waves, e.g. 2 for the two trees) each message carries
    part index x ``lanes`` + its own lane (``Wave.lane``): an event-driven fabric keeps one clock
    per rank and lane, so channels share links but never wait for each other."""
    if lags is not None:
        parts = [chain(repeat(None, lag), part) for part, lag in zip(parts, lags)]
    last = (None, None, None, None)  # the last route and its (src, dst, lane): a ring's kept
    for ws in zip_longest(*parts):
        got = [(w, p, o) for w, p, o in zip(ws, perms, offsets) if w is not None and len(w)]
        if not got:
            continue
        routes = [w.route or w.key if w is not None else None for w in ws]
        route = (("channels",) + tuple(routes)
                 if all(r is not None for r, w in zip(routes, ws) if w is not None) else None)
        if route is not None and route == last[0]:
            src, dst, lane = last[1:]
        else:
            src = np.concatenate([p[w.src] for w, p, _ in got])
            dst = np.concatenate([p[w.dst] for w, p, _ in got])
            lane = _lanes([(i, w) for i, w in enumerate(ws) if w is not None and len(w)],
                          lanes) if lanes else None
            last = (route, src, dst, lane)

        def col(name):
            vals = [getattr(w, name) for w, _, _ in got]
            if all(np.ndim(v) == 0 for v in vals) and len({v for v in vals}) == 1:
                return vals[0]
            return np.concatenate([_full(v, len(w)) for v, (w, _, _) in zip(vals, got)])

        def slices(got=got):
            lo = [w.slices() for w, _, _ in got]
            return (np.concatenate([_full(a, len(w)) + o for (a, _), (w, _, o) in zip(lo, got)]),
                    np.concatenate([_full(b, len(w)) + o for (_, b), (w, _, o) in zip(lo, got)]))

        keyed = [w.key if w is not None else "-" for w in ws]
        key = ("channels",) + tuple(keyed) if all(k is not None for k in keyed) else None
        yield Wave(src, dst, col("elements"), col("reduce"), col("left"), slices, key=key,
                   route=route, into_next=col("into_next"), lane=lane)


def _lanes(got, lanes: int) -> tuple:
    """Sender and receiver lanes of merged channel parts: part i's lane l is i x lanes + l."""
    out = []
    for side in (0, 1):
        cols = []
        for i, w in got:
            own = w.lane[side] if isinstance(w.lane, tuple) else w.lane
            cols.append(i * lanes + (0 if own is None else own) + np.zeros(len(w), np.int64))
        out.append(np.concatenate(cols))
    return tuple(out)


_DIRECT = {allreduce_ring: ("ring", lambda size, count, **o: ring_waves(size, count)),
           allreduce_hierarchical: ("node-layout", node_layout_waves),
           allreduce_double_binary_tree: ("tree", tree_waves)}


def has_direct_form(algo, options: dict, nodes=None) -> bool:
    """Whether ``waves`` has a direct all-ranks form for this algorithm and these options."""
    if algo.module not in _DIRECT:
        return False
    if algo.module is allreduce_ring:
        return options.get("order", "rank") == "rank"
    if algo.module is allreduce_double_binary_tree:
        return nodes is not None
    return nodes is not None and len({len(n) for n in nodes}) == 1


def lanes_of(algo, nodes=None, direct: bool = True) -> int:
    """Data flows (``Wave.lane``) in one channel of ``algo``'s waves: 4 for the double binary
    tree's all-ranks form (up and down each of its two trees), else 1."""
    return 4 if (direct and algo.module is allreduce_double_binary_tree and nodes is not None) \
        else 1


def pipeline_waves(algo, size: int, count: int, pipeline: int, **kwargs):
    """``hierarchical`` cut into ``pipeline`` chunks (``block_displs(count, pipeline)``), each
    the whole node-layout all-reduce of its chunk, chunk j started D waves after chunk j-1, with
    D the longest of its three phases (in waves): so the node phase of chunk j+1 runs in the
    waves of chunk j's network phase, as NCCL pipelines its node and network stages. A rank's
    step of a merged wave is its steps of every chunk in that wave, run together; each chunk
    keeps its own order, and the chunks touch disjoint elements.
    """
    if algo.module is not allreduce_hierarchical or not has_direct_form(
            algo, {k: v for k, v in kwargs.items() if k != "nodes"}, kwargs.get("nodes")):
        raise ValueError(f"pipeline= needs hierarchical on nodes of equal size (its all-ranks "
                         f"form), got {algo.name!r}")
    displs = block_displs(count, pipeline)
    counts = [displs[j + 1] - displs[j] for j in range(pipeline)]
    phases = [0, 0, 0]
    for w in node_layout_waves(size, counts[0], **kwargs):
        phases[(w.key[-2] - 1) if w.key is not None and w.key[0] == "node-layout" else 1] += 1
    lag = max(phases)
    parts = [node_layout_waves(size, c, **kwargs) for c in counts]
    ident = np.arange(size)
    return channel_waves(parts, [ident] * pipeline, displs[:-1],
                         lags=[j * lag for j in range(pipeline)])


def waves(algo, size: int, count: int, *, direct: bool = True, channels: int = 1,
          per_node: int = 1, pipeline: int = 1, **kwargs) -> Iterable[Wave]:
    """All ranks' waves of ``algo`` (a ``registry.Algorithm``) for one call.

    ``kwargs`` are what its ``schedule`` takes (``nodes``, ``root``, its options).
    ``channels`` > 1 splits the call into that many (``block_displs(count, channels)``), run in
    lockstep: the rank-order ring on NCCL-like rail-aligned rings (``ring_channel_order``), any
    other algorithm on its ranks rotated inside each node (``rotate_channel``).
    ``pipeline`` > 1 (``hierarchical`` only): each channel's part cut into that many chunks,
    pipelined (``pipeline_waves``).
    """
    if channels > 1:
        displs = block_displs(count, channels)
        ring = (algo.module is allreduce_ring and direct
                and kwargs.get("order", "rank") == "rank")
        nodes = size // per_node
        parts, perms = [], []
        for k in range(channels):
            c = displs[k + 1] - displs[k]
            parts.append(waves(algo, size, c, direct=direct, pipeline=pipeline, **kwargs))
            perms.append(ring_channel_order(nodes, per_node, k) if ring
                         else rotate_channel(size, per_node, k))
        inner = lanes_of(algo, kwargs.get("nodes"), direct)
        return channel_waves(parts, perms, displs[:-1], lanes=inner)
    if pipeline > 1:
        return pipeline_waves(algo, size, count, min(pipeline, max(1, count)), **kwargs)
    options = {k: v for k, v in kwargs.items() if k not in ("nodes", "root")}
    if direct and has_direct_form(algo, options, kwargs.get("nodes")):
        form = _DIRECT[algo.module][1]
        if algo.module is allreduce_ring:
            return form(size, count)
        return form(size, count, **kwargs)
    return from_schedules([algo.schedule(r, size, count, **kwargs) for r in range(size)])
