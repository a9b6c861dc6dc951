"""The timed executor's compiled kernels: a wave's clocks, and max-min sharing of links.

* ``advance`` -- one wave on per-rank clocks, lockstep: a message starts when both ends have
  entered the step; a rank's step ends when all its messages have ended (plus its reduction);
* ``advance_pipelined`` -- one wave, event-driven (NCCL-like): a message leaves when its sender
  has the data (its clock) and its send link is free; a rank's clock moves when its own inputs
  have arrived, so latency is paid along each data dependency, not at a barrier;
* ``maxmin`` -- fluid max-min sharing (progressive filling), re-solved whenever a flow starts or
  ends (SimGrid's flow model), each connected group of flows on its own;
* ``rates`` -- the max-min rates of flows that all move at once (no events): the static share
  each flow of a pipelined fabric gets, as NCCL's bandwidth model gives each channel its share.

numba is imported on the first call (``kernel(name)``), not at import.
"""

from __future__ import annotations

import numpy as np

__all__ = ["kernel", "maxmin", "rates"]

def _advance_py(t, comp, src, dst, alpha, drain, red, overlap, t2, c2, fin, win, pre,
                redt):  # pragma: no cover (compiled)
    """One wave on per-rank clocks ``t``; ``comp`` holds each rank's critical path parts.
    Writes the new clocks into ``t2``, ``c2`` (``fin`` .. ``redt``: work space, one per rank)."""
    n = t.shape[0]
    for r in range(n):
        fin[r] = -np.inf
        win[r] = -1
        redt[r] = 0.0
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
    m = comp.shape[1]
    for r in range(n):
        f = win[r]
        if f < 0:
            t2[r] = t[r]
            for j in range(m):
                c2[r, j] = comp[r, j]
            continue
        if overlap:
            end = max(fin[r], t[r] + redt[r])
        else:
            end = fin[r] + redt[r]
        t2[r] = end
        q = pre[r]
        for j in range(m):
            c2[r, j] = comp[q, j]
        c2[r, 1] += alpha[f]
        c2[r, 2] += drain[f]
        c2[r, 3] += end - fin[r]
        c2[r, 4] += 1.0


def _maxmin_py(release, size, links, capacity, flowcap, pad):  # pragma: no cover (compiled)
    """Fluid max-min sharing (progressive filling), re-solved whenever a flow starts or ends.

    Flow f starts moving at ``release[f]`` with ``size[f]`` bytes on the links ``links[f]``
    (``pad``: none), never faster than ``flowcap[f]``; returns each flow's end time.
    Flows that share no finite link (directly or through others) do not affect each other, so
    each connected group is solved on its own, with its own events: a wave of many small groups
    (the ports of one node, say) costs its flows, not its flows squared.
    """
    n = release.shape[0]
    width = links.shape[1]
    # union-find over flows: two flows that use one finite link are in one group
    parent = np.arange(n)
    owner = np.full(capacity.shape[0], -1, np.int64)
    for f in range(n):
        for j in range(width):
            lk = links[f, j]
            if lk == pad or capacity[lk] == np.inf:
                continue
            g = owner[lk]
            if g < 0:
                owner[lk] = f
                continue
            a = f
            while parent[a] != a:
                a = parent[a]
            while parent[g] != g:
                g = parent[g]
            if a != g:
                parent[max(a, g)] = min(a, g)
    group = np.empty(n, np.int64)
    for f in range(n):
        a = f
        while parent[a] != a:
            a = parent[a]
        group[f] = a
        parent[f] = a
    # flows by group, then by release: each group's flows are one run of ``order``
    order = np.argsort(release, kind="mergesort")
    order = order[np.argsort(group[order], kind="mergesort")]
    # the flows of each finite link (CSR): an event re-solves only the moving flows it reaches
    lptr = np.zeros(capacity.shape[0] + 1, np.int64)
    for f in range(n):
        for j in range(width):
            lk = links[f, j]
            if lk != pad and capacity[lk] != np.inf:
                lptr[lk + 1] += 1
    for lk in range(capacity.shape[0]):
        lptr[lk + 1] += lptr[lk]
    lflows = np.empty(lptr[-1], np.int64)
    fill = lptr[:-1].copy()
    for f in range(n):
        for j in range(width):
            lk = links[f, j]
            if lk != pad and capacity[lk] != np.inf:
                lflows[fill[lk]] = f
                fill[lk] += 1
    end = np.empty(n)
    work = (size.copy(), np.zeros(n), np.empty(n, np.int64), np.empty(n, np.int64),
            np.zeros(n, np.bool_), capacity.copy(), np.zeros(capacity.shape[0], np.int64),
            np.zeros(n, np.bool_), np.zeros(n, np.int64), np.empty(n, np.int64),
            np.empty(n, np.int64))
    lo = 0
    while lo < n:
        hi = lo + 1
        while hi < n and group[order[hi]] == group[order[lo]]:
            hi += 1
        _fill_one(order, lo, hi, release, size, links, capacity, flowcap, pad, lptr, lflows,
                  end, work)
        lo = hi
    return end


