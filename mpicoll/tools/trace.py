"""``mpicoll trace``: print the schedule of an algorithm for N ranks, as the in-process executor
runs it (no MPI needed).

    mpicoll trace ring -N 4 --count 8                  # all-reduce, 4 ranks, 8 elements
    mpicoll trace binomial --collective bcast -N 5 --root 2
    mpicoll trace hierarchical -N 4 --ranks-per-node 2
    mpicoll trace ring -N 6 --ranks-per-node 3 --order rail
    mpicoll trace --update docs/algorithms.md          # refresh the traces quoted in the docs
    mpicoll trace ring -N 4 --values                   # the ring chunk by chunk, with values

Each line is one step of one rank: ``send [lo:hi) -> peer`` and ``recv [lo:hi) <- peer``
(reduce or copy), in elements of the flat vector. The summary gives the rounds on the critical
path (a step takes one round after its own start and its peers') and the elements each rank
sends. Blocks in docs/algorithms.md between ``<!-- trace: ARGS -->`` and ``<!-- end trace -->``
are this command's output for ARGS; a test checks that they are current.
"""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import numpy as np

from ..executors import inprocess
from ..registry import COLLECTIVES, lookup
from ..schedule import Schedule, Send

__all__ = ["main", "render", "update", "render_values"]

BLOCK = re.compile(r"(<!-- trace: (?P<args>.*?) -->\n)(?P<body>.*?)(<!-- end trace -->)", re.S)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="mpicoll trace", description=__doc__.split("\n\n")[0])
    ap.add_argument("algorithm", nargs="?")
    ap.add_argument("-N", "--nranks", type=int, default=4)
    ap.add_argument("--count", type=int, default=8, help="elements in all (default 8)")
    ap.add_argument("--collective", default="allreduce", choices=list(COLLECTIVES))
    ap.add_argument("--root", type=int, default=0)
    ap.add_argument("--ranks-per-node", type=int,
                    help="virtual nodes of k ranks (default 2 for algorithms with node phases)")
    ap.add_argument("--inner")
    ap.add_argument("--outer")
    ap.add_argument("--order", help="the ring order: rank, node or rail")
    ap.add_argument("--update", metavar="MARKDOWN", help="rewrite the trace blocks of a file")
    ap.add_argument("--values", action="store_true",
                    help="ring all-reduce chunk by chunk with the values sent, rank g "
                         "contributing g+1, one 8-byte element per chunk (the seed's lab 1)")
    return ap


def render(args) -> str:
    """The trace text for parsed arguments."""
    algo = lookup(args.collective, args.algorithm)
    options = {}
    if algo.has("root"):
        options["root"] = args.root
    if algo.has("node-layout") and (args.ranks_per_node or algo.has("node-phases")):
        options["ranks_per_node"] = args.ranks_per_node or 2
    for option in algo.options:
        if getattr(args, option.name, None):
            options[option.name] = getattr(args, option.name)
    scheds = inprocess.schedules(args.collective, args.algorithm, args.nranks, args.count,
                                 **options)
    bufs = [np.zeros(args.count) for _ in scheds]
    result = inprocess.run(scheds, bufs, "sum", trace=True)
    lines = [f"# {args.collective} {args.algorithm}, N={args.nranks}, count={args.count}"
             + "".join(f", {k}={v}" for k, v in options.items())]
    for rank, sched in enumerate(scheds):
        lines.append(f"rank {rank}:")
        lines += [f"  {line}" for line in str(sched).splitlines()]
    lines.append(f"rounds on the critical path: {result.rounds}; elements sent per rank: "
                 f"{result.elements_sent}")
    return "\n".join(lines) + "\n"


def update(path: str) -> int:
    """Rewrite every trace block of a markdown file; returns how many changed."""
    text = Path(path).read_text()
    changed = 0

    def fill(m):
        nonlocal changed
        body = "```\n" + render(parser().parse_args(shlex.split(m["args"]))) + "```\n"
        changed += body != m["body"]
        return m.group(1) + body + m.group(4)

    Path(path).write_text(BLOCK.sub(fill, text))
    return changed


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.update:
        print(f"{update(args.update)} trace block(s) updated in {args.update}")
        return 0
    if args.values:
        if args.collective != "allreduce" or args.algorithm != "ring":
            raise SystemExit("mpicoll trace: --values traces the ring all-reduce only "
                             "(mpicoll trace ring -N 4 --values)")
        if args.nranks < 1:
            raise SystemExit(f"mpicoll trace: -N must be at least 1, got {args.nranks}")
        print(render_values(args.nranks), end="")
        return 0
    table = COLLECTIVES[args.collective]
    if not args.algorithm or args.algorithm not in table or table[args.algorithm].library:
        names = [a for a, algo in table.items() if not algo.library]
        raise SystemExit(f"mpicoll trace: name a {args.collective} algorithm: {names}")
    print(render(args), end="")
    return 0


def render_values(nranks: int) -> str:
    """The ring all-reduce traced chunk by chunk, in the format of the seed's ``ring_ar.py demo``.

    Rank g contributes g+1 to each of ``nranks`` chunks of one float64 (8 bytes). The in-process
    executor runs the ring schedules one step at a time (every rank's step s meets its
    neighbours' step s), so the value each message carries is read from the sender's buffer
    before the step, and the bytes per link are counted from the executor's trace.
    """
    n, itemsize = nranks, 8
    scheds = inprocess.schedules("allreduce", "ring", n, n)
    rs_steps = len(COLLECTIVES["reduce_scatter_block"]["ring"].schedule(0, n, n))
    bufs = [np.full(n, g + 1.0) for g in range(n)]
    link = {}                                   # (src, dst) -> bytes
    lines = [f"ring all-reduce, N={n}: data={n * itemsize}B = {n} chunks x {itemsize}B"]
    owners = "  -> GPU i owns the FULL sum of chunk i: [{}]"
    if rs_steps == 0:                           # N = 1: nothing to send, the sum is there
        lines.append(owners.format(", ".join(f"{bufs[i][i]:g}" for i in range(n))))
    for s in range(len(scheds[0])):
        before = [b.copy() for b in bufs]
        step = inprocess.run([Schedule((sched.steps[s],)) for sched in scheds], bufs,
                             "sum", trace=True)
        msgs = sorted((rank, op.peer, op.lo, op.hi) for _, rank, _, ops in step.trace
                      for op in ops if isinstance(op, Send))
        for src, dst, lo, hi in msgs:
            link[(src, dst)] = link.get((src, dst), 0) + (hi - lo) * itemsize
        # count = n: chunk c is the one element at offset c
        phase, t = ("RS", s) if s < rs_steps else ("AG", s - rs_steps)
        lines.append(f"  {phase}{t}: " + "  ".join(
            f"G{src}->G{dst} c{lo}={before[src][lo]:g}" for src, dst, lo, hi in msgs))
        if s == rs_steps - 1:
            lines.append(owners.format(", ".join(f"{bufs[i][i]:g}" for i in range(n))))
    total = n * (n + 1) // 2
    everywhere = all((b == total).all() for b in bufs)
    data = n * itemsize
    lines.append(f"  -> the total everywhere: {everywhere}; steps = {len(scheds[0])}; "
                 f"bytes/link = {link.get((0, 1 % n), 0)} "
                 f"(theory 2(N-1)/N*D = {2 * (n - 1) * data // n})")
    return "\n".join(lines) + "\n"
