"""The timed executor: the project's own schedules replayed, with no data, over a fabric model.

It runs what the MPI executor runs -- the schedules of ``mpicoll.registry``'s algorithms -- as
waves (``allranks``: one step of every rank taking part, both ends of each message in the same
wave) over a ``fabric.Fabric``, and keeps one clock per rank:

* a message starts when both ends have entered the step that holds it; it pays the alpha of its
  path first (latency, no sharing: SimGrid's convention), then moves its bytes as a fluid flow;
* *sharing is max-min fair* (progressive filling): the flows of a wave that are moving at the same
  time get the max-min fair rates of their links (and a path through the spine never more than
  one spine link, ``fabric.spine.bandwidth``), re-solved whenever one of them starts or ends, as
  SimGrid's flow model does. Flows of different waves do not share (a wave is one logical round);
* a rank's step ends when its messages have ended, plus gamma x the bytes it reduces (or, on a
  fabric with ``overlap``, when both the messages and the reduction, started with the step, are
  done).

So on a contention-free flat fabric a step takes alpha + beta.max(sent, received) + gamma.reduced,
the in-process executor's clock and the model of every ``cost()`` formula.

That is the lockstep model of the textbook fabrics. A ``pipelined`` fabric (the NCCL-like
presets) is event-driven: a message leaves when its sender has the data and its link is free, a
rank moves on when its own inputs are there, with clocks per channel and data flow
(``Wave.lane``), static max-min shares, a channel at its slowest hop (``sharing``); its
equal-block ring is timed from its first wave (``_ring_pipelined``). NCCL's protocol pick and
adjustments: ``nccl_tuning``; ``algorithm="nvls"``, ``"nvls_tree"``, ``"collnet"``: the switches
reduce (``innetwork``); ``algorithm="nccl"`` (or ``"auto"``) on a fabric that names its GPU: the
algorithm and protocol NCCL's tuning picks among those the fabric has (``nccl_choice``).

``simulate(...)`` returns a ``Timing``: each rank's finish, the time (the last finish), algbw and
busbw, bytes per path and per link class, the bottleneck link (the one that held messages back
longest), inter-node and cross-rail hops (distinct rank pairs) and messages, the slowest message
rate, the protocol and channel count used, and the critical path of the last rank to finish split
into straggler delay, latency, transfer and reduction. ``delay=`` (seconds per rank, added before
the call) is the straggler hook.

Speed, with every shortcut exact: a wave's routing is computed once per route (``Wave.route``)
and its timing once per shape (``Wave.key``); a wave whose flows can all run at their own path's
rate at once (*contention-free*: no link asked for more than its capacity) has transfer times
that do not depend on when its flows start, so while every rank's clock is the same and such a
wave moves every rank alike, one number stands for all ranks, and when wave and clocks repeat
every P ranks (a leaf group), ranks 0..P-1 stand for all. A contended wave is solved once at
equal start times (cached) while all clocks are equal, else re-solved with the ranks' clocks.
``general=True`` skips every shortcut (the tests compare both). The max-min solve works on each
connected group of flows apart and, at each flow start or end, fills again only the moving
flows connected to it. Hop statistics are streamed and at most ``ROUTES_HELD`` messages of
routes are kept: memory is linear in the ranks. numba is loaded on the first call, not at import.
"""

from __future__ import annotations

import numpy as np

from .fabric import INTRA, PATH_NAMES, SPINE, TREES, Fabric, Routes
from . import nccl_tuning
from .allranks import has_direct_form, lanes_of, waves
from . import innetwork
from .result import CRITICAL, Timing, call_count
from .sharing import kernel, maxmin

__all__ = ["Timing", "run", "simulate", "nccl_choice", "call_count", "maxmin", "IN_SWITCH"]

IN_SWITCH = tuple(innetwork.ALGORITHMS)         # the all-reduces the switches reduce
# NCCL's algorithms (nccl_tuning) by the names simulate() runs them under
_SIMULATED = {"ring": "ring", "tree": "double_binary_tree", "nvls": "nvls",
              "nvls_tree": "nvls_tree", "collnet_direct": "collnet"}

# ----------------------------------------------------------------------------- routes and shapes