def _fill(order, lo, hi, release, size, links, capacity, flowcap, pad, lptr, lflows, end,
          work):  # pragma: no cover (compiled)
    """``_maxmin_py`` on the flows ``order[lo:hi]`` (sorted by release): writes their ``end``.

    At each event (flows start, flows end) progressive filling runs again only on the moving
    flows connected, through links, to the ones that started or ended: the others' rates stay
    max-min fair (a max-min allocation is one per connected set of flows), as SimGrid's
    selective update does."""
    rem, rate, act, mark, frozen, remcap, cnt, moving, stamp, queue, gone = work
    n = hi - lo
    nact = 0
    ngone = 0
    nxt = lo
    done = 0
    event = 0
    t = release[order[lo]]
    while done < n:
        event += 1
        nq = 0
        while nxt < hi and release[order[nxt]] <= t:
            f = order[nxt]
            nxt += 1
            if rem[f] <= 0.0:
                end[f] = t
                done += 1
            else:
                act[nact] = f
                nact += 1
                moving[f] = True
                stamp[f] = event
                queue[nq] = f
                nq += 1
        for i in range(ngone):          # the moving neighbours of the flows that ended
            f = gone[i]
            for j in range(links.shape[1]):
                lk = links[f, j]
                if lk == pad or capacity[lk] == np.inf:
                    continue
                for k in range(lptr[lk], lptr[lk + 1]):
                    g = lflows[k]
                    if moving[g] and stamp[g] != event:
                        stamp[g] = event
                        queue[nq] = g
                        nq += 1
        ngone = 0
        if nact == 0:
            t = release[order[nxt]]
            continue
        head = 0                        # every moving flow connected to those
        while head < nq:
            f = queue[head]
            head += 1
            for j in range(links.shape[1]):
                lk = links[f, j]
                if lk == pad or capacity[lk] == np.inf:
                    continue
                for k in range(lptr[lk], lptr[lk + 1]):
                    g = lflows[k]
                    if moving[g] and stamp[g] != event:
                        stamp[g] = event
                        queue[nq] = g
                        nq += 1
        # progressive filling over those flows
        for i in range(nq):
            f = queue[i]
            frozen[f] = False
            for j in range(links.shape[1]):
                lk = links[f, j]
                if lk != pad:
                    remcap[lk] = capacity[lk]
                    cnt[lk] = 0
        for i in range(nq):
            f = queue[i]
            for j in range(links.shape[1]):
                lk = links[f, j]
                if lk != pad:
                    cnt[lk] += 1
        left = nq
        while left > 0:
            level = np.inf
            for i in range(nq):
                f = queue[i]
                if frozen[f]:
                    continue
                if flowcap[f] < level:
                    level = flowcap[f]
                for j in range(links.shape[1]):
                    lk = links[f, j]
                    if lk != pad:
                        s = remcap[lk] / cnt[lk]
                        if s < level:
                            level = s
            tol = level * (1.0 + 1e-12)
            nfz = 0
            for i in range(nq):
                f = queue[i]
                if frozen[f]:
                    continue
                hit = flowcap[f] <= tol
                if not hit:
                    for j in range(links.shape[1]):
                        lk = links[f, j]
                        if lk != pad and remcap[lk] / cnt[lk] <= tol:
                            hit = True
                            break
                if hit:
                    mark[nfz] = f
                    nfz += 1
            for k in range(nfz):
                f = mark[k]
                frozen[f] = True
                rate[f] = level
                left -= 1
                for j in range(links.shape[1]):
                    lk = links[f, j]
                    if lk != pad:
                        remcap[lk] -= level
                        cnt[lk] -= 1
        # the next event: a flow ends or one starts
        dt = np.inf
        for i in range(nact):
            f = act[i]
            d = rem[f] / rate[f]
            if d < dt:
                dt = d
        by_end = True
        tn = t + dt
        if nxt < hi and release[order[nxt]] < tn:
            tn = release[order[nxt]]
            by_end = False
        step = tn - t
        k = 0
        for i in range(nact):
            f = act[i]
            d = rem[f] / rate[f]
            if (by_end and d <= dt * (1.0 + 1e-9)) or d <= step * 1e-12:
                end[f] = tn if not by_end else t + d
                rem[f] = 0.0
                done += 1
            else:
                rem[f] -= rate[f] * step
                if rem[f] <= size[f] * 1e-12:
                    end[f] = tn
                    rem[f] = 0.0
                    done += 1
                else:
                    act[k] = f
                    k += 1
                    continue
            moving[f] = False
            gone[ngone] = f
            ngone += 1
        nact = k
        t = tn


