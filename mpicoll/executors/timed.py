"""The timed executor: the project's own schedules replayed, with no data, over a fabric model.

It runs what the MPI executor runs -- the schedules of ``mpicoll.registry``'s algorithms -- as
waves (``allranks``: one step of every rank taking part, both ends of each message in the same
wave) over a ``fabric.Fabric``, and keeps one clock per rank:

* a message starts when both ends have entered the step that holds it;
* it takes the alpha of its path, plus its bytes over its share of the most loaded link on its
  path. The messages of one wave are the ones in flight together; a link's capacity is shared in
  proportion to bytes, so every message on a link finishes when the link has carried them all
  (``load / capacity``; with equal messages this is max-min fairness). A path through the spine
  also never goes faster than one spine link (``fabric.spine.bandwidth``);
* a rank's step ends when its messages have ended, plus gamma x the bytes it reduces.

So on a contention-free flat fabric a step takes alpha + beta.max(sent, received) + gamma.reduced,
the in-process executor's clock and the model of every ``cost()`` formula.

``simulate(...)`` returns a ``Result``: each rank's finish, the time (the last finish), algbw and
busbw, bytes per path and per link class, the most loaded link, inter-node and cross-rail hops
(distinct rank pairs) and messages, the slowest message rate, and the critical path of the last
rank to finish split into straggler delay, latency, transfer and reduction. ``delay=`` (seconds per
rank, added before the call) is the straggler hook.

Speed: a wave shape that repeats (``Wave.key``) is routed once; while every rank's clock is the
same and a wave moves every rank alike (a ring step on a flat fabric), one number stands for all
ranks; otherwise one compiled pass over the wave's messages updates the per-rank clocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numba import njit

from ..registry import bus_factor, lookup
from .allranks import waves
from .fabric import INTRA, PATH_NAMES, Fabric, Routes

__all__ = ["Result", "run", "simulate", "call_count"]

CRITICAL = ("delay", "latency", "transfer", "reduction", "messages")


def call_count(collective: str, nbytes: int, size: int, itemsize: int) -> int:
    """Elements of one call of ``nbytes`` bytes, as ``mpicoll bench`` sizes it."""
    count = max(1, nbytes // itemsize)
    if collective in ("reduce_scatter_block", "allgather"):
        count = max(size, count // size * size)
    return count


@dataclass
class Result:
    fabric: str
    size: int
    nbytes: int
    finish: np.ndarray                      # seconds, per rank
    time: float                             # the last finish
    path_bytes: dict                        # bytes sent on each path (intra-node, ...)
    path_messages: dict
    class_bytes: dict                       # bytes carried by each link class (every hop)
    max_link_bytes: float
    max_link: str
    internode_hops: int                     # distinct (src, dst) pairs that cross nodes
    cross_rail_hops: int                    # ... that cross rails
    bottleneck_bw: float                    # slowest message rate (bytes / transfer time)
    critical: dict = field(default_factory=dict)   # of the last rank to finish
    waves: int = 0
    collective: str = "allreduce"

    @property
    def algbw(self) -> float:
        return self.nbytes / self.time if self.time > 0 else 0.0

    @property
    def busbw(self) -> float:
        return self.algbw * bus_factor(self.collective, self.size)

    @property
    def internode_bytes(self) -> float:
        return self.path_bytes[PATH_NAMES[1]] + self.path_bytes[PATH_NAMES[2]]

    @property
    def internode_messages(self) -> int:
        return self.path_messages[PATH_NAMES[1]] + self.path_messages[PATH_NAMES[2]]

    def critical_path(self) -> str:
        c = self.critical
        parts = ", ".join(f"{k} {c[k] * 1e6:.1f} us" for k in CRITICAL[:4] if c[k] > 0)
        return f"{int(c['messages'])} messages: {parts or '0'}"


class _Shape:
    """A wave's routing: per message alpha and transfer time, link loads, hop statistics."""

    def __init__(self, routes: Routes, src, dst, nbytes):
        n = len(src)
        b = np.broadcast_to(np.asarray(nbytes, dtype=np.float64), (n,))
        kind = routes.kind(src, dst)
        links = routes.links(src, dst, kind)
        self.load = np.bincount(links.ravel(), weights=np.repeat(b, 4), minlength=routes.nlinks)
        share = (self.load / routes.capacity)[links].max(axis=1)
        self.drain = np.maximum(share, b / routes.cap[kind])
        self.alpha = routes.alpha[kind]
        self.path_bytes = np.bincount(kind, weights=b, minlength=3)
        self.path_messages = np.bincount(kind, minlength=3)
        g = routes.fabric.per_node
        net = kind != INTRA
        cross = net & (src % g != dst % g)                  # one rail when g == 1
        N = routes.size
        self.internode = np.unique(src[net] * N + dst[net])
        self.cross = np.unique(src[cross] * N + dst[cross])
        self.rate = float((b / self.drain).min()) if n else np.inf
        dur = self.alpha + self.drain
        self.uniform = None       # (alpha, transfer) when the wave moves every rank alike
        self.periodic = None      # the wave on ranks 0..P-1 when it repeats every P ranks
        if not (n == N and n and _is_perm(src, N) and _is_perm(dst, N)):
            return
        if np.ptp(dur) == 0:
            self.uniform = (float(self.alpha[0]), float(self.drain[0]))
        P = routes.period
        if P < N:
            rows = N // P
            order = np.argsort(src)
            d = dst[order].reshape(rows, P)
            a, dr = self.alpha[order].reshape(rows, P), self.drain[order].reshape(rows, P)
            moved = (d - (np.arange(rows) * P)[:, None]) % N
            if (moved == moved[0]).all() and (a == a[0]).all() and (dr == dr[0]).all():
                self.periodic = (np.arange(P), moved[0] % P, a[0].copy(), dr[0].copy())