class _Route:
    """A wave's paths (``src`` -> ``dst``): kinds, link ids, alpha and rate cap per message, the
    link that limits each, whether the wave is contention-free; accumulates what it carried.
    ``csrc``, ``cdst``: the clocks of its ends, rank x ``lanes`` + the message's ``lane`` (its
    channel, on an event-driven fabric: one clock per rank and channel)."""

    def __init__(self, routes: Routes, src, dst, lane=None, lanes: int = 1,
                 pace: bool = False):
        n = len(src)
        N = routes.size
        self.src, self.dst = src, dst
        self.lanes = lanes
        if lanes > 1:
            slane, dlane = lane if isinstance(lane, tuple) else (lane, lane)
            self.csrc = src * lanes + (0 if slane is None else slane)
            self.cdst = dst * lanes + (0 if dlane is None else dlane)
        else:
            self.csrc, self.cdst = src, dst
        kind = self.kind = routes.kind(src, dst)
        links = self.links = routes.links(src, dst, kind)
        self.alpha = routes.alpha[kind]
        capl = routes.capacity[links]
        self.flowcap = np.minimum(capl.min(axis=1), routes.cap[kind])
        self.static = routes.fabric.pipelined
        paced = False
        if self.static:             # each flow its max-min share of the wave, all moving at once
            self.flowcap = kernel("rates")(links, routes.capacity, self.flowcap, routes.pad)
            paced = pace and lanes > 1   # a channel's pipeline at its slowest hop (slices)
            if paced:
                flow = self.cdst % lanes
                pace = np.full(lanes, np.inf)
                np.minimum.at(pace, flow, self.flowcap)
                slowest = np.full(lanes, -1)
                slowest[flow[self.flowcap == pace[flow]]] = np.flatnonzero(
                    self.flowcap == pace[flow])
                self.flowcap = pace[flow]
        use = np.bincount(links.ravel(), weights=np.repeat(self.flowcap, links.shape[1]),
                          minlength=routes.nlinks)
        self.free = bool((use[:-1] <= routes.capacity[:-1] * (1 + 1e-12)).all())
        # The link that holds each message back: the most oversubscribed on its path (the one
        # of least capacity when none is), the leaf's uplink when the spine's cap binds.
        with np.errstate(invalid="ignore", divide="ignore"):
            demand = np.where(np.isfinite(capl), use[links] / capl, 0.0)
        j = np.lexsort((capl, -demand), axis=-1)[:, 0] if n else np.zeros(0, np.int64)
        self.limit = links[np.arange(n), j]
        capped = (kind == SPINE) & (routes.cap[SPINE] < capl.min(axis=1))
        self.limit[capped] = links[capped, 2]
        if self.static and paced:               # held back by its channel's slowest hop
            self.limit = self.limit[slowest[flow]]
        stack = routes.fabric.stack_per_flow    # a message held back by its share of a stack
        if stack and routes.nhosts:
            held = (kind != INTRA) & (stack <= capl.min(axis=1))
            self.limit[held] = links[held, 4]
        NL = N * lanes
        self.perm = bool(n == NL and n and _is_perm(self.csrc, NL) and _is_perm(self.cdst, NL))
        g = routes.fabric.per_node
        net = kind != INTRA
        cross = net & (src % g != dst % g)                  # one rail when g == 1
        self.internode = np.unique(src[net] * N + dst[net])
        self.cross = np.unique(src[cross] * N + dst[cross])
        self.bytes = np.zeros(n)
        self.fbytes = np.zeros(n)           # bytes of the waves timed at bytes / flowcap
        self.drain = np.zeros(n)
        self.waves = 0
        self.shapes = []                # the keys of the shapes timed on this route
        self.minrate = float(self.flowcap.min()) if n else np.inf

    def solve(self, routes: Routes, start, b) -> np.ndarray:
        """Each message's transfer time when the messages start at ``start`` (max-min)."""
        release = start + self.alpha
        end = kernel("maxmin")(release, b, self.links, routes.capacity, self.flowcap,
                                routes.pad)
        return end - release


