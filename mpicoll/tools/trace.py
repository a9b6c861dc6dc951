"""``mpicoll trace``: print the schedule of an algorithm for N ranks, as the in-process executor
runs it (no MPI needed).

    mpicoll trace ring -N 4 --count 8                  # all-reduce, 4 ranks, 8 elements
    mpicoll trace binomial --collective bcast -N 5 --root 2
    mpicoll trace hierarchical -N 4 --ranks-per-node 2   # two nodes (default: all on one)
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

import re
import shlex
from pathlib import Path

import numpy as np

from ..simulators import inprocess
from ..registry import COLLECTIVES, lookup
from .cli import Parser, nonnegative_int, positive_int
from ..schedule import Schedule, Send

__all__ = ["main", "render", "update", "render_values", "MAX_RANKS"]

MAX_RANKS = 1024            # trace prints every step of every rank: ring at N=1024 is 19,000 lines

BLOCK = re.compile(r"(<!-- trace: (?P<args>.*?) -->\n)(?P<body>.*?)(<!-- end trace -->)", re.S)


def _algorithm_names() -> str:
    return "; ".join(f"{c}: " + ", ".join(a for a, algo in table.items() if algo.scheduled)
                     for c, table in COLLECTIVES.items())


def _option_help(name: str) -> str:
    option = next(o for table in COLLECTIVES.values() for algo in table.values()
                  for o in algo.options if o.name == name)
    default = "set by the node layout" if callable(option.default) else option.default
    return (f"{option.doc}; one of {', '.join(option.scheduled_choices)} (default: ${option.env} if set, "
            f"else {default})")


def parser() -> Parser:
    ap = Parser("mpicoll trace", __doc__)
    ap.add_argument("algorithm", nargs="?", help=f"the algorithm ({_algorithm_names()})")
    ap.add_argument("-N", "--nranks", type=positive_int, default=4, help="number of ranks")
    ap.add_argument("--count", type=nonnegative_int, default=8, help="elements in all")
    ap.add_argument("--collective", default="allreduce", choices=list(COLLECTIVES),
                    help="which collective")
    ap.add_argument("--root", type=int, default=0, help="the root rank (bcast)")
    ap.add_argument("--ranks-per-node", type=positive_int,
                    help="nodes of this many consecutive ranks, for node-aware algorithms "
                         "(default: all ranks on one node, as mpicoll model assumes)")
    ap.add_argument("--inner", help=_option_help("inner"))
    ap.add_argument("--outer", help=_option_help("outer"))
    ap.add_argument("--order", help=_option_help("order"))
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
    if algo.has("node-layout"):              # the default: all ranks on one node
        options["ranks_per_node"] = args.ranks_per_node or args.nranks
    for option in algo.options:
        if getattr(args, option.name, None):
            options[option.name] = getattr(args, option.name)
    scheds = inprocess.schedules(args.collective, args.algorithm, args.nranks, args.count,
                                 **options)
    if not (args.ranks_per_node or algo.has("node-phases")):
        options.pop("ranks_per_node", None)   # a ring on one node: nothing to say
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
    ap = parser()
    args = ap.parse_args(argv)
    if args.update:
        try:
            print(f"{update(args.update)} trace block(s) updated in {args.update}")
        except OSError as e:
            ap.error(f"--update {args.update}: {e.strerror or e}")
        return 0
    if args.nranks > MAX_RANKS:
        ap.error(f"-N {args.nranks}: trace prints every step of every rank (ring: about 2N "
                 f"lines per rank), at most -N {MAX_RANKS}; for times at scale, mpicoll "
                 f"simulate -N {args.nranks}")
    if args.values:
        if args.collective != "allreduce" or args.algorithm != "ring":
            ap.error("--values traces the ring all-reduce only (mpicoll trace ring -N 4 --values)")
        print(render_values(args.nranks), end="")
        return 0
    table = COLLECTIVES[args.collective]
    if not args.algorithm or args.algorithm not in table or not table[args.algorithm].scheduled:
        names = [a for a, algo in table.items() if algo.scheduled]
        ap.error(f"name an algorithm of {args.collective}: {', '.join(names)}"
                 + (f" (not {args.algorithm!r})" if args.algorithm else ""))
    algo = table[args.algorithm]
    for name in ("inner", "outer"):
        if getattr(args, name) and name not in {o.name for o in algo.options}:
            ap.error(f"--{name} applies to node-aware algorithms, not {args.algorithm!r}")
    if algo.has("root") and not 0 <= args.root < args.nranks:
        ap.error(f"--root {args.root} is out of range for N={args.nranks} "
                 f"(expected 0..{args.nranks - 1})")
    try:
        text = render(args)
    except ValueError as e:             # an option the algorithm rejects (--inner foo ...)
        ap.error(str(e))
    print(text, end="")
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