def _advance_pipelined_py(t, lf, comp, src, dst, alpha, drain, red, overlap, fin, win, gap,
                          redt, begin, who, rows):  # pragma: no cover (compiled)
    """One wave, event-driven, in place: ``t`` is when each rank has its inputs, ``lf`` when its
    send link is free. Message a -> b leaves at max(t[a], lf[a]) (the receiver's buffer is
    posted ahead, as NCCL's FIFO slots are), occupies a's link for its transfer and arrives
    alpha later; b's clock becomes the latest of its own and its arrivals, plus its reduction
    (or, with ``overlap``, the reduction runs from b's own clock). ``fin``, ``win``, ``redt``
    (per rank) come in at -inf, -1, 0 and are left so; ``gap``, ``begin``, ``who``, ``rows``:
    work space (per rank, per message, per message, messages x parts)."""
    nr = 0
    for f in range(src.shape[0]):
        a, b = src[f], dst[f]
        start = t[a] if t[a] >= lf[a] else lf[a]
        begin[f] = start
        end = start + alpha[f] + drain[f]
        if win[b] < 0:
            who[nr] = b
            nr += 1
        if end > fin[b]:
            fin[b], win[b], gap[b] = end, f, start - t[a]
        redt[b] += red[f]
    for f in range(src.shape[0]):         # the send links, once every start is known
        a = src[f]
        if begin[f] + drain[f] > lf[a]:
            lf[a] = begin[f] + drain[f]
    m = comp.shape[1]
    for k in range(nr):                   # the critical parts the receivers take, before any
        r = who[k]                        # of them is overwritten
        q = src[win[r]] if fin[r] >= t[r] else r
        for j in range(m):
            rows[k, j] = comp[q, j]
    for k in range(nr):
        r = who[k]
        f = win[r]
        ready = fin[r] if fin[r] >= t[r] else t[r]
        if overlap:
            end = max(ready, t[r] + redt[r])
        else:
            end = ready + redt[r]
        for j in range(m):
            comp[r, j] = rows[k, j]
        if fin[r] >= t[r]:                  # the last arrival is on the critical path
            comp[r, 1] += alpha[f]
            comp[r, 2] += drain[f] + gap[r]
            comp[r, 4] += 1.0
        comp[r, 3] += end - ready
        t[r] = end
        fin[r], win[r], redt[r] = -np.inf, -1, 0.0