class _Shape:
    """A wave's timing at one set of message sizes: transfer times when they do not depend on
    the start times (contention-free) or at equal starts; the uniform and periodic shortcuts."""

    def __init__(self, routes: Routes, route: _Route, b, equal_starts: bool):
        """``equal_starts``: whether the clocks are all equal now (else a contended wave's
        equal-start solve would never be used: clocks once apart stay apart)."""
        self.route, self.b = route, b
        self.uses = 0
        self.uniform = None       # (alpha, transfer, received) when it moves every rank alike
        self.periodic = None      # the wave on ranks 0..P-1 when it repeats every P ranks
        n = len(b)
        if route.free:
            self.drain = b / route.flowcap
        elif equal_starts:
            self.drain = route.solve(routes, np.zeros(n), b)
        else:
            self.drain, self.rate = None, np.inf
            return
        self.rate = _rate(b, self.drain)
        src, dst, N = route.csrc, route.cdst, routes.size * route.lanes
        if n < N:
            return
        dur = route.alpha + self.drain
        fin = np.full(N, -np.inf)
        sent = np.full(N, -np.inf)            # event-driven: each rank's longest send
        if route.static:
            np.maximum.at(sent, src, self.drain)
        else:
            np.maximum.at(fin, src, dur)
        np.maximum.at(fin, dst, dur)
        received = np.bincount(dst, minlength=N)
        # every rank ends at once and reduces as many messages (one per channel, say)
        if (np.isfinite(fin[0]) and (fin == fin[0]).all() and (sent == sent[0]).all()
                and (received == received[0]).all()):
            mine = np.flatnonzero(dst == 0) if route.static else np.flatnonzero(
                (src == 0) | (dst == 0))
            f = int(mine[np.argmax(dur[mine])])
            self.uniform = (float(route.alpha[f]), float(self.drain[f]), int(received[0]),
                            float(sent[0]))
        if not route.perm:
            return
        P = routes.period * route.lanes
        if P < N and route.free:
            rows = N // P
            order = np.argsort(src)
            d = dst[order].reshape(rows, P)
            a, dr = route.alpha[order].reshape(rows, P), self.drain[order].reshape(rows, P)
            moved = (d - (np.arange(rows) * P)[:, None]) % N
            if (moved == moved[0]).all() and (a == a[0]).all() and (dr == dr[0]).all():
                self.periodic = (np.arange(P), moved[0] % P, a[0].copy(), dr[0].copy())


def _rate(b, drain) -> float:
    ok = drain > 0
    return float((b[ok] / drain[ok]).min()) if ok.any() else np.inf


def _is_perm(a, n) -> bool:
    return bool((np.bincount(a, minlength=n) == 1).all())


