"""``mpicoll trace``: print the schedule of an algorithm for N ranks, as the in-process executor
runs it (no MPI needed).

    mpicoll trace ring -N 4 --count 8                  # all-reduce, 4 ranks, 8 elements
    mpicoll trace binomial --collective bcast -N 5 --root 2
    mpicoll trace hierarchical -N 4 --ranks-per-node 2
    mpicoll trace ring -N 6 --ranks-per-node 3 --order rail
    mpicoll trace --update docs/algorithms.md          # refresh the traces quoted in the docs

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

__all__ = ["main", "render", "update"]

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
    table = COLLECTIVES[args.collective]
    if not args.algorithm or args.algorithm not in table or table[args.algorithm].library:
        names = [a for a, algo in table.items() if not algo.library]
        raise SystemExit(f"mpicoll trace: name a {args.collective} algorithm: {names}")
    print(render(args), end="")
    return 0
