"""The in-process executor: P virtual ranks run their schedules in one process, no MPI.

It follows MPI's semantics for a step (all transfers posted together, the step done when every
one of them is matched, reductions applied after) and checks what MPI would leave to chance:
every Send must meet a Recv of the same length at the other end, no copied receive may overlap a
send of its step, and if no rank can make progress while some still have steps left, it raises
``Deadlock`` naming each stuck rank and the peers it waits for -- where the real thing would
hang.

It also keeps two clocks. The logical one: a step finishes one round after the later of its own
start and the start of the matching steps of its peers, so ``Result.rounds`` is the critical
path in message rounds, and ``Result.trace`` lists every step with its round, for traces and
teaching. The alpha-beta-gamma one (``clock=(alpha, beta, gamma)``, seconds per message, per byte
sent, per byte reduced): a step starts at the same point and lasts

    alpha + beta.max(bytes it sends, bytes it receives) + gamma.(bytes it reduces)

-- the model of every ``cost()`` formula: one port each way per rank, the messages of a step
posted together so their latencies overlap, reductions after the transfers. ``Result.time`` is
the last rank's finish; tests check it against ``cost()`` for every algorithm.

Schedules are immutable and pure functions of their arguments, so both the schedules of a call
and the pairing of their messages are built once and kept (a few hundred recent ones): an
exhaustive test that runs the same schedules over several dtypes and ops pays for them once.

    >>> from mpicoll.simulators import inprocess
    >>> out = inprocess.allreduce([np.arange(4.0) * r for r in range(3)], algorithm="ring")
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from .. import kernels
from ..registry import lookup
from ..schedule import Recv, Schedule, Send, check_step
from ..topology import virtual_nodes

__all__ = ["Deadlock", "ScheduleMismatch", "Result", "run", "schedules", "allreduce",
           "reduce_scatter_block", "allgather", "bcast", "virtual_nodes", "step_seconds"]


class Deadlock(RuntimeError):
    """No virtual rank can make progress, but some have steps left."""


class ScheduleMismatch(RuntimeError):
    """A Send has no matching Recv (or the lengths differ)."""


@dataclass
class Result:
    elements_sent: list[int]
    elements_received: list[int]
    messages_sent: list[int]
    rounds: int
    trace: list = field(default_factory=list)   # (round, rank, step index, ops)
    time: float | None = None                   # seconds on the alpha-beta-gamma clock
    finish: list = field(default_factory=list)  # each rank's finish on that clock

    def bytes_sent(self, itemsize: int) -> list[int]:
        return [n * itemsize for n in self.elements_sent]


KEPT = 512                      # schedule sets (and their pairings) kept, most recent first


class _Recent:
    """A small thread-safe LRU table."""

    def __init__(self, size: int):
        self.size, self.table, self.lock = size, OrderedDict(), threading.Lock()

    def get(self, key, make):
        with self.lock:
            if key in self.table:
                self.table.move_to_end(key)
                return self.table[key]
        value = make()
        with self.lock:
            self.table[key] = value
            if len(self.table) > self.size:
                self.table.popitem(last=False)
        return value


_SCHEDULES = _Recent(KEPT)      # (collective, algorithm, size, count, options) -> schedules
_LINKS = _Recent(KEPT)          # the schedules' ids -> (the schedules, their links)


def _linked(scheds) -> dict:
    """``_link(scheds)``, kept for these very Schedule objects: the table holds them, so no
    other object can take their ids while their entry lives, and they are immutable."""
    scheds = tuple(scheds)
    return _LINKS.get(tuple(map(id, scheds)), lambda: (scheds, _link(scheds)))[1]


def _link(scheds: list[Schedule]) -> dict:
    """Pair the k-th Send a->b with the k-th Recv on b from a.

    Returns, for every op as (rank, step, index in step), its message key (a, b, k) and where
    the other end is: (peer, peer's step).
    """
    ends, counter = {}, {}
    for rank, sched in enumerate(scheds):
        for s, step in enumerate(sched.steps):
            check_step(step)
            for i, op in enumerate(step):
                send = isinstance(op, Send)
                pair = (rank, op.peer) if send else (op.peer, rank)
                k = counter.get((send,) + pair, 0)
                counter[(send,) + pair] = k + 1
                ends.setdefault(pair + (k,), {})[send] = (rank, s, i, op)
    links = {}
    for key, sides in ends.items():
        a, b, k = key
        if len(sides) < 2:
            missing = "Recv on rank %d" % b if True in sides else "Send on rank %d" % a
            raise ScheduleMismatch(f"message {k} from rank {a} to rank {b} has no matching {missing}")
        (sr, ss, si, sop), (rr, rs, ri, rop) = sides[True], sides[False]
        if sop.hi - sop.lo != rop.hi - rop.lo:
            raise ScheduleMismatch(f"message {k} from rank {a} to rank {b}: sends "
                                   f"{sop.hi - sop.lo} elements, receives {rop.hi - rop.lo}")
        links[(sr, ss, si)] = (key, rr, rs)
        links[(rr, rs, ri)] = (key, sr, ss)
    return links


def step_seconds(step, itemsize: int, alpha: float, beta: float, gamma: float) -> float:
    """A step's duration on the alpha-beta-gamma clock (see the module's doc)."""
    sent = sum(o.hi - o.lo for o in step if isinstance(o, Send))
    received = sum(o.hi - o.lo for o in step if isinstance(o, Recv))
    reduced = sum(o.hi - o.lo for o in step if isinstance(o, Recv) and o.reduce)
    return alpha + itemsize * (beta * max(sent, received) + gamma * reduced)


def run(scheds: list[Schedule], buffers: list[np.ndarray], op: str | None = "sum",
        *, trace: bool = False, clock: tuple[float, float, float] | None = None,
        inputs: list[np.ndarray] | None = None, kept: list[tuple] | None = None) -> Result:
    """Run one schedule per virtual rank on its buffer (modified in place).

    ``op=None``: the schedules reduce nothing (all-gather, broadcast). ``clock=(alpha, beta,
    gamma)`` also times the run on the alpha-beta-gamma clock. ``inputs``: out of place, each
    rank's input, read as the compiled executor reads it (``Schedule.first_touch``: only the
    pieces it names are copied into the buffer, whose other contents don't matter);
    ``kept[rank]``: the ``(lo, hi)`` of the buffer the call keeps (default: all of it).
    """
    size = len(scheds)
    links = _linked(scheds)
    reduce_into = None if op is None or not buffers else kernels.kernel(op, buffers[0].dtype)
    buffers = [kernels.as_storage(b) for b in buffers]     # the same memory (half types: uint16)
    fresh = None                    # out of place: fresh[rank][step][i], op i reads the input
    if inputs is not None:
        inputs = [kernels.as_storage(x) for x in inputs]
        fresh = [sched.first_touch.fresh for sched in scheds]
        for rank, sched in enumerate(scheds):
            touch = sched.first_touch
            lo, hi = kept[rank] if kept is not None else (0, buffers[rank].size)
            for a, b in touch.copies(lo, hi):
                buffers[rank][a:b] = inputs[rank][a:b]
    pc = [0] * size                 # the step each rank has entered (posted)
    start = [0] * size              # logical round at which that step was entered
    entered_at: dict = {}           # (rank, step) -> round
    now = [0.0] * size              # the same on the alpha-beta-gamma clock
    entered_time: dict = {}
    in_flight: dict = {}            # message key -> data snapshot taken when posted
    log = []

    def enter(rank: int) -> None:
        s = pc[rank]
        if s < len(scheds[rank].steps):
            entered_at[(rank, s)] = start[rank]
            entered_time[(rank, s)] = now[rank]
            for i, o in enumerate(scheds[rank].steps[s]):
                if isinstance(o, Send):
                    source = inputs[rank] if fresh is not None and fresh[rank][s][i] else \
                        buffers[rank]
                    in_flight[links[(rank, s, i)][0]] = source[o.lo:o.hi].copy()

    def waiting_for(rank: int) -> list[int]:
        s = pc[rank]
        return sorted({links[(rank, s, i)][1] for i in range(len(scheds[rank].steps[s]))
                       if pc[links[(rank, s, i)][1]] < links[(rank, s, i)][2]})

    for rank in range(size):
        enter(rank)
    progress = True
    while progress:
        progress = False
        for rank in range(size):
            s = pc[rank]
            if s == len(scheds[rank].steps) or waiting_for(rank):
                continue
            # Every transfer of the step is matched: land copies, then reductions, in order,
            # each into the buffer or (into_next) into the step's next receive
            step = scheds[rank].steps[s]
            recvs = [(o, in_flight.pop(links[(rank, s, i)][0]),
                      fresh is not None and fresh[rank][s][i])
                     for i, o in enumerate(step) if isinstance(o, Recv)]
            for o, data, _ in recvs:
                if not o.reduce:
                    buffers[rank][o.lo:o.hi] = data
            for k, (o, data, from_input) in enumerate(recvs):
                if not o.reduce:
                    continue
                acc = recvs[k + 1][1] if o.into_next else buffers[rank][o.lo:o.hi]
                if from_input:                  # acc = op(input, data), or op(data, input)
                    if o.left:
                        reduce_into(data, inputs[rank][o.lo:o.hi])
                        acc[...] = data
                    else:
                        acc[...] = inputs[rank][o.lo:o.hi]
                        reduce_into(acc, data)
                elif o.left:
                    reduce_into(data, acc)
                    acc[...] = data
                else:
                    reduce_into(acc, data)
            peers = [links[(rank, s, i)][1:] for i in range(len(step))]
            done = 1 + max([start[rank]] + [entered_at[p] for p in peers])
            if clock is not None:
                now[rank] = (max([now[rank]] + [entered_time[p] for p in peers])
                             + step_seconds(step, buffers[rank].itemsize, *clock))
            if trace:
                log.append((done, rank, s, step))
            pc[rank] += 1
            start[rank] = done
            enter(rank)
            progress = True
    stuck = [r for r in range(size) if pc[r] < len(scheds[r].steps)]
    if stuck:
        raise Deadlock("no rank can progress: " + "; ".join(
            f"rank {r} in step {pc[r]} waits for rank(s) {waiting_for(r)}" for r in stuck))
    log.sort(key=lambda e: (e[0], e[1]))
    return Result([s.elements_sent() for s in scheds], [s.elements_received() for s in scheds],
                  [s.messages_sent() for s in scheds], max(start, default=0), log,
                  max(now, default=0.0) if clock is not None else None,
                  now if clock is not None else [])


def schedules(collective: str, algorithm: str, size: int, count: int, *, root: int | None = None,
              nodes=None, ranks_per_node: int = 1, picked: dict | None = None,
              **options) -> list[Schedule]:
    """Every rank's schedule for one collective call.

    ``options`` are the algorithm's declared ones (``mpicoll.registry``), defaults filled in; a
    node-aware algorithm runs on ``nodes``, else on virtual nodes of ``ranks_per_node`` ranks.
    ``picked``: what the cost model would choose (``Algorithm.pick``, e.g. a chunk count);
    without it the schedule's own default.
    """
    key = (collective, algorithm, size, count, root, nodes, ranks_per_node,
           tuple(sorted((picked or {}).items())), tuple(sorted(options.items())))
    try:
        hash(key)
    except TypeError:           # e.g. nodes as lists: build them afresh
        return _schedules(collective, algorithm, size, count, root, nodes, ranks_per_node,
                          picked, options)
    return list(_SCHEDULES.get(key, lambda: tuple(_schedules(
        collective, algorithm, size, count, root, nodes, ranks_per_node, picked, options))))


def _schedules(collective, algorithm, size, count, root, nodes, ranks_per_node, picked,
               options) -> list[Schedule]:
    algo = lookup(collective, algorithm)
    if not algo.scheduled:
        raise ValueError(f"{algo.name!r} has no schedule ({algo.describe()})")
    kwargs = {}
    if algo.has("node-layout"):
        kwargs["nodes"] = nodes if nodes is not None else virtual_nodes(size, ranks_per_node)
    if algo.has("root"):
        kwargs["root"] = 0 if root is None else root
    kwargs.update(algo.resolve(options, kwargs.get("nodes")), **(picked or {}))
    return [algo.schedule(rank, size, count, **kwargs) for rank in range(size)]


def allreduce(inputs, op="sum", algorithm="ring", **options) -> list[np.ndarray]:
    """All-reduce of one flat array per virtual rank; returns each rank's result."""
    bufs = [np.array(x).reshape(-1).copy() for x in inputs]
    run(schedules("allreduce", algorithm, len(bufs), bufs[0].size, **options), bufs, op)
    return bufs