class _Clocks:
    """Every rank's clock and critical-path parts, stored as compactly as the symmetry allows:
    one value for all ranks (``uniform``), one per rank of a period of the fabric
    (``periodic``: rank r stands for r, r + P, r + 2P, ...), or one per rank (``full``).
    ``pipelined`` (event-driven steps): ``t`` is when a rank has its inputs, ``lf`` when its
    send link is free (``sharing.advance_pipelined``); else ``t`` is a lockstep clock."""

    def __init__(self, delay: np.ndarray, period: int, overlap: bool, general: bool,
                 pipelined: bool = False):
        self.size, self.period, self.overlap = len(delay), period, overlap
        self.general, self.pipelined = general, pipelined
        self._work = None
        self.t = delay.copy()
        self.lf = delay.copy()
        self.comp = np.zeros((len(delay), len(CRITICAL)))
        self.comp[:, 0] = delay
        self.mode = "full"
        if len(delay) and (delay == delay[0]).all() and not general:
            self.mode, self.t, self.lf, self.comp = ("uniform", self.t[:1], self.lf[:1],
                                                     self.comp[:1])

    def expand(self, mode: str) -> None:
        n = {"periodic": self.period, "full": self.size}[mode]
        reps = n // len(self.t)
        self.t, self.lf = np.tile(self.t, reps), np.tile(self.lf, reps)
        self.comp = np.tile(self.comp, (reps, 1))
        self.mode = mode

    def _step(self, src, dst, alpha, drain, red):
        n = len(self.t)
        if self.pipelined:
            m = len(src)
            if self._work is None or len(self._work[0]) != n:
                self._work = (np.full(n, -np.inf), np.full(n, -1, np.int64), np.empty(n),
                              np.zeros(n), np.empty(0), np.empty(0, np.int64),
                              np.empty((0, self.comp.shape[1])))
            fin, win, gap, redt, begin, who, rows = self._work
            if len(begin) < m:
                begin, who, rows = np.empty(m), np.empty(m, np.int64), np.empty((m, rows.shape[1]))
                self._work = (fin, win, gap, redt, begin, who, rows)
            kernel("advance_pipelined")(self.t, self.lf, self.comp, src, dst, alpha, drain, red,
                                        self.overlap, fin, win, gap, redt, begin, who, rows)
            return
        if self._work is None or len(self._work[0]) != n:
            self._work = (np.empty(n), np.empty_like(self.comp), np.empty(n),
                          np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n))
        t2, c2, *work = self._work
        kernel("advance")(self.t, self.comp, src, dst, alpha, drain, red, self.overlap, t2, c2,
                          *work)
        self._work = (self.t, self.comp, *work)
        self.t, self.comp = t2, c2

    def _uniform(self, a, dr, received, sent, red):
        """A wave that moves every rank alike, on the one clock."""
        r = red * received
        if self.pipelined:
            start = max(self.t[0], self.lf[0])
            gap = start - self.t[0]
            extra = max(0.0, r - gap - a - dr) if self.overlap else r
            self.t = self.t + (gap + a + dr + extra)
            self.comp = self.comp + (0.0, a, dr + gap, extra, 1.0)
            self.lf = np.maximum(self.lf, start + sent)
            return
        extra = max(0.0, r - a - dr) if self.overlap else r
        self.t = self.t + (a + dr + extra)
        self.comp = self.comp + (0.0, a, dr, extra, 1.0)

    def advance(self, routes: Routes, shape: _Shape | None, route: _Route, b, red):
        """One wave; ``red``: seconds of reduction per message (one value if all alike).
        Returns the transfer times when they had to be solved for these clocks, else None."""
        alike = np.ndim(red) == 0
        if shape is not None:
            if self.mode == "uniform" and shape.uniform is not None and alike:
                self._uniform(*shape.uniform, float(red))
                return None
            if self.mode != "full" and shape.periodic is not None and alike:
                if self.mode == "uniform":
                    self.expand("periodic")
                s, d, a, dr = shape.periodic
                self._step(s, d, a, dr, np.full(len(s), float(red)))
                return None
        src, dst = route.csrc, route.cdst
        if self.mode != "full":
            uniform_start = self.mode == "uniform"
            self.expand("full")
        else:
            uniform_start = False
        red = np.ascontiguousarray(np.broadcast_to(red, (len(route.src),)), dtype=np.float64)
        if shape is not None and (route.free or uniform_start):
            self._step(src, dst, route.alpha, shape.drain, red)
            return None
        if route.free and (route.static or not self.general):
            self._step(src, dst, route.alpha, b / route.flowcap, red)
            return None
        drain = route.solve(routes, np.maximum(self.t[src], self.t[dst]), b)
        self._step(src, dst, route.alpha, drain, red)
        return drain

    def finish(self) -> tuple[np.ndarray, np.ndarray]:
        """Each rank's finish (its last arrival, or its last send leaving) and its critical path
        (a send still leaving at the end counts as transfer)."""
        reps = self.size // len(self.t) if len(self.t) else 0
        t, comp = np.tile(self.t, reps), np.tile(self.comp, (reps, 1))
        if self.pipelined and reps:
            lf = np.tile(self.lf, reps)
            comp[:, 2] += np.maximum(0.0, lf - t)
            t = np.maximum(t, lf)
        return t, comp


class _Totals:
    """What a run moved, streamed: bytes per link and per path, the time each link held
    messages back, distinct hop pairs, the slowest message rate."""

    def __init__(self, routes: Routes):
        self.routes = routes
        self.loads = np.zeros(routes.nlinks)
        self.held = np.zeros(routes.nlinks)
        self.path_bytes = {name: 0.0 for name in PATH_NAMES}
        self.path_messages = {name: 0 for name in PATH_NAMES}
        self.internode = np.zeros(0, np.int64)
        self.cross = np.zeros(0, np.int64)
        self.rate = np.inf

    def seen(self, route: _Route) -> None:
        """A route's hop pairs, once per route."""
        if len(route.internode):
            self.internode = np.union1d(self.internode, route.internode)
        if len(route.cross):
            self.cross = np.union1d(self.cross, route.cross)

    def flush(self, route: _Route) -> None:
        """Add what ``route`` carried (its accumulated bytes and transfer times)."""
        k = route.links.shape[1]
        self.loads += np.bincount(route.links.ravel(), weights=np.repeat(route.bytes, k),
                                  minlength=self.routes.nlinks)
        held = np.zeros(self.routes.nlinks)
        np.maximum.at(held, route.limit, route.drain + route.fbytes / route.flowcap)
        self.held += held
        pb = np.bincount(route.kind, weights=route.bytes, minlength=3)
        pm = np.bincount(route.kind, minlength=3)
        for i, name in enumerate(PATH_NAMES):
            self.path_bytes[name] += float(pb[i])
            self.path_messages[name] += route.waves * int(pm[i])

    def class_bytes(self) -> dict:
        n2, h = 2 * self.routes.size, self.routes.host0
        out = {"intra": float(self.loads[:n2].sum()),
               "nic": float(self.loads[n2:2 * n2].sum()),
               "spine": float(self.loads[2 * n2:h].sum())}
        if self.routes.fabric.stack:
            out["stack"] = float(self.loads[h:self.routes.copy0].sum())
        if self.routes.fabric.copy:
            out["copy"] = float(self.loads[self.routes.copy0:-1].sum())
        return out

    def top(self) -> tuple[int, float, float]:
        held = self.held[:-1]                   # not the padding link
        if not len(held):
            return 0, 0.0, 0.0
        i = int(held.argmax())
        return i, float(self.loads[i]), float(held[i])