def _rates_py(links, capacity, flowcap, pad):  # pragma: no cover (compiled)
    """Max-min fair rates (progressive filling) of flows that all move at once: ``links[f]`` the
    links of flow f (``pad``: none), ``capacity`` per link, ``flowcap[f]`` its own cap."""
    n, width = links.shape
    rate = np.empty(n)
    remcap = capacity.copy()
    cnt = np.zeros(capacity.shape[0], np.int64)
    for f in range(n):
        for j in range(width):
            lk = links[f, j]
            if lk != pad and capacity[lk] != np.inf:
                cnt[lk] += 1
    act = np.arange(n)
    nact = n
    hit = np.zeros(n, np.bool_)
    while nact > 0:
        level = np.inf
        for i in range(nact):
            f = act[i]
            if flowcap[f] < level:
                level = flowcap[f]
            for j in range(width):
                lk = links[f, j]
                if lk != pad and capacity[lk] != np.inf:
                    s = remcap[lk] / cnt[lk]
                    if s < level:
                        level = s
        tol = level * (1.0 + 1e-12)
        for i in range(nact):
            f = act[i]
            h = flowcap[f] <= tol
            if not h:
                for j in range(width):
                    lk = links[f, j]
                    if lk != pad and capacity[lk] != np.inf and remcap[lk] / cnt[lk] <= tol:
                        h = True
                        break
            hit[f] = h
        k = 0
        for i in range(nact):
            f = act[i]
            if hit[f]:
                rate[f] = level
                for j in range(width):
                    lk = links[f, j]
                    if lk != pad and capacity[lk] != np.inf:
                        remcap[lk] -= level
                        cnt[lk] -= 1
            else:
                act[k] = f
                k += 1
        nact = k
    return rate


_fill_one = _fill
_K: dict = {}


def kernel(name):
    """The compiled kernel ``name`` (numba is imported on the first call, not at import)."""
    if not _K:
        from numba import njit
        global _fill_one
        _fill_one = njit(cache=True)(_fill)           # what the compiled _maxmin_py calls
        _K["advance"] = njit(cache=True)(_advance_py)
        _K["advance_pipelined"] = njit(cache=True)(_advance_pipelined_py)
        _K["maxmin"] = njit(cache=True)(_maxmin_py)
        _K["rates"] = njit(cache=True)(_rates_py)
    return _K[name]


def maxmin(release, size, links, capacity, flowcap=None) -> np.ndarray:
    """End times of flows under max-min sharing, re-solved at every start and end (SimGrid's
    model): ``release`` (s) and ``size`` (bytes) per flow, ``links`` a list of link-id lists,
    ``capacity`` bytes/s per link, ``flowcap`` an optional per-flow rate cap."""
    lk, cap, fc, pad = _arrays(links, capacity, flowcap, len(release))
    return kernel("maxmin")(np.asarray(release, dtype=np.float64),
                            np.asarray(size, dtype=np.float64), lk, cap, fc, pad)


def rates(links, capacity, flowcap=None) -> np.ndarray:
    """Max-min fair rates of flows that all move at once (``links`` as ``maxmin``'s)."""
    lk, cap, fc, pad = _arrays(links, capacity, flowcap, len(links))
    return kernel("rates")(lk, cap, fc, pad)


def _arrays(links, capacity, flowcap, n):
    width = max([len(x) for x in links] + [1])
    pad = len(capacity)
    lk = np.full((n, width), pad, dtype=np.int64)
    for f, path in enumerate(links):
        lk[f, :len(path)] = path
    cap = np.append(np.asarray(capacity, dtype=np.float64), np.inf)
    fc = np.full(n, np.inf) if flowcap is None else np.asarray(flowcap, dtype=np.float64)
    return lk, cap, fc, pad
