"""Every algorithm's docstring formulas, checked against what its schedule does.

For every algorithm at p = 2..17 (and counts that divide evenly, where the formulas are exact):
* ``cost(p, n, alpha=1, beta=0, gamma=0)`` is the critical path in message rounds that the
  in-process executor measures;
* ``cost(p, n, alpha, beta, gamma)`` is the time on the executor's alpha-beta-gamma clock (for
  an algorithm declared ``cost-approximate``, a pipeline, between 0.99 and 2 times it);
* for a ``baseline`` (naive: one step of p-1 messages each way), whose formula charges every
  message its latency where the clock overlaps a step's messages: ``cost(alpha=1)`` is the
  messages a rank sends, and the time the clock's plus alpha for each message beyond the first;
* ``bytes_sent(rank, p, n)`` -- the docstring's "Bytes each rank sends" -- is what each rank's
  schedule sends.
"""

import itertools
import math
import re

import numpy as np
import pytest

from mpicoll.simulators import inprocess
from mpicoll.registry import COLLECTIVES
from mpicoll.topology import virtual_nodes

CLOCK = (2e-6, 1e-9, 3e-10)          # alpha, beta, gamma
LOW, HIGH = 0.99, 2.0                # where a "cost-approximate" formula lies, times the clock
ITEMSIZE = 8
SCHEDULED = [(c, name) for c, table in COLLECTIVES.items() for name, a in table.items()
             if a.scheduled]
# and those without a schedule but with a cost formula: "shared-memory" (allreduce_shm), whose
# formula the in-process executor cannot check (it runs schedules); bench measures it
MODELLED = [(c, name) for c, table in COLLECTIVES.items() for name, a in table.items()
            if not a.library]


def cases(collective, name):
    """(p, count, schedule keywords, cost keywords, bytes_sent keywords) to check: every
    combination of the algorithm's declared options that can run, on nodes of 1, 2, 3 and p
    ranks where it takes a node layout, every root where it has one."""
    algo = COLLECTIVES[collective][name]
    for p in range(2, 18):
        pof2 = 1 << (p.bit_length() - 1)
        layouts = [virtual_nodes(p, L) for L in (1, 2, 3, p)] if algo.has("node-layout") \
            else [None]
        for nodes in layouts:
            L, M = (max(map(len, nodes)), len(nodes)) if nodes else (p, 1)
            unit = math.lcm(p * pof2, L * M * (1 << (M.bit_length() - 1)))
            for values in itertools.product(*(o.scheduled_choices for o in algo.options)):
                options = dict(zip((o.name for o in algo.options), values))
                try:
                    algo.resolve(options, nodes)
                except ValueError:
                    continue                          # e.g. a shard inner on uneven nodes
                two_level = algo.has("node-phases")
                for root in (sorted({0, p - 1, p // 2}) if algo.has("root") else [None]):
                    sched_kw = dict(options, **({"nodes": nodes} if nodes else {}))
                    if root is not None:
                        sched_kw["root"] = root
                    picked = algo.pick(p, unit, nodes, *CLOCK) if algo.pick else {}
                    cost_kw = dict(options, ranks_per_node=L, **picked) if two_level else {}
                    bytes_kw = dict(sched_kw) if two_level or root is not None else {}
                    yield p, unit, dict(sched_kw, **picked), cost_kw, bytes_kw


@pytest.mark.parametrize("collective, name", SCHEDULED)
def test_cost_is_the_schedule(collective, name):
    algo = COLLECTIVES[collective][name]
    problems = []
    for p, count, options, cost_kw, bytes_kw in cases(collective, name):
        scheds = [algo.schedule(r, p, count, **options) for r in range(p)]
        result = inprocess.run(scheds, [np.zeros(count) for _ in range(p)], clock=CLOCK)
        n = count * ITEMSIZE
        label = f"p={p} count={count} {cost_kw or options}"
        rounds = algo.cost(p, n, 1.0, 0.0, 0.0, **cost_kw)
        latencies, clock = result.rounds, result.time
        if algo.has("baseline"):                      # a latency per message, one step
            latencies = max(result.messages_sent)
            clock += (latencies - result.rounds) * CLOCK[0]
        if not math.isclose(rounds, latencies):
            problems.append(f"{label}: cost(alpha=1) = {rounds}, latencies = {latencies}")
        predicted = algo.cost(p, n, *CLOCK, **cost_kw)
        if algo.has("cost-approximate"):              # a pipeline: the range its doc states
            ok = LOW * clock <= predicted <= HIGH * clock
        else:
            ok = math.isclose(predicted, clock, rel_tol=1e-9)
        if not ok:
            problems.append(f"{label}: cost = {predicted:.6e} s, clock = {clock:.6e} s")
        for rank, sched in enumerate(scheds):
            claimed = algo.module.bytes_sent(rank, p, n, **bytes_kw)
            if not math.isclose(claimed, sched.elements_sent() * ITEMSIZE, abs_tol=1e-9):
                problems.append(f"{label} rank {rank}: bytes_sent = {claimed}, schedule sends "
                                f"{sched.elements_sent() * ITEMSIZE}")
    assert not problems, f"{len(problems)} mismatches: " + "; ".join(problems[:6])


@pytest.mark.parametrize("collective, name", MODELLED)
def test_docstring_states_cost_and_bytes(collective, name):
    doc = COLLECTIVES[collective][name].module.__doc__
    assert re.search(r"^Cost", doc, re.M), "no cost formula in the docstring"
    assert re.search(r"^Bytes each rank sends:", doc, re.M), "no bytes formula in the docstring"