# ----------------------------------------------------------------------------- running

# Messages of the routes ``run`` keeps for reuse (least recently used dropped first): a ring's
# one route is always kept, a tree's rounds (each a new route) do not pile up.
ROUTES_HELD = 1 << 19
# A ring all-reduce with unequal blocks has no two waves alike: 2P(P-1) messages per channel to
# time one by one (1e10 at 25,000 ranks x 8 channels). Beyond this many it is timed with every
# block at the larger size (count rounded up to a multiple of ranks x channels): an upper bound,
# above the exact time by at most 2(P-1) x one element's transfer per step (tests check it),
# and the bytes reported are the call's own.
EXACT_RING_MESSAGES = 1 << 24
# Most chunks of a double binary tree on an event-driven fabric (fewer beyond 2,048 ranks: the
# waves are chunks + 2 x height, each over every rank).
TREE_CHUNKS = 2048

def run(wave_list, fabric: Fabric, *, itemsize: int = 4, delay=None, nbytes: int = 0,
        collective: str = "allreduce", general: bool = False, base: float = 0.0,
        lanes: int = 1, paced: bool = False) -> Timing:
    """Time ``wave_list`` (``allranks.Wave``s) on ``fabric``; ``delay``: seconds per rank.

    ``general=True`` takes no shortcut: every wave is max-min solved at the ranks' own clocks.
    ``base``: seconds added to every rank's start (a protocol's per-call latency).
    ``lanes``: on an event-driven fabric, the channels whose messages carry ``Wave.lane``: each
    rank keeps one clock per channel, and finishes with its last channel; ``paced``: each
    channel's (lane's) messages of a wave move at the rate of its slowest (a ring's or a tree's
    pipeline of slices runs at its slowest hop, as NCCL's model has it).
    """
    routes = fabric.routes()
    N = fabric.size
    d = np.zeros(N) if delay is None else np.asarray(delay, dtype=np.float64)
    if d.shape != (N,) or not (d >= 0).all():
        raise ValueError(f"delay must be {N} non-negative seconds (one per rank), got "
                         f"{d.shape[0] if d.ndim == 1 else d.shape} values")
    L = lanes if fabric.pipelined else 1
    clocks = _Clocks(np.repeat(d + base, L), routes.period * L, fabric.overlap, general,
                     fabric.pipelined)
    route_cache: dict = {}          # least recently used first
    held = 0                        # messages of the routes kept
    shapes: dict = {}
    totals = _Totals(routes)
    count = 0

    def retire(route):              # what a route and its shapes carried, into the totals
        for key in route.shapes:
            shape = shapes.pop(key)
            if shape.uses:
                route.bytes += shape.uses * shape.b
                route.drain += shape.uses * shape.drain
                totals.rate = min(totals.rate, shape.rate)
        totals.flush(route)

    for w in wave_list:
        if len(w) == 0:
            continue
        count += 1
        rkey = getattr(w, "route", None) or w.key
        route = route_cache.pop(rkey, None) if rkey is not None else None
        if route is None:
            route = _Route(routes, np.asarray(w.src, dtype=np.int64),
                           np.asarray(w.dst, dtype=np.int64), w.lane, L, paced)
            totals.seen(route)
            held += len(route.src) if rkey is not None else 0
        if rkey is not None:
            route_cache[rkey] = route
            while held > ROUTES_HELD and len(route_cache) > 1:    # a tree's rounds: all new
                old = route_cache.pop(next(iter(route_cache)))
                held -= len(old.src)
                retire(old)
        el = w.elements
        shape = shapes.get(w.key) if w.key is not None and not general else None
        if shape is None:
            if np.ndim(el):
                b = np.asarray(el, dtype=np.float64) * itemsize
            else:
                b = np.full(len(route.src), float(el) * itemsize)
            if w.key is not None and not general:
                shape = shapes[w.key] = _Shape(routes, route, b, clocks.mode == "uniform")
                route.shapes.append(w.key)
        else:
            b = shape.b
        if fabric.gamma == 0 or (np.ndim(w.reduce) == 0 and not w.reduce):
            red = 0.0
        else:
            red = fabric.gamma * itemsize * (np.asarray(el, dtype=np.float64)
                                             * np.asarray(w.reduce))
        solved = clocks.advance(routes, shape, route, b, float(red) if np.ndim(red) == 0 else red)
        route.waves += 1
        if solved is None and shape is not None:
            shape.uses += 1
        elif solved is None:              # contention-free: transfer = bytes / the path's rate
            route.bytes += b
            route.fbytes += b
            totals.rate = min(totals.rate, route.minrate)
        else:
            route.bytes += b
            route.drain += solved
            totals.rate = min(totals.rate, _rate(b, solved))
        if rkey is None:
            totals.flush(route)
    for route in route_cache.values():
        retire(route)
    t, comp = clocks.finish()
    last = int(t.argmax()) if N else 0
    t = t.reshape(N, L).max(axis=1)           # a rank ends with its last channel
    top, top_bytes, top_time = totals.top()
    return Timing(fabric.name, N, nbytes, t, float(t.max()) if N else 0.0, totals.path_bytes,
                  totals.path_messages, totals.class_bytes(), top_bytes,
                  routes.name(top) if top_time > 0 else "(none)",
                  len(totals.internode), len(totals.cross), totals.rate,
                  dict(zip(CRITICAL, map(float, comp[last]))) if N else {}, count, collective,
                  top_time)