def _is_perm(a, n) -> bool:
    return bool((np.bincount(a, minlength=n) == 1).all())


@njit(cache=True)
def _advance(t, comp, src, dst, alpha, drain, red):      # pragma: no cover (compiled)
    """One wave on per-rank clocks ``t``; ``comp`` holds each rank's critical path parts."""
    n = t.shape[0]
    fin = np.full(n, -np.inf)
    win = np.full(n, -1)
    pre = np.zeros(n, np.int64)
    redt = np.zeros(n)
    for f in range(src.shape[0]):
        a, b = src[f], dst[f]
        if t[a] >= t[b]:
            start, p = t[a], a
        else:
            start, p = t[b], b
        end = start + alpha[f] + drain[f]
        if end > fin[a]:
            fin[a], win[a], pre[a] = end, f, p
        if end > fin[b]:
            fin[b], win[b], pre[b] = end, f, p
        redt[b] += red[f]
    t2 = t.copy()
    c2 = comp.copy()
    for r in range(n):
        f = win[r]
        if f >= 0:
            t2[r] = fin[r] + redt[r]
            c2[r, :] = comp[pre[r], :]
            c2[r, 1] += alpha[f]
            c2[r, 2] += drain[f]
            c2[r, 3] += redt[r]
            c2[r, 4] += 1.0
    return t2, c2


class _Clocks:
    """Every rank's clock and critical-path parts, stored as compactly as the symmetry allows:
    one value for all ranks (``uniform``), one per rank of a period of the fabric
    (``periodic``: rank r stands for r, r + P, r + 2P, ...), or one per rank (``full``)."""

    def __init__(self, delay: np.ndarray, period: int):
        self.size, self.period = len(delay), period
        self.t = delay.copy()
        self.comp = np.zeros((len(delay), len(CRITICAL)))
        self.comp[:, 0] = delay
        self.mode = "full"
        if len(delay) and (delay == delay[0]).all():
            self.mode, self.t, self.comp = "uniform", self.t[:1], self.comp[:1]

    def expand(self, mode: str) -> None:
        n = {"periodic": self.period, "full": self.size}[mode]
        reps = n // len(self.t)
        self.t, self.comp = np.tile(self.t, reps), np.tile(self.comp, (reps, 1))
        self.mode = mode

    def advance(self, shape: "_Shape", src, dst, red) -> None:
        """One wave; ``red``: seconds of reduction per message (one value if all alike)."""
        alike = np.ndim(red) == 0
        if self.mode == "uniform" and shape.uniform is not None and alike:
            a, dr = shape.uniform
            self.t = self.t + (a + dr + red)
            self.comp = self.comp + (0.0, a, dr, red, 1.0)
            return
        if self.mode != "full" and shape.periodic is not None and alike:
            if self.mode == "uniform":
                self.expand("periodic")
            s, d, a, dr = shape.periodic
            self.t, self.comp = _advance(self.t, self.comp, s, d, a, dr, np.full(len(s), red))
            return
        if self.mode != "full":
            self.expand("full")
        red = np.ascontiguousarray(np.broadcast_to(red, (len(src),)), dtype=np.float64)
        self.t, self.comp = _advance(self.t, self.comp, src, dst, shape.alpha, shape.drain, red)

    def finish(self) -> tuple[np.ndarray, np.ndarray]:
        reps = self.size // len(self.t) if len(self.t) else 0
        return np.tile(self.t, reps), np.tile(self.comp, (reps, 1))