def reduce_scatter_block(inputs, op="sum", algorithm="ring") -> list[np.ndarray]:
    """Rank r gets block r (of count/size elements) of the reduction."""
    bufs = [np.array(x).reshape(-1).copy() for x in inputs]
    size, count = len(bufs), bufs[0].size
    run(schedules("reduce_scatter_block", algorithm, size, count), bufs, op)
    n = count // size
    return [bufs[r][r * n:(r + 1) * n].copy() for r in range(size)]


def allgather(inputs, algorithm="ring") -> list[np.ndarray]:
    """Every rank gets the concatenation of all ranks' arrays."""
    size, n = len(inputs), np.asarray(inputs[0]).size
    bufs = [np.zeros(size * n, np.asarray(inputs[0]).dtype) for _ in range(size)]
    for r, x in enumerate(inputs):
        bufs[r][r * n:(r + 1) * n] = np.asarray(x).reshape(-1)
    run(schedules("allgather", algorithm, size, size * n), bufs, None)
    return bufs


def bcast(inputs, root=0, algorithm="binomial") -> list[np.ndarray]:
    """Every rank gets the root's array."""
    bufs = [np.array(x).reshape(-1).copy() for x in inputs]
    run(schedules("bcast", algorithm, len(bufs), bufs[0].size, root=root), bufs, None)
    return bufs