def simulate(collective: str, algorithm: str, fabric: Fabric, nbytes: int, *, itemsize: int = 4,
             delay=None, direct: bool = True, root: int = 0, channels: int | None = None,
             protocol: str | None = None, general: bool = False, pipeline: int = 1,
             **options) -> Timing:
    """Time one call of ``algorithm`` (a name in ``mpicoll.registry``) on ``fabric``.

    ``options`` are the algorithm's declared ones (``order=``, ``inner=``, ...), checked by the
    registry; node-layout algorithms get the fabric's nodes. ``direct=False`` always builds the
    waves from every rank's ``schedule()`` (slow at scale; the tests compare both).
    ``channels``: split the call over that many rings or trees, each on its own NIC (default:
    the fabric's, ``Fabric.nchannels``). On a fabric with ``protocols`` the call is timed with
    each (``protocol=`` picks one) and the fastest is returned, its name in ``Timing.protocol``.
    ``pipeline``: ``hierarchical`` only, each channel's part cut into that many chunks whose
    node and network phases overlap (``allranks.pipeline_waves``); 1: the phases in series.
    """
    from ..registry import lookup

    if collective == "allreduce" and algorithm in IN_SWITCH:     # in the switches (innetwork)
        return innetwork.ALGORITHMS[algorithm][0](fabric, nbytes, itemsize=itemsize, delay=delay)
    if collective == "allreduce" and (algorithm == "nccl" or algorithm == "auto" and fabric.gpu):
        return nccl_choice(fabric, nbytes, itemsize=itemsize, delay=delay, channels=channels,
                           general=general)
    if algorithm == "auto":
        raise ValueError(f"auto is NCCL's choice, on a fabric that names its GPU (dgx-a100, "
                         f"dgx-h100, ...); {fabric.name} names none: give the algorithms")
    algo = lookup(collective, algorithm)
    if not algo.scheduled:
        raise ValueError(f"{algo.name!r} has no schedule to simulate ({algo.describe()})")
    if fabric.protocols:
        if protocol and protocol != "fastest" and protocol not in fabric.protocols:
            raise ValueError(f"unknown protocol {protocol!r}; {fabric.name} has "
                             f"{list(fabric.protocols)} (or 'fastest')")
        tree = algo.name in TREES
        nccl = nccl_tuning.call_graph(fabric, collective, algo.name, channels)
        if protocol and protocol != "fastest":
            names = [protocol]
        elif protocol is None and nccl is not None:     # NCCL's own pick (its tuning model)
            names = [nccl_tuning.choose(nccl, nbytes, ("tree" if tree else "ring",))[1]]
        else:
            names = list(fabric.protocols)
        best = None
        cache: dict = {}                 # schedule-built waves, shared by the protocols
        for name in names:
            fab, base = nccl_tuning.as_nccl_runs(fabric, nccl, name, tree, nbytes)
            r = simulate(collective, algorithm, fab, nbytes, itemsize=itemsize, delay=delay,
                         direct=direct, root=root, channels=channels or fabric.nchannels,
                         general=general, pipeline=pipeline, _base=base,
                         _cache=cache, **options)
            r.protocol, r.fabric = name, fabric.name
            if best is None or r.time < best.time:
                best = r
        return best
    base = options.pop("_base", 0.0)
    cache = options.pop("_cache", None)
    size = fabric.size
    count = call_count(collective, nbytes, size, itemsize)
    kwargs = {}
    if algo.has("node-layout"):
        kwargs["nodes"] = fabric.node_layout()
    if algo.has("root"):
        kwargs["root"] = root
    kwargs.update(algo.resolve(options, kwargs.get("nodes")))
    nch = channels if channels is not None else fabric.nchannels
    if algo.has("root") or collective != "allreduce":
        nch = 1                     # channels split all-reduces (rooted calls keep their root)
    nch = max(1, min(nch, count))
    if algo.pick is not None and "nodes" in kwargs:      # e.g. a pipeline's chunk count
        link = fabric.nic if fabric.nodes > 1 else fabric.intra
        kwargs.update(algo.pick(size, -(-count // nch), kwargs["nodes"], link.alpha,
                                1 / link.bandwidth, fabric.gamma))
        if fabric.pipelined and "chunks" in kwargs and "chunks" not in options:
            # event-driven, a chunk pays no latency per round, only the pipeline's fill: as
            # many chunks as a wave budget allows (NCCL cuts by size, not by a cost model)
            half = -(-count // nch) // 2
            kwargs["chunks"] = max(1, min(half, max(kwargs["chunks"],
                                                    min(TREE_CHUNKS, (1 << 22) // size))))
    timed_count = count
    ring = (direct and has_direct_form(algo, kwargs) and algo.name == "ring"
            and collective == "allreduce" and size > 1)
    if (ring and count % (size * nch)
            and 2 * size * (size - 1) * nch > EXACT_RING_MESSAGES):
        timed_count = -(-count // (size * nch)) * size * nch      # equal blocks, the larger
    r = None
    if (ring and fabric.pipelined and not general and timed_count % (size * nch) == 0
            and (delay is None or np.ptp(np.asarray(delay, dtype=np.float64)) == 0)):
        start = base + (float(np.asarray(delay).ravel()[0]) if delay is not None else 0.0)
        w0 = next(iter(waves(algo, size, timed_count, channels=nch, per_node=fabric.per_node)))
        r = _ring_pipelined(w0, fabric, itemsize, start, count * itemsize, nch)
    if r is not None:
        r.channels = nch
        return _rounded(r, count, timed_count)
    key = (algo.name, timed_count, nch, pipeline, repr(sorted(kwargs.items())))
    wl = cache.get(key) if cache is not None else None
    if wl is None:
        wl = waves(algo, size, timed_count, direct=direct, channels=nch,
                   per_node=fabric.per_node, pipeline=pipeline, **kwargs)
        if cache is not None and isinstance(wl, list):
            cache[key] = wl
    r = run(wl, fabric, itemsize=itemsize, delay=delay, nbytes=count * itemsize,
            collective=collective, general=general, base=base,
            lanes=nch * lanes_of(algo, kwargs.get("nodes"), direct),
            paced=algo.name in ("ring",) + TREES)
    r.channels = nch
    return _rounded(r, count, timed_count)


def nccl_choice(fabric: Fabric, nbytes: int, *, itemsize: int = 4, delay=None,
                channels: int | None = None, general: bool = False) -> Timing:
    """The all-reduce as NCCL runs it on ``fabric`` (one that names its ``gpu``): the algorithm
    and protocol its tuning model picks among those the fabric has (ring, tree; NVLS, NVLSTree
    with NVLink SHARP; CollNetDirect and NVLS across nodes with IB SHARP: ``nccl_tuning.choose``
    over ``nccl_tuning.algorithms``), simulated; ``Timing.algorithm`` says which."""
    if not fabric.gpu:
        raise ValueError(f"NCCL's choice needs a fabric that names its GPU (dgx-a100, dgx-h100, "
                         f"dgx-h200, ...), got {fabric.name}")
    g = nccl_tuning.graph_of(fabric, channels)
    algo, proto = nccl_tuning.choose(g, nbytes, nccl_tuning.algorithms(g))
    name = _SIMULATED[algo]
    if name in IN_SWITCH:
        r = simulate("allreduce", name, fabric, nbytes, itemsize=itemsize, delay=delay)
    else:
        r = simulate("allreduce", name, fabric, nbytes, itemsize=itemsize, delay=delay,
                     channels=channels, protocol=proto, general=general)
    r.algorithm = name
    return r


def _rounded(r: Timing, count: int, timed_count: int) -> Timing:
    """``r`` timed at ``timed_count`` elements, with the bytes of the call's ``count``."""
    if timed_count != count:
        f = count / timed_count
        r.path_bytes = {k: v * f for k, v in r.path_bytes.items()}
        r.class_bytes = {k: v * f for k, v in r.class_bytes.items()}
        r.max_link_bytes *= f
        r.rounded = timed_count - count
    return r


def _ring_pipelined(w0, fabric: Fabric, itemsize: int, start: float, nbytes: int,
                    lanes: int) -> Timing | None:
    """The ring all-reduce with equal blocks on an event-driven fabric, from its first wave
    ``w0`` alone (every wave has its route and sizes): None when that does not hold exactly.

    Each channel's ring is a cycle of hops h (into ring position h) of cost c_h = alpha +
    transfer (+ reduction when not overlapped). A rank's clock after step S is the longest
    path of S steps into it, each step a hop or a wait (a send link still busy: at most the
    largest transfer d; or a reduction). When every hop costs at least every wait, the longest
    path is the S hops that end at it: with S = 2(P-1), all hops of the ring twice but the
    two just after it, i.e. position i ends at (C_rs - c_rs[i+2]) + (C_ag - c_ag[i+1]). Exact
    (tests/unit/test_sim_sharing.py compares the wave-by-wave replay); O(P) instead of O(P^2).
    """
    routes = fabric.routes()
    N, S = fabric.size, 2 * (fabric.size - 1)
    route = _Route(routes, np.asarray(w0.src, np.int64), np.asarray(w0.dst, np.int64),
                   w0.lane, lanes, True)
    b = np.broadcast_to(np.asarray(w0.elements, np.float64) * itemsize, route.src.shape)
    a, d = route.alpha, b / route.flowcap
    red = fabric.gamma * b
    hop = a + d
    wait = max(float(d.max()), float(red.max()))
    if not route.perm or (fabric.overlap and hop.min() < wait) or hop.min() < float(d.max()):
        return None
    rs = hop if fabric.overlap else hop + red
    nv = N * lanes
    into = np.empty(nv, np.int64)             # the message into each clock
    into[route.cdst] = np.arange(len(route.cdst))
    nxt = np.empty(nv, np.int64)
    nxt[route.csrc] = route.cdst
    lane = np.arange(nv) % lanes
    c_rs = np.bincount(lane[route.cdst], weights=rs, minlength=lanes)
    c_ag = np.bincount(lane[route.cdst], weights=hop, minlength=lanes)
    skip_rs, skip_ag = into[nxt[nxt]], into[nxt]
    finish = start + (c_rs[lane] - rs[skip_rs]) + (c_ag[lane] - hop[skip_ag])
    last = int(finish.argmax())
    ln, m1, m2 = lane[last], skip_rs[last], skip_ag[last]
    total = {k: np.bincount(lane[route.cdst], weights=v, minlength=lanes)[ln]
             for k, v in (("a", a), ("d", d), ("red", red))}
    critical = {"delay": start, "latency": 2 * total["a"] - a[m1] - a[m2],
                "transfer": 2 * total["d"] - d[m1] - d[m2],
                "reduction": 0.0 if fabric.overlap else total["red"] - red[m1],
                "messages": float(S)}
    one = run([w0], fabric, itemsize=itemsize, nbytes=nbytes, lanes=lanes, paced=True)
    scale = lambda x: {k: v * S for k, v in x.items()}     # noqa: E731
    finish = finish.reshape(N, lanes).max(axis=1)
    return Timing(fabric.name, N, nbytes, finish, float(finish.max()), scale(one.path_bytes),
                  scale(one.path_messages), scale(one.class_bytes), one.max_link_bytes * S,
                  one.max_link, one.internode_hops, one.cross_rail_hops, one.bottleneck_bw,
                  {k: float(v) for k, v in critical.items()}, S, one.collective,
                  one.max_link_time * S)