def run(wave_list, fabric: Fabric, *, itemsize: int = 4, delay=None, nbytes: int = 0,
        collective: str = "allreduce") -> Result:
    """Time ``wave_list`` (``allranks.Wave``s) on ``fabric``; ``delay``: seconds per rank."""
    routes = fabric.routes()
    N = fabric.size
    d = np.zeros(N) if delay is None else np.asarray(delay, dtype=np.float64)
    if d.shape != (N,) or not (d >= 0).all():
        raise ValueError(f"delay must be {N} non-negative seconds (one per rank), got "
                         f"{d.shape[0] if d.ndim == 1 else d.shape} values")
    clocks = _Clocks(d, routes.period)
    shapes: dict = {}
    repeats: dict = {}
    totals = _Totals(routes)
    count = 0
    for w in wave_list:
        if len(w) == 0:
            continue
        count += 1
        src, dst = np.asarray(w.src, dtype=np.int64), np.asarray(w.dst, dtype=np.int64)
        el = w.elements
        shape = shapes.get(w.key) if w.key is not None else None
        if shape is None:
            shape = _Shape(routes, src, dst, np.asarray(el) * itemsize)
            totals.first(shape)
            if w.key is not None:
                shapes[w.key] = shape
        if w.key is None:
            totals.add(shape, 1)
        else:
            repeats[w.key] = repeats.get(w.key, 0) + 1
        red = fabric.gamma * itemsize * (np.asarray(el, dtype=np.float64) * np.asarray(w.reduce))
        clocks.advance(shape, src, dst, float(red) if np.ndim(red) == 0 else red)
    for key, k in repeats.items():
        totals.add(shapes[key], k)
    t, comp = clocks.finish()
    last = int(t.argmax()) if N else 0
    top, top_bytes = totals.top()
    return Result(fabric.name, N, nbytes, t, float(t.max()) if N else 0.0, totals.path_bytes,
                  totals.path_messages, totals.class_bytes(), top_bytes, routes.name(top),
                  totals.hops(totals.internode), totals.hops(totals.cross), totals.rate,
                  dict(zip(CRITICAL, map(float, comp[last]))) if N else {}, count, collective)


class _Totals:
    """What a run moved: bytes per link, per path, hop pairs, the slowest message rate."""

    def __init__(self, routes: Routes):
        self.routes = routes
        self.loads = np.zeros(routes.nlinks)
        self.path_bytes = {name: 0.0 for name in PATH_NAMES}
        self.path_messages = {name: 0 for name in PATH_NAMES}
        self.internode, self.cross = [], []
        self.rate = np.inf

    def first(self, shape: "_Shape") -> None:
        self.internode.append(shape.internode)
        self.cross.append(shape.cross)
        self.rate = min(self.rate, shape.rate)

    def add(self, shape: "_Shape", k: int) -> None:
        self.loads += k * shape.load
        for i, name in enumerate(PATH_NAMES):
            self.path_bytes[name] += k * float(shape.path_bytes[i])
            self.path_messages[name] += k * int(shape.path_messages[i])

    def class_bytes(self) -> dict:
        n2 = 2 * self.routes.size
        return {"intra": float(self.loads[:n2].sum()),
                "nic": float(self.loads[n2:2 * n2].sum()),
                "spine": float(self.loads[2 * n2:-1].sum())}

    def top(self) -> tuple[int, float]:
        loads = self.loads[:-1]                 # not the padding link
        i = int(loads.argmax()) if len(loads) else 0
        return i, float(loads[i]) if len(loads) else 0.0

    @staticmethod
    def hops(parts) -> int:
        return len(np.unique(np.concatenate(parts))) if parts else 0


def simulate(collective: str, algorithm: str, fabric: Fabric, nbytes: int, *, itemsize: int = 4,
             delay=None, direct: bool = True, root: int = 0, **options) -> Result:
    """Time one call of ``algorithm`` (a name in ``mpicoll.registry``) on ``fabric``.

    ``options`` are the algorithm's declared ones (``order=``, ``inner=``, ...), checked by the
    registry; node-layout algorithms get the fabric's nodes. ``direct=False`` always builds the
    waves from every rank's ``schedule()`` (slow at scale; the tests compare both).
    """
    algo = lookup(collective, algorithm)
    if not algo.scheduled:
        raise ValueError(f"{algo.name!r} has no schedule to simulate ({algo.describe()})")
    size = fabric.size
    count = call_count(collective, nbytes, size, itemsize)
    kwargs = {}
    if algo.has("node-layout"):
        kwargs["nodes"] = fabric.node_layout()
    if algo.has("root"):
        kwargs["root"] = root
    kwargs.update(algo.resolve(options, kwargs.get("nodes")))
    if algo.pick is not None and "nodes" in kwargs:      # e.g. a pipeline's chunk count
        link = fabric.nic if fabric.nodes > 1 else fabric.intra
        kwargs.update(algo.pick(size, count, kwargs["nodes"], link.alpha, 1 / link.bandwidth,
                                fabric.gamma))
    return run(waves(algo, size, count, direct=direct, **kwargs), fabric, itemsize=itemsize,
               delay=delay, nbytes=count * itemsize, collective=collective)

